// tm_tokens_batch() and tm_tokens_batch_str(): the events they append, as
// the bytes on the socket show them, and their failure modes. Self-contained:
// its own listening socket and the msgpack-c decoder.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <msgpack.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "tokenmeter/tokenmeter.h"

namespace {

using namespace std::string_literals;

// One decoded event: [kind, t, rid, n].
struct Event {
  uint64_t kind = 0;
  uint64_t t = 0;
  std::variant<uint64_t, std::string> rid;
  uint64_t n = 0;
};

class TokensBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tmb.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/i.sock";
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(listen_fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr),
              0);
    ASSERT_EQ(listen(listen_fd_, 4), 0);
  }

  void TearDown() override {
    if (client_ != nullptr) tm_client_close(client_, nullptr, 0);
    if (conn_fd_ >= 0) close(conn_fd_);
    if (listen_fd_ >= 0) close(listen_fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  // A client of this test's socket (or of a path nobody listens on).
  void NewClient(bool listening = true, size_t capacity = 65536,
                 uint32_t max_threads = 64) {
    tm_options* o = tm_options_new();
    ASSERT_NE(o, nullptr);
    const std::string absent = dir_ + "/absent.sock";
    EXPECT_EQ(tm_options_set_socket_path(
                  o, listening ? path_.c_str() : absent.c_str()),
              TM_OK);
    EXPECT_EQ(tm_options_set_model(o, "m"), TM_OK);
    EXPECT_EQ(tm_options_set_flush_interval_ms(o, 1), TM_OK);
    EXPECT_EQ(tm_options_set_buffer_capacity(o, capacity), TM_OK);
    EXPECT_EQ(tm_options_set_close_timeout_ms(o, 100), TM_OK);
    EXPECT_EQ(tm_options_set_max_threads(o, max_threads), TM_OK);
    ASSERT_EQ(tm_client_new(o, &client_), TM_OK);
    tm_options_free(o);
  }

  // Flushes the client and decodes every TOKENS event written so far.
  std::vector<Event> Received() {
    if (conn_fd_ < 0) {
      pollfd p{listen_fd_, POLLIN, 0};
      EXPECT_EQ(poll(&p, 1, 10000), 1) << "the client never connected";
      conn_fd_ = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      EXPECT_GE(conn_fd_, 0);
    }
    EXPECT_EQ(tm_client_flush(client_, 10000), TM_OK);
    char buf[65536];
    ssize_t r;
    while ((r = recv(conn_fd_, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      bytes_.append(buf, size_t(r));
    }
    std::vector<Event> events;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    while (msgpack_unpack_next(&u, bytes_.data(), bytes_.size(), &off) ==
           MSGPACK_UNPACK_SUCCESS) {
      const msgpack_object& f = u.data;
      if (f.type != MSGPACK_OBJECT_ARRAY || f.via.array.size < 4 ||
          f.via.array.ptr[0].via.u64 != TM_FRAME_BATCH) {
        continue;
      }
      const msgpack_object& list = f.via.array.ptr[3];
      for (uint32_t i = 0; i < list.via.array.size; ++i) {
        const msgpack_object& e = list.via.array.ptr[i];
        Event ev;
        ev.kind = e.via.array.ptr[0].via.u64;
        if (ev.kind != TM_EV_TOKENS) continue;
        ev.t = e.via.array.ptr[1].via.u64;
        const msgpack_object& rid = e.via.array.ptr[2];
        if (rid.type == MSGPACK_OBJECT_STR) {
          ev.rid = std::string(rid.via.str.ptr, rid.via.str.size);
        } else {
          ev.rid = rid.via.u64;
        }
        ev.n = e.via.array.ptr[3].via.u64;
        events.push_back(ev);
      }
    }
    msgpack_unpacked_destroy(&u);
    bytes_.erase(0, off);
    return events;
  }

  uint64_t Stat(tm_stat which) {
    uint64_t s[TM_STAT_COUNT];
    EXPECT_EQ(tm_client_stats(client_, s, TM_STAT_COUNT), TM_OK);
    return s[which];
  }

  std::string dir_, path_, bytes_;
  int listen_fd_ = -1;
  int conn_fd_ = -1;
  tm_client* client_ = nullptr;
};

TEST_F(TokensBatchTest, AppendsOneTokensEventPerEntryWithOneTimestamp) {
  NewClient();
  const uint64_t rids[] = {7, 8, UINT64_MAX};
  const uint32_t n[] = {1, 2, 0xffffffffu};
  const uint64_t t = tm_now_ns() - 1000;
  EXPECT_EQ(tm_tokens_batch(client_, t, rids, n, 3), 3);
  const std::vector<Event> ev = Received();
  ASSERT_EQ(ev.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ev[i].t, t);
    EXPECT_EQ(std::get<uint64_t>(ev[i].rid), rids[i]);
    EXPECT_EQ(ev[i].n, n[i]);
  }
  EXPECT_EQ(Stat(TM_STAT_EVENTS_SENT), 3u);
}

TEST_F(TokensBatchTest, NullCountsMeanOneTokenEach) {
  NewClient();
  const uint64_t rids[] = {1, 2};
  EXPECT_EQ(tm_tokens_batch(client_, 5, rids, nullptr, 2), 2);
  const std::vector<Event> ev = Received();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].n, 1u);
  EXPECT_EQ(ev[1].n, 1u);
}

TEST_F(TokensBatchTest, ZeroCountEntriesAreSkippedNotRejected) {
  NewClient();
  const uint64_t rids[] = {1, 2, 3, 4};
  const uint32_t n[] = {0, 2, 0, 1};
  EXPECT_EQ(tm_tokens_batch(client_, 5, rids, n, 4), 2);
  const uint32_t zeros[] = {0, 0};
  EXPECT_EQ(tm_tokens_batch(client_, 5, rids, zeros, 2), 0);
  const std::vector<Event> ev = Received();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(std::get<uint64_t>(ev[0].rid), 2u);
  EXPECT_EQ(std::get<uint64_t>(ev[1].rid), 4u);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_REJECTED), 0u);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_DROPPED), 0u);
}

TEST_F(TokensBatchTest, NowIsReadOnceForTheWholeBatch) {
  NewClient();
  std::vector<uint64_t> rids(500);
  for (size_t i = 0; i < rids.size(); ++i) rids[i] = i;
  const uint64_t before = tm_now_ns();
  EXPECT_EQ(tm_tokens_batch(client_, 0, rids.data(), nullptr, rids.size()),
            500);
  const uint64_t after = tm_now_ns();
  const std::vector<Event> ev = Received();
  ASSERT_EQ(ev.size(), 500u);
  EXPECT_GE(ev[0].t, before);
  EXPECT_LE(ev[0].t, after);
  for (const Event& e : ev) EXPECT_EQ(e.t, ev[0].t);
}

TEST_F(TokensBatchTest, CountZeroIsFine) {
  NewClient();
  EXPECT_EQ(tm_tokens_batch(client_, 0, nullptr, nullptr, 0), 0);
  EXPECT_EQ(tm_tokens_batch_str(client_, 0, nullptr, 0, nullptr, 0), 0);
  EXPECT_EQ(tm_tokens_batch_str(client_, 0, "", 0, nullptr, 0), 0);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_REJECTED), 0u);
}

TEST_F(TokensBatchTest, InvalidIntegerBatchAppendsNothingAndCountsRejected) {
  NewClient();
  const uint64_t rids[] = {1};
  EXPECT_EQ(tm_tokens_batch(nullptr, 0, rids, nullptr, 1), TM_E_INVALID);
  EXPECT_EQ(tm_tokens_batch(client_, 0, nullptr, nullptr, 3), TM_E_INVALID);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_REJECTED), 3u);
  EXPECT_EQ(tm_tokens_batch(client_, 0, rids, nullptr,
                            size_t{TM_MAX_BATCH_EVENTS} + 1),
            TM_E_INVALID);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_REJECTED), 3u + TM_MAX_BATCH_EVENTS + 1);
  EXPECT_TRUE(Received().empty());
}

TEST_F(TokensBatchTest, StringIdsArePackedWithNulTerminators) {
  NewClient();
  const std::string id128(TM_MAX_RID_BYTES, 'x');
  const std::string packed = "req-1\0r2\0"s + id128 + "\0\xc3\xa9\0"s;
  const uint32_t n[] = {1, 0, 4, 2};
  EXPECT_EQ(tm_tokens_batch_str(client_, 9, packed.data(), packed.size(), n, 4),
            3);
  const std::vector<Event> ev = Received();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(std::get<std::string>(ev[0].rid), "req-1");
  EXPECT_EQ(ev[0].n, 1u);
  EXPECT_EQ(std::get<std::string>(ev[1].rid), id128);
  EXPECT_EQ(ev[1].n, 4u);
  EXPECT_EQ(std::get<std::string>(ev[2].rid), "\xc3\xa9");
  EXPECT_EQ(ev[2].n, 2u);
  for (const Event& e : ev) EXPECT_EQ(e.t, 9u);
}

TEST_F(TokensBatchTest, MalformedStringBatchIsRejectedWhole) {
  NewClient();
  const std::string long_id(TM_MAX_RID_BYTES + 1, 'x');
  struct Case {
    const char* what;
    std::string packed;
    size_t count;
  };
  const Case cases[] = {
      {"empty id", "a\0\0b\0"s, 3},
      {"overlong id", "a\0"s + long_id + "\0"s, 2},
      {"fewer ids than count", "a\0b\0"s, 3},
      {"more ids than count (a NUL inside an id)", "a\0b\0c\0"s, 2},
      {"no final NUL", "a\0b"s, 2},
  };
  uint64_t rejected = 0;
  for (const Case& c : cases) {
    EXPECT_EQ(tm_tokens_batch_str(client_, 1, c.packed.data(), c.packed.size(),
                                  nullptr, c.count),
              TM_E_INVALID)
        << c.what;
    rejected += c.count;
    EXPECT_EQ(Stat(TM_STAT_EVENTS_REJECTED), rejected) << c.what;
  }
  EXPECT_EQ(tm_tokens_batch_str(client_, 1, nullptr, 4, nullptr, 1),
            TM_E_INVALID);
  EXPECT_EQ(tm_tokens_batch_str(nullptr, 1, "a", 2, nullptr, 1), TM_E_INVALID);
  EXPECT_TRUE(Received().empty());
}

TEST_F(TokensBatchTest, FullBufferDropsWhatDoesNotFitAndCountsIt) {
  // Nobody listens: nothing drains the 1024-event (4096-word) buffer.
  NewClient(/*listening=*/false, /*capacity=*/1024);
  std::vector<uint64_t> rids(3000);
  for (size_t i = 0; i < rids.size(); ++i) rids[i] = i;
  const int appended =
      tm_tokens_batch(client_, 0, rids.data(), nullptr, rids.size());
  EXPECT_GT(appended, 1000);
  EXPECT_LT(appended, 3000);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_DROPPED), 3000u - uint64_t(appended));
  EXPECT_EQ(Stat(TM_STAT_EVENTS_REJECTED), 0u);
}

TEST_F(TokensBatchTest, ThreadWithoutSlotDropsEveryEventOfTheBatch) {
  NewClient(/*listening=*/true, 65536, /*max_threads=*/1);
  ASSERT_EQ(tm_thread_attach(client_), TM_OK);  // the only slot
  int result = -100;
  std::thread other([&] {
    const uint64_t rids[] = {1, 2, 3, 4, 5};
    const uint32_t n[] = {0, 1, 0, 2, 1};  // three events
    result = tm_tokens_batch(client_, 0, rids, n, 5);
  });
  other.join();
  EXPECT_EQ(result, 0);
  EXPECT_EQ(Stat(TM_STAT_EVENTS_DROPPED), 3u);
}

}  // namespace
