#include "client_fixture.h"

namespace tokenmeter::testing {

ClientFixture::ClientFixture() : socket_path_(dir_.File("s")) {}

ClientFixture::~ClientFixture() {
  if (client_ != nullptr) tm_client_close(client_, nullptr, 0);
  server_.reset();
}

void ClientFixture::StartServer() {
  ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
  server_ = std::make_unique<TestServer>(socket_path_);
  ASSERT_TRUE(server_->ok()) << server_->error();
}

OptionsPtr ClientFixture::DefaultOptions() const {
  OptionsPtr opts(tm_options_new());
  EXPECT_NE(opts, nullptr);
  if (opts == nullptr) return opts;
  EXPECT_EQ(tm_options_set_socket_path(opts.get(), socket_path_.c_str()),
            TM_OK);
  EXPECT_EQ(tm_options_set_model(opts.get(), "m"), TM_OK);
  return opts;
}

void ClientFixture::NewClient(const tm_options* opts) {
  ASSERT_EQ(client_, nullptr);
  ASSERT_EQ(tm_client_new(opts, &client_), TM_OK);
  ASSERT_NE(client_, nullptr);
}

int ClientFixture::CloseClient(StatsArray* stats) {
  const int rc =
      tm_client_close(client_, stats != nullptr ? stats->data() : nullptr,
                      stats != nullptr ? stats->size() : 0);
  client_ = nullptr;
  return rc;
}

StatsArray ClientFixture::Stats() const {
  StatsArray s{};
  EXPECT_EQ(tm_client_stats(client_, s.data(), s.size()), TM_OK);
  return s;
}

bool ClientFixture::WaitForEvents(size_t n) {
  return server_->WaitUntil(
      [n](const TestServer::Connections& c) { return CountEvents(c) >= n; });
}

bool ClientFixture::WaitForEof(size_t index) {
  return server_->WaitUntil([index](const TestServer::Connections& c) {
    return c.size() > index && c[index].eof;
  });
}

bool ClientFixture::WaitForAllEof() {
  return server_->WaitUntil([](const TestServer::Connections& c) {
    for (const auto& conn : c) {
      if (!conn.eof) return false;
    }
    return !c.empty();
  });
}

}  // namespace tokenmeter::testing
