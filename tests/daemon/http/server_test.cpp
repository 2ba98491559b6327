// The HTTP server over real TCP: the loop runs in a background thread, the
// test thread talks to it with plain blocking sockets.
#include "daemon/http/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>
#include <zlib.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daemon/http/basic_auth.h"
#include "daemon/http/tls.h"
#include "test_certs.h"
#include "testutil/poll.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon::http {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testutil::PollUntil;

constexpr int kReceiveTimeoutMs = 5000;
const std::string kMetricsBody = "tokenmeter_up 1\n";

// A body that compresses well and is well over gzip_min_bytes.
std::string BigBody() {
  std::string body;
  for (int i = 0; i < 2000; ++i) {
    body += "tokenmeter_requests_total{engine=\"e\",model=\"m\"} " +
            std::to_string(i) + "\n";
  }
  return body;
}

// A blocking client socket with a receive timeout; closed on destruction.
class Client {
 public:
  Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { Reset(); }

  bool Connect(uint16_t port, int family = AF_INET) {
    Reset();
    fd_ = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    timeval tv{kReceiveTimeoutMs / 1000, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (family == AF_INET6) {
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_port = htons(port);
      addr.sin6_addr = in6addr_loopback;
      return connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
             0;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }

  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    buffer_.clear();
  }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  struct Response {
    int status = 0;
    std::string status_line;
    std::map<std::string, std::string> headers;  // Lower-case names.
    std::string body;
    std::string Header(const std::string& name) const {
      auto it = headers.find(name);
      return it == headers.end() ? "" : it->second;
    }
    bool Has(const std::string& name) const { return headers.count(name); }
  };

  // Reads one response (pipelining-safe: extra bytes stay buffered). With
  // `head`, no body is read whatever Content-Length says.
  bool Read(Response* out, bool head = false) {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return false;
    }
    std::string head_text = buffer_.substr(0, end);
    buffer_.erase(0, end + 4);
    *out = Response();
    size_t line_end = head_text.find("\r\n");
    out->status_line = head_text.substr(0, line_end);
    if (out->status_line.size() < 12 ||
        out->status_line.compare(0, 9, "HTTP/1.1 ") != 0) {
      return false;
    }
    out->status = std::stoi(out->status_line.substr(9, 3));
    while (line_end != std::string::npos) {
      size_t start = line_end + 2;
      line_end = head_text.find("\r\n", start);
      std::string line = head_text.substr(start, line_end == std::string::npos
                                                     ? std::string::npos
                                                     : line_end - start);
      size_t colon = line.find(':');
      if (colon == std::string::npos) return false;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      size_t value_start = line.find_first_not_of(' ', colon + 1);
      out->headers[name] =
          value_start == std::string::npos ? "" : line.substr(value_start);
    }
    if (head || !out->Has("content-length")) return true;
    size_t length = std::stoul(out->Header("content-length"));
    while (buffer_.size() < length) {
      if (!Fill()) return false;
    }
    out->body = buffer_.substr(0, length);
    buffer_.erase(0, length);
    return true;
  }

  // Reads until the server closes (EOF or reset); false on timeout. What
  // arrived before is appended to *data.
  bool ReadUntilClosed(std::string* data = nullptr) {
    if (data != nullptr) *data += buffer_;
    buffer_.clear();
    char chunk[16384];
    while (true) {
      ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n > 0) {
        if (data != nullptr) data->append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) return true;
      if (errno == EINTR) continue;
      return errno == ECONNRESET || errno == EPIPE;
    }
  }

  int fd() const { return fd_; }

  // Bytes that have arrived and not been read yet (FIONREAD).
  size_t Unread() const {
    int n = 0;
    return ioctl(fd_, FIONREAD, &n) == 0 ? size_t(n) : 0;
  }

 private:
  bool Fill() {
    char chunk[16384];
    while (true) {
      ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
  }

  int fd_ = -1;
  std::string buffer_;
};

std::string Get(std::string_view path, std::string_view extra_headers = "") {
  return std::string("GET ") + std::string(path) +
         " HTTP/1.1\r\nHost: test\r\n" + std::string(extra_headers) + "\r\n";
}

// The header line "Authorization: Basic base64(user_pass)".
std::string AuthHeader(const std::string& user_pass) {
  return "Authorization: " + testutil::Basic(user_pass) + "\r\n";
}

std::string Gunzip(const std::string& in) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return "<inflateInit2 failed>";
  std::string out;
  char chunk[16384];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(chunk, sizeof(chunk) - zs.avail_out);
  }
  inflateEnd(&zs);
  return rc == Z_STREAM_END ? out : "<inflate failed>";
}

bool HostHasIpv6Loopback() {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

class HttpServerTest : public testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }

  void TearDown() override {
    if (thread_.joinable()) {
      uv_async_send(&stop_);
      thread_.join();
    } else if (server_ != nullptr) {
      bool done = false;
      server_->Close([&done] { done = true; });
      uv_run(&loop_, UV_RUN_DEFAULT);
      EXPECT_TRUE(done);
    }
    server_.reset();
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  // Builds the server with the test routes, listens, and runs the loop in a
  // background thread.
  void Start(ServerOptions options = ServerOptions(),
             std::string_view address = "127.0.0.1:0") {
    MakeServer(options);
    Status status = server_->Listen(address);
    ASSERT_TRUE(status.ok()) << status.message();
    RunLoop();
  }

  void MakeServer(ServerOptions options) {
    server_ = std::make_unique<Server>(&loop_, options);
    server_->AddRoute("/metrics", [](const Request&, Response& response) {
      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
      response.body = kMetricsBody;
    });
    server_->AddRoute("/a", [](const Request&, Response& r) { r.body = "A"; });
    server_->AddRoute("/b", [](const Request&, Response& r) { r.body = "BB"; });
    server_->AddRoute("/big", [](const Request&, Response& response) {
      response.body = BigBody();
      response.compressible = true;
    });
    server_->AddRoute("/small", [](const Request&, Response& response) {
      response.body = "tiny\n";
      response.compressible = true;
    });
    server_->AddRoute("/huge", [](const Request&, Response& response) {
      response.body.assign(8 << 20, 'x');
    });
    server_->AddRoute("/echo", [](const Request& request, Response& r) {
      r.body = std::string(request.method) + "|" + std::string(request.path) +
               "|" + std::string(request.query) + "|" +
               std::string(request.accept) + "|" +
               std::string(request.accept_encoding);
      r.headers.emplace_back("X-Echo", "yes");
    });
    server_->AddRoute("/throw", [](const Request&, Response&) {
      throw std::runtime_error("boom");
    });
    server_->AddRoute("/created", [](const Request&, Response& r) {
      r.status = 201;  // not among kCountedStatuses: counted as "other"
    });
  }

  void RunLoop() {
    port_ = server_->port();
    ASSERT_NE(port_, 0);
    ASSERT_EQ(uv_async_init(&loop_, &stop_, &HttpServerTest::OnStop), 0);
    stop_.data = this;
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  }

  static void OnStop(uv_async_t* async) {
    auto* self = static_cast<HttpServerTest*>(async->data);
    self->server_->Close([self] {
      uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_), nullptr);
    });
  }

  // Basic auth for "prom" (password "pw", bcrypt cost 4) and "slow" ("pw",
  // cost 12: a quarter second or more per check).
  void StartWithAuth(ServerOptions options = ServerOptions()) {
    std::unique_ptr<BasicAuth> auth;
    ASSERT_TRUE(BasicAuth::Create({{"prom", testutil::BcryptHash("pw")},
                                   {"slow", testutil::BcryptHash("pw", 12)}},
                                  &auth)
                    .ok());
    options.basic_auth = std::move(auth);
    Start(options);
  }

  // Connects `client`, sends GET /metrics with `user_pass` and waits until
  // the server has sent it to the password checks as the `checks`-th.
  ::testing::AssertionResult SendForCheck(Client& client,
                                          const std::string& user_pass,
                                          uint64_t checks) {
    if (!client.Connect(port_) ||
        !client.Send(Get("/metrics", AuthHeader(user_pass)))) {
      return ::testing::AssertionFailure() << "cannot send";
    }
    return PollUntil([&] { return server_->password_checks() == checks; });
  }

  // One request on a fresh connection.
  Client::Response Fetch(const std::string& request, bool head = false) {
    Client client;
    Client::Response response;
    EXPECT_TRUE(client.Connect(port_));
    EXPECT_TRUE(client.Send(request));
    EXPECT_TRUE(client.Read(&response, head)) << request;
    return response;
  }

  uv_loop_t loop_;
  uv_async_t stop_;
  std::thread thread_;
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
};

TEST_F(HttpServerTest, GetReturnsBodyWithContentLength) {
  Start();
  Client::Response r = Fetch(Get("/metrics"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(r.body, kMetricsBody);
  EXPECT_EQ(r.Header("content-length"), std::to_string(kMetricsBody.size()));
  EXPECT_EQ(r.Header("content-type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_FALSE(r.Has("transfer-encoding"));
  EXPECT_TRUE(PollUntil([&] { return server_->requests_served() == 1; }));
}

TEST_F(HttpServerTest, KeepAliveServesTwoRequestsOnOneConnection) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(client.Send(Get("/metrics")));
    Client::Response r;
    ASSERT_TRUE(client.Read(&r));
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, kMetricsBody);
    EXPECT_FALSE(r.Has("connection"));
  }
  EXPECT_EQ(server_->connections(), 1u);
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/a") + Get("/b")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "BB");

  // Many at once, ending with a partial one completed later.
  std::string burst;
  for (int i = 0; i < 200; ++i) burst += Get(i % 2 == 0 ? "/a" : "/b");
  std::string last = Get("/echo?n=last");
  burst += last.substr(0, 10);
  ASSERT_TRUE(client.Send(burst));
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(client.Read(&r)) << i;
    EXPECT_EQ(r.body, i % 2 == 0 ? "A" : "BB") << i;
  }
  ASSERT_TRUE(client.Send(last.substr(10)));
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "GET|/echo|n=last||");
}

TEST_F(HttpServerTest, HeadSendsGetHeadersWithoutBody) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send("HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n"));
  Client::Response head;
  ASSERT_TRUE(client.Read(&head, /*head=*/true));
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.Header("content-length"), std::to_string(kMetricsBody.size()));
  // Had a body followed, it would be read as the next status line.
  ASSERT_TRUE(client.Send(Get("/a")));
  Client::Response next;
  ASSERT_TRUE(client.Read(&next));
  EXPECT_EQ(next.body, "A");
}

TEST_F(HttpServerTest, HeadOfCompressibleReportsCompressedLength) {
  Start();
  Client::Response get = Fetch(Get("/big", "Accept-Encoding: gzip\r\n"));
  Client::Response head = Fetch(
      "HEAD /big HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n", true);
  EXPECT_EQ(head.Header("content-encoding"), "gzip");
  EXPECT_EQ(head.Header("content-length"), get.Header("content-length"));
  EXPECT_EQ(std::to_string(get.body.size()), get.Header("content-length"));
}

TEST_F(HttpServerTest, UnknownPathIs404) {
  Start();
  Client::Response r = Fetch(Get("/nope"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.Header("content-length"), std::to_string(r.body.size()));
  // The query does not take part in routing.
  EXPECT_EQ(Fetch(Get("/metrics?x=1")).status, 200);
  EXPECT_EQ(Fetch(Get("/metrics/")).status, 404);
}

TEST_F(HttpServerTest, CountsResponsesByStatus) {
  Start();
  const size_t ok = Server::ResponseSlot(200);
  const size_t not_found = Server::ResponseSlot(404);
  const size_t error = Server::ResponseSlot(500);
  const size_t other = Server::kNumCountedStatuses;
  EXPECT_EQ(Server::kCountedStatuses[ok], 200);
  EXPECT_EQ(Server::kCountedStatuses[not_found], 404);
  EXPECT_EQ(Server::ResponseSlot(201), other);
  EXPECT_EQ(Server::ResponseSlot(999), other);
  EXPECT_EQ(Fetch(Get("/a")).status, 200);
  EXPECT_EQ(Fetch(Get("/b")).status, 200);
  EXPECT_EQ(Fetch(Get("/nope")).status, 404);
  EXPECT_EQ(Fetch(Get("/throw")).status, 500);
  EXPECT_EQ(Fetch(Get("/created")).status, 201);
  // The client has read each answer, so each was counted before.
  EXPECT_EQ(server_->responses(ok), 2u);
  EXPECT_EQ(server_->responses(not_found), 1u);
  EXPECT_EQ(server_->responses(error), 1u);
  EXPECT_EQ(server_->responses(other), 1u);
  EXPECT_EQ(server_->responses(other + 1), 0u);  // out of range
  uint64_t total = 0;
  for (size_t i = 0; i <= other; ++i) total += server_->responses(i);
  EXPECT_EQ(total, 5u);
}

TEST_F(HttpServerTest, OtherMethodOnKnownPathIs405WithAllow) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send("DELETE /metrics HTTP/1.1\r\nHost: t\r\n\r\n"));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.Header("allow"), "GET, HEAD");
  // Without a body the connection stays usable.
  ASSERT_TRUE(client.Send(Get("/a")));
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 200);
}

TEST_F(HttpServerTest, RequestBodyIsRefusedAndCloses) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(
      "GET /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.Header("connection"), "close");
  EXPECT_TRUE(client.ReadUntilClosed());

  // A POST with a body still learns that the method is wrong.
  Client post;
  ASSERT_TRUE(post.Connect(port_));
  ASSERT_TRUE(post.Send(
      "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"));
  ASSERT_TRUE(post.Read(&r));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.Header("allow"), "GET, HEAD");
  EXPECT_TRUE(post.ReadUntilClosed());
}

TEST_F(HttpServerTest, SmallBodyWithinLimitIsIgnored) {
  ServerOptions options;
  options.max_body_bytes = 16;
  Start(options);
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(
      "GET /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello" +
      Get("/b")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "BB");
}

TEST_F(HttpServerTest, ConnectionCloseIsHonoured) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/metrics", "Connection: close\r\n")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Header("connection"), "close");
  std::string rest;
  EXPECT_TRUE(client.ReadUntilClosed(&rest));
  EXPECT_EQ(rest, "");
  // The server lingers until the peer closes too.
  client.Reset();
  EXPECT_TRUE(PollUntil([&] { return server_->connections() == 0; }));
}

TEST_F(HttpServerTest, Http10ClosesUnlessKeepAliveAsked) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send("GET /metrics HTTP/1.0\r\n\r\n"));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, kMetricsBody);
  EXPECT_TRUE(client.ReadUntilClosed());

  Client keep;
  ASSERT_TRUE(keep.Connect(port_));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(keep.Send("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    ASSERT_TRUE(keep.Read(&r));
    EXPECT_EQ(r.body, "A");
    EXPECT_EQ(r.Header("connection"), "keep-alive");
  }
}

TEST_F(HttpServerTest, OversizedHeadersAre431ThenClose) {
  ServerOptions options;
  options.max_header_bytes = 1024;
  Start(options);
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(
      Get("/metrics", "X-Big: " + std::string(4096, 'a') + "\r\n")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(r.Header("connection"), "close");
  EXPECT_TRUE(client.ReadUntilClosed());
  EXPECT_EQ(server_->protocol_errors(), 1u);

  // The 431 still arrives when the client keeps sending well past what the
  // server reads: it discards the rest instead of resetting.
  Client pushy;
  ASSERT_TRUE(pushy.Connect(port_));
  ASSERT_TRUE(pushy.Send(
      Get("/metrics", "X-Big: " + std::string(300000, 'a') + "\r\n")));
  ASSERT_TRUE(pushy.Read(&r));
  EXPECT_EQ(r.status, 431);
  EXPECT_TRUE(pushy.ReadUntilClosed());

  // Many small headers add up too.
  std::string many;
  for (int i = 0; i < 200; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(Fetch(Get("/metrics", many)).status, 431);
  // Under the limit is fine.
  EXPECT_EQ(Fetch(Get("/metrics", "X-Small: " + std::string(500, 'a') + "\r\n"))
                .status,
            200);
}

TEST_F(HttpServerTest, GarbageIs400ThenClose) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send("\x16\x03\x01 this is not http\r\n\r\n"));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Header("connection"), "close");
  EXPECT_TRUE(client.ReadUntilClosed());
  client.Reset();
  EXPECT_TRUE(PollUntil([&] { return server_->connections() == 0; }));
}

// RFC 9112 3.2: an HTTP/1.1 request without Host, or any request with two,
// is answered 400 and counted there, whatever its path or method.
TEST_F(HttpServerTest, Http11WithoutHostIs400ThenClose) {
  Start();
  const size_t bad = Server::ResponseSlot(400);
  const std::string cases[] = {
      "GET /metrics HTTP/1.1\r\n\r\n",
      "GET /nope HTTP/1.1\r\nAccept: */*\r\n\r\n",
      "DELETE /metrics HTTP/1.1\r\n\r\n",
      "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
      "GET /metrics HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
      "GET /metrics HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n",
  };
  uint64_t expected = 0;
  for (const std::string& request : cases) {
    Client client;
    ASSERT_TRUE(client.Connect(port_));
    ASSERT_TRUE(client.Send(request));
    Client::Response r;
    ASSERT_TRUE(client.Read(&r)) << request;
    EXPECT_EQ(r.status, 400) << request;
    EXPECT_EQ(r.Header("connection"), "close") << request;
    EXPECT_TRUE(client.ReadUntilClosed()) << request;
    EXPECT_EQ(server_->responses(bad), ++expected) << request;
  }
  EXPECT_EQ(server_->protocol_errors(), expected);
  EXPECT_EQ(server_->requests_served(), 0u);
  // Host in any case, and HTTP/1.0 without it, are fine.
  EXPECT_EQ(Fetch("GET /metrics HTTP/1.1\r\nhOsT: x\r\n\r\n").status, 200);
  EXPECT_EQ(Fetch("GET /metrics HTTP/1.0\r\n\r\n").status, 200);
  EXPECT_EQ(Fetch("GET /nope HTTP/1.0\r\n\r\n").status, 404);
  EXPECT_EQ(server_->responses(bad), expected);
}

TEST_F(HttpServerTest, HalfSentRequestDoesNotBlockOthers) {
  Start();
  Client a;
  ASSERT_TRUE(a.Connect(port_));
  std::string request = Get("/a");
  ASSERT_TRUE(a.Send(request.substr(0, 12)));

  Client b;
  ASSERT_TRUE(b.Connect(port_));
  ASSERT_TRUE(b.Send(Get("/b")));
  Client::Response r;
  ASSERT_TRUE(b.Read(&r));
  EXPECT_EQ(r.body, "BB");

  ASSERT_TRUE(a.Send(request.substr(12)));
  ASSERT_TRUE(a.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, HeaderTimeoutClosesSlowConnection) {
  ServerOptions options;
  options.header_timeout_ns = 200'000'000;
  Start(options);
  Client slow;
  ASSERT_TRUE(slow.Connect(port_));
  auto start = Clock::now();
  ASSERT_TRUE(slow.Send("GET /metrics HTTP/1.1\r\nHost: t\r\n"));
  std::string got;
  ASSERT_TRUE(slow.ReadUntilClosed(&got));
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(150));
  EXPECT_LT(elapsed, milliseconds(4000));
  EXPECT_EQ(got.compare(0, 12, "HTTP/1.1 408"), 0) << got;
  slow.Reset();
  EXPECT_TRUE(PollUntil([&] { return server_->connections() == 0; }));
  EXPECT_EQ(server_->protocol_errors(), 1u);
}

TEST_F(HttpServerTest, ConnectionThatSendsNothingIsClosed) {
  ServerOptions options;
  options.header_timeout_ns = 200'000'000;
  Start(options);
  Client silent;
  ASSERT_TRUE(silent.Connect(port_));
  std::string got;
  ASSERT_TRUE(silent.ReadUntilClosed(&got));
  EXPECT_EQ(got, "");
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionIsClosed) {
  ServerOptions options;
  options.idle_timeout_ns = 200'000'000;
  Start(options);
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/a")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_FALSE(r.Has("connection"));
  auto start = Clock::now();
  std::string rest;
  ASSERT_TRUE(client.ReadUntilClosed(&rest));
  EXPECT_EQ(rest, "");
  EXPECT_GE(Clock::now() - start, milliseconds(100));
  EXPECT_TRUE(PollUntil([&] { return server_->connections() == 0; }));
}

TEST_F(HttpServerTest, ConnectionsBeyondTheCapAreClosed) {
  ServerOptions options;
  options.max_connections = 2;
  Start(options);
  Client c1;
  Client c2;
  ASSERT_TRUE(c1.Connect(port_));
  ASSERT_TRUE(c2.Connect(port_));
  ASSERT_TRUE(PollUntil([&] { return server_->connections() == 2; }));

  Client c3;
  ASSERT_TRUE(c3.Connect(port_));
  EXPECT_TRUE(c3.ReadUntilClosed());
  EXPECT_TRUE(PollUntil([&] { return server_->connections_rejected() == 1; }));

  // The accepted ones still work.
  Client::Response r;
  ASSERT_TRUE(c1.Send(Get("/a")));
  ASSERT_TRUE(c1.Read(&r));
  EXPECT_EQ(r.body, "A");

  // A freed slot is usable again.
  c2.Reset();
  ASSERT_TRUE(PollUntil([&] { return server_->connections() == 1; }));
  Client c4;
  ASSERT_TRUE(c4.Connect(port_));
  ASSERT_TRUE(c4.Send(Get("/b")));
  ASSERT_TRUE(c4.Read(&r));
  EXPECT_EQ(r.body, "BB");
}

// The highest file descriptor open in this process.
int HighestOpenFd() {
  int highest = 2;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 1024;
  while (dirent* entry = readdir(dir)) {
    highest = std::max(highest, std::atoi(entry->d_name));
  }
  closedir(dir);
  return highest;
}

// Lowers RLIMIT_NOFILE's soft limit for the scope of the test and holds
// every descriptor left under it; Release(n) gives n back.
class FdExhaustion {
 public:
  FdExhaustion() {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit low = saved_;
    low.rlim_cur = static_cast<rlim_t>(HighestOpenFd()) + 32;
    ok_ = setrlimit(RLIMIT_NOFILE, &low) == 0;
    while (ok_) {
      int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) break;
      held_.push_back(fd);
    }
  }
  FdExhaustion(const FdExhaustion&) = delete;
  FdExhaustion& operator=(const FdExhaustion&) = delete;
  ~FdExhaustion() {
    Release(held_.size());
    setrlimit(RLIMIT_NOFILE, &saved_);
  }
  bool ok() const { return ok_ && !held_.empty(); }
  void Release(size_t n) {
    for (; n > 0 && !held_.empty(); --n) {
      close(held_.back());
      held_.pop_back();
    }
  }

 private:
  rlimit saved_{};
  bool ok_ = false;
  std::vector<int> held_;
};

// Out of file descriptors, a new connection is closed unanswered at once
// (not left hanging in the backlog), counted as rejected, and /metrics is
// served again as soon as descriptors free up.
TEST_F(HttpServerTest, OutOfFileDescriptorsShedsThenRecovers) {
  Start();
  EXPECT_EQ(Fetch(Get("/metrics")).status, 200);
  // Its descriptor on the server's side must be gone before counting.
  ASSERT_TRUE(PollUntil([&] { return server_->connections() == 0; }));
  {
    FdExhaustion exhaustion;
    ASSERT_TRUE(exhaustion.ok());
    // Room for one client socket only, which each client below frees.
    exhaustion.Release(1);
    for (uint64_t i = 1; i <= 3; ++i) {
      Client client;
      ASSERT_TRUE(client.Connect(port_));
      ASSERT_TRUE(client.Send(Get("/metrics")));
      std::string got;
      EXPECT_TRUE(client.ReadUntilClosed(&got));
      EXPECT_EQ(got, "");
      EXPECT_TRUE(
          PollUntil([&] { return server_->connections_rejected() == i; }));
    }
    EXPECT_EQ(server_->connections(), 0u);
  }
  for (int i = 0; i < 3; ++i) {
    Client::Response r = Fetch(Get("/metrics"));
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, kMetricsBody);
  }
  EXPECT_EQ(server_->connections_rejected(), 3u);
}

// Out of descriptors with the spare no help (the limit lowered under it):
// the server cannot take the waiting connection, so it pauses its
// listeners instead of spinning on them, and serves that connection once
// the limit is back.
TEST_F(HttpServerTest, OutOfFileDescriptorsWithoutUsableSparePausesThenServes) {
  Start();
  ASSERT_TRUE(PollUntil([&] { return server_->connections() == 0; }));
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Descriptor 0 is the only one under the limit: the client's socket.
  const int saved_stdin = fcntl(0, F_DUPFD_CLOEXEC, 3);
  ASSERT_GE(saved_stdin, 0);
  close(0);
  rlimit low = saved;
  low.rlim_cur = 1;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  Client client;
  const bool connected = client.Connect(port_);
  const bool sent = connected && client.Send(Get("/metrics"));
  // The loop thread is not spinning: over 500 ms it uses far less than a
  // core (it wakes every 100 ms to retry).
  rusage before{};
  rusage after{};
  getrusage(RUSAGE_SELF, &before);
  pollfd pfd{client.fd(), POLLIN, 0};
  const int ready = poll(&pfd, 1, 500);
  getrusage(RUSAGE_SELF, &after);
  setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_TRUE(connected);
  ASSERT_TRUE(sent);
  EXPECT_EQ(ready, 0);  // No answer and no close while exhausted.
  auto cpu_us = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1'000'000 +
           r.ru_utime.tv_usec + r.ru_stime.tv_usec;
  };
  EXPECT_LT(cpu_us(after) - cpu_us(before), 200'000);
  Client::Response r;
  EXPECT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(server_->connections_rejected(), 0u);
  client.Reset();
  EXPECT_EQ(dup2(saved_stdin, 0), 0);
  close(saved_stdin);
}

// --web-config's TLS: requests and keep-alive over TLS, verified against
// the certificate; a plain-HTTP client on the TLS port is closed and
// counted, and the server goes on serving TLS clients.
TEST_F(HttpServerTest, ServesOverTlsAndRefusesPlainHttp) {
  testutil::TempDir dir;
  ASSERT_TRUE(
      testutil::WriteSelfSignedCert(dir.File("c.pem"), dir.File("k.pem")));
  ServerOptions options;
  Status s =
      TlsContext::Create(dir.File("c.pem"), dir.File("k.pem"), &options.tls);
  ASSERT_TRUE(s.ok()) << s.message();
  Start(options);

  Client socket;
  ASSERT_TRUE(socket.Connect(port_));
  testutil::TlsClient tls;
  ASSERT_TRUE(tls.Handshake(socket.fd(), dir.File("c.pem")));
  std::string response;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(tls.Send(Get("/metrics")));
    ASSERT_TRUE(tls.ReadResponse(&response));
    EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
    EXPECT_EQ(response.substr(response.size() - kMetricsBody.size()),
              kMetricsBody);
  }
  // Two pipelined requests in one TLS write, then a large body.
  ASSERT_TRUE(tls.Send(Get("/a") + Get("/b", "Connection: close\r\n")));
  response = tls.ReadAll();
  EXPECT_NE(response.find("\r\n\r\nA"), std::string::npos) << response;
  EXPECT_NE(response.find("\r\n\r\nBB"), std::string::npos) << response;

  Client big_socket;
  ASSERT_TRUE(big_socket.Connect(port_));
  testutil::TlsClient big;
  ASSERT_TRUE(big.Handshake(big_socket.fd(), dir.File("c.pem")));
  ASSERT_TRUE(big.Send(Get("/huge", "Connection: close\r\n")));
  response = big.ReadAll();
  EXPECT_EQ(response.size() - response.find("\r\n\r\n") - 4, 8u << 20);

  const uint64_t errors = server_->protocol_errors();
  Client plain;
  ASSERT_TRUE(plain.Connect(port_));
  ASSERT_TRUE(plain.Send(Get("/metrics")));
  Client::Response r;
  ASSERT_TRUE(plain.Read(&r));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "Client sent an HTTP request to an HTTPS server.\n");
  EXPECT_EQ(r.Header("connection"), "close");
  EXPECT_TRUE(plain.ReadUntilClosed());
  EXPECT_EQ(server_->protocol_errors(), errors + 1);
  EXPECT_EQ(server_->responses(Server::ResponseSlot(400)), 1u);
  // Other garbage (not a TLS ClientHello) is closed without an answer.
  Client garbage;
  ASSERT_TRUE(garbage.Connect(port_));
  ASSERT_TRUE(garbage.Send(std::string(64, '\x16')));
  std::string got;
  EXPECT_TRUE(garbage.ReadUntilClosed(&got));
  EXPECT_EQ(got, "");
  EXPECT_TRUE(
      PollUntil([&] { return server_->protocol_errors() == errors + 2; }));
  EXPECT_EQ(server_->responses(Server::ResponseSlot(200)), 5u);
}

// --web-config's basic_auth_users: every path needs the credentials (a
// wrong path gets 401, not 404); 401 carries WWW-Authenticate: Basic and
// keeps the connection open; the right ones are served.
TEST_F(HttpServerTest, BasicAuthGuardsEveryPath) {
  ServerOptions options;
  std::unique_ptr<BasicAuth> auth;
  ASSERT_TRUE(
      BasicAuth::Create({{"prom", testutil::BcryptHash("pw")}}, &auth).ok());
  options.basic_auth = std::move(auth);
  Start(options);
  const std::string good = "Authorization: Basic cHJvbTpwdw==\r\n";   // prom:pw
  const std::string wrong = "Authorization: Basic cHJvbTpQVw==\r\n";  // prom:PW
  for (const std::string& request :
       {Get("/metrics"), Get("/nope"), Get("/metrics", wrong),
        Get("/metrics", "Authorization: Bearer cHJvbTpwdw==\r\n"),
        Get("/metrics", good + "Authorization: Basic eDp5\r\n"),
        std::string("HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n")}) {
    Client::Response r = Fetch(request, /*head=*/request.rfind("HEAD", 0) == 0);
    EXPECT_EQ(r.status, 401) << request;
    EXPECT_EQ(r.Header("www-authenticate"), "Basic realm=\"tokenmeterd\"")
        << request;
  }
  EXPECT_EQ(server_->responses(Server::ResponseSlot(401)), 6u);
  EXPECT_EQ(server_->responses(Server::ResponseSlot(404)), 0u);

  Client client;
  ASSERT_TRUE(client.Connect(port_));
  Client::Response r;
  ASSERT_TRUE(client.Send(Get("/metrics")));
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 401);
  ASSERT_TRUE(client.Send(Get("/metrics", good)));  // same connection
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, kMetricsBody);
  ASSERT_TRUE(client.Send(Get("/nope", good)));
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 404);
}

// A password check runs on libuv's thread pool: while one takes a
// cost-12 bcrypt (a quarter second or more), a scrape with cached credentials
// on another connection is answered, and the waiting connection is answered
// after it.
TEST_F(HttpServerTest, PasswordCheckDoesNotHoldOtherConnections) {
  StartWithAuth();
  const std::string good = AuthHeader("prom:pw");
  EXPECT_EQ(Fetch(Get("/metrics", good)).status, 200);  // now cached

  Client waiting;  // Without password_checks(): this test builds on 2010ce1.
  ASSERT_TRUE(waiting.Connect(port_));
  ASSERT_TRUE(waiting.Send(Get("/metrics", AuthHeader("slow:wrong"))));
  // Pipelined behind it: read only once the check is done.
  ASSERT_TRUE(waiting.Send(Get("/a", good)));
  for (int i = 0; i < 3; ++i) {
    Client::Response r = Fetch(Get("/metrics", good));
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(waiting.Unread(), 0u) << "the slow check was done first";
  }
  Client::Response r;
  ASSERT_TRUE(waiting.Read(&r));
  EXPECT_EQ(r.status, 401);
  ASSERT_TRUE(waiting.Read(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "A");
}

// A client that gives up while its check waits (a scrape timeout) is not
// read from until it is answered: its check still runs, and a password that
// passes is cached for its next try, which needs no bcrypt.
TEST_F(HttpServerTest, ClientThatLeavesStillGetsItsPasswordCached) {
  StartWithAuth();
  Client running;
  ASSERT_TRUE(SendForCheck(running, "slow:no", 1));
  {
    Client leaver;
    ASSERT_TRUE(SendForCheck(leaver, "slow:pw", 2));
  }  // Gone while its check waits behind the running one.
  // Both checks done: the leaver's connection answered, then closed.
  ASSERT_TRUE(PollUntil([&] { return server_->connections() == 1; },
                        std::chrono::milliseconds(20000)));
  EXPECT_EQ(Fetch(Get("/metrics", AuthHeader("slow:pw"))).status, 200);
  EXPECT_EQ(server_->password_checks(), 2u) << "not from the cache";
  Client::Response r;
  ASSERT_TRUE(running.Read(&r));
  EXPECT_EQ(r.status, 401);
}

// Closing the server while one check runs on the pool and two wait: the
// connections are closed unanswered at once, the waiting checks dropped,
// and the server's close completes only once the running check is off the
// pool (under ASan: nothing touches a freed connection or job).
TEST_F(HttpServerTest, ServerClosesWithChecksRunningAndWaiting) {
  StartWithAuth();
  std::vector<Client> clients(3);
  for (size_t i = 0; i < clients.size(); ++i) {
    ASSERT_TRUE(SendForCheck(clients[i], "slow:pw", i + 1));
  }
  uv_async_send(&stop_);
  thread_.join();  // Server::Close's done ran: nothing left on the pool.
  EXPECT_EQ(server_->connections(), 0u);
  for (Client& client : clients) {
    Client::Response r;
    EXPECT_FALSE(client.Read(&r)) << "answered " << r.status;
  }
  server_.reset();  // Closed: TearDown only closes the loop.
}

// Beyond auth_max_waiting, a request that needs a bcrypt is answered 503
// with Retry-After at once; its connection stays open and is served later.
TEST_F(HttpServerTest, FullCheckQueueIsAnswered503) {
  ServerOptions options;
  options.auth_max_waiting = 0;
  StartWithAuth(options);
  const std::string good = AuthHeader("prom:pw");
  Client running;
  ASSERT_TRUE(SendForCheck(running, "slow:wrong", 1));
  Client busy;
  ASSERT_TRUE(busy.Connect(port_));
  Client::Response r;
  ASSERT_TRUE(busy.Send(Get("/metrics", good)));
  ASSERT_TRUE(busy.Read(&r));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(server_->password_checks(), 1u);
  EXPECT_EQ(r.Header("retry-after"), "1");
  EXPECT_EQ(server_->responses(Server::ResponseSlot(503)), 1u);
  ASSERT_TRUE(running.Read(&r));
  EXPECT_EQ(r.status, 401);
  ASSERT_TRUE(busy.Send(Get("/metrics", good)));  // same connection
  ASSERT_TRUE(busy.Read(&r));
  EXPECT_EQ(r.status, 200);
}

TEST_F(HttpServerTest, GzipRoundTrip) {
  Start();
  Client::Response r = Fetch(Get("/big", "Accept-Encoding: deflate, gzip\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Header("content-encoding"), "gzip");
  EXPECT_EQ(r.Header("vary"), "Accept-Encoding");
  EXPECT_LT(r.body.size(), BigBody().size() / 4);
  EXPECT_EQ(Gunzip(r.body), BigBody());
}

TEST_F(HttpServerTest, NoGzipWhenNotAccepted) {
  Start();
  for (std::string_view header :
       {"", "Accept-Encoding: identity\r\n", "Accept-Encoding: gzip;q=0\r\n"}) {
    Client::Response r = Fetch(Get("/big", header));
    EXPECT_FALSE(r.Has("content-encoding")) << header;
    EXPECT_EQ(r.Header("vary"), "Accept-Encoding");
    EXPECT_EQ(r.body, BigBody()) << header;
  }
}

TEST_F(HttpServerTest, NoGzipForSmallOrIncompressibleBodies) {
  Start();
  Client::Response small = Fetch(Get("/small", "Accept-Encoding: gzip\r\n"));
  EXPECT_FALSE(small.Has("content-encoding"));
  EXPECT_EQ(small.body, "tiny\n");
  Client::Response plain = Fetch(Get("/huge", "Accept-Encoding: gzip\r\n"));
  EXPECT_FALSE(plain.Has("content-encoding"));
  EXPECT_FALSE(plain.Has("vary"));
  EXPECT_EQ(plain.body.size(), size_t{8} << 20);
}

TEST_F(HttpServerTest, HandlerSeesPathQueryAndNegotiationHeaders) {
  Start();
  Client::Response r =
      Fetch(Get("/echo?a=1&b=2",
                "Accept: text/plain\r\naccept: application/openmetrics-text\r\n"
                "ACCEPT-ENCODING: gzip\r\n"));
  EXPECT_EQ(r.body,
            "GET|/echo|a=1&b=2|text/plain, application/openmetrics-text|gzip");
  EXPECT_EQ(r.Header("x-echo"), "yes");
  // Absolute-form targets route like origin-form ones.
  r = Fetch("GET http://localhost:1/echo?q HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.body, "GET|/echo|q||");
}

TEST_F(HttpServerTest, HandlerExceptionIs500) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/throw") + Get("/a")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.status, 500);
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, LargeResponseReachesASlowReader) {
  Start();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/huge") + Get("/a")));
  // Nothing is read until the response has begun to pile up unread (far
  // less than the socket buffers hold, far less than the 8 MiB body).
  ASSERT_TRUE(PollUntil([&] { return client.Unread() >= 32 * 1024; }));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body.size(), size_t{8} << 20);
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, CloseEndsOpenConnections) {
  Start();
  Client idle;
  Client partial;
  ASSERT_TRUE(idle.Connect(port_));
  ASSERT_TRUE(partial.Connect(port_));
  ASSERT_TRUE(partial.Send("GET /metr"));
  ASSERT_TRUE(PollUntil([&] { return server_->connections() == 2; }));
  uv_async_send(&stop_);
  thread_.join();
  EXPECT_TRUE(idle.ReadUntilClosed());
  EXPECT_TRUE(partial.ReadUntilClosed());
  EXPECT_EQ(server_->connections(), 0u);
  // TearDown checks uv_loop_close().
}

TEST_F(HttpServerTest, ListenReportsAddressInUse) {
  int blocker = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(blocker, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(blocker, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(blocker, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(blocker, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  MakeServer(ServerOptions());
  Status status = server_->Listen(address);
  close(blocker);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(address), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("address already in use"), std::string::npos)
      << status.message();
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
}

TEST_F(HttpServerTest, ListenRejectsBadSyntax) {
  MakeServer(ServerOptions());
  for (std::string_view bad :
       {"", "nonsense", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999",
        "127.0.0.1:-1", "127.0.0.1:8o", "::1:80", "[::1]80", "[::1]:", "[]:80",
        "[not-v6]:80", "[::1:80", "127.0.0.1:123456"}) {
    Status status = server_->Listen(bad);
    EXPECT_FALSE(status.ok()) << bad;
    EXPECT_NE(
        status.message().find(std::string("\"") + std::string(bad) + "\""),
        std::string::npos)
        << status.message();
  }
  EXPECT_EQ(server_->port(), 0);
}

TEST_F(HttpServerTest, ListensOnIpv6Loopback) {
  if (!HostHasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback here";
  Start(ServerOptions(), "[::1]:0");
  Client client;
  ASSERT_TRUE(client.Connect(port_, AF_INET6));
  ASSERT_TRUE(client.Send(Get("/a")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, ListensOnEveryInterfaceWithPortOnly) {
  Start(ServerOptions(), ":0");
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/a")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, ListensOnHostName) {
  Start(ServerOptions(), "localhost:0");
  Client client;
  // localhost may resolve to ::1 first.
  if (!client.Connect(port_)) {
    ASSERT_TRUE(client.Connect(port_, AF_INET6));
  }
  ASSERT_TRUE(client.Send(Get("/a")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, AdoptsAnInheritedListeningSocket) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  MakeServer(ServerOptions());
  Status status = server_->Adopt(fd);
  ASSERT_TRUE(status.ok()) << status.message();
  RunLoop();
  Client client;
  ASSERT_TRUE(client.Connect(port_));
  ASSERT_TRUE(client.Send(Get("/a")));
  Client::Response r;
  ASSERT_TRUE(client.Read(&r));
  EXPECT_EQ(r.body, "A");
}

TEST_F(HttpServerTest, AdoptRefusesASocketThatIsNotListening) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  MakeServer(ServerOptions());
  Status status = server_->Adopt(fd);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("not a listening socket"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace tokenmeter::daemon::http
