// Cost per event call of libtokenmeter, beside in-process anchors.
//
// Cases (docs/performance.md explains how to read them):
//   tm_tokens/caller_ts, tm_tokens/now, tm_arrived/caller_ts, tm_arrived/now
//       one event call each, at 1 and 2 threads (each thread its own ring,
//       one client); "now" passes t_ns = 0 so the library reads the clock.
//   tm_expert_load/256/caller_ts   one MoE EXPERT_LOAD of 256 experts
//       (protocol 1.1) per call: the count check and the 2 KiB copy.
//   tm_kv_transfer/caller_ts, tm_kv_transfer/now   one protocol 1.2
//       KV_TRANSFER per call, as a prefill engine reports one (role send,
//       start, bytes, blocks, connector "nixl"), at 1 and 2 threads.
//   tm_admission_rejected/caller_ts, tm_admission_rejected/now   one
//       protocol 1.2 ADMISSION_REJECTED per call (reason "queue_full", no
//       request id), at 1 and 2 threads. Issue: each of these two costs at
//       most a tm_tokens of the same timestamp mode.
//   tm_kv_transfer_id/*, tm_admission_rejected_id/*,
//   tm_admission_rejected_id_rid/caller_ts   the same two events with the
//       connector / reason registered once (tm_register_value()) and passed
//       by id, the path an engine that reports them often takes.
//   tm_tokens_str/caller_ts, tm_kv_transfer_id_str/caller_ts   a TOKENS
//       and a KV_TRANSFER (ids) with a 39-byte vLLM-shaped string request
//       id: the pair an engine with string ids (vLLM, SGLang) compares.
//   tm_scheduled_ex/caller_ts   a SCHEDULED with protocol 1.2's info
//       (cached and external prompt tokens): a 4-word record through the
//       tm_tokens path with no rule to test, the reference that tells the
//       cost of a word from the cost of KV_TRANSFER's rules.
//   prometheus_observe   prometheus-cpp Histogram::Observe on a child
//       resolved once outside the loop (22 TTFT buckets), at 1 and 2 threads
//       (both threads on the same child, as an engine would share it).
//   clock_gettime_monotonic, mutex_lock_unlock   reference points.
//   tm_tokens/caller_ts/ack_off, tm_arrived/caller_ts/ack_off   the same
//       calls on a second client with acknowledged delivery off
//       (tm_options_set_ack(opts, 0)); every other tm_* case uses the
//       default, ack on, against a sink that acks each BATCH like the
//       daemon. The ack path is the sender thread's: the pair shows that it
//       adds nothing to an event call.
//   dlopen/tm_tokens/caller_ts, dlopen/tm_tokens/now   only with
//       --shared_library=PATH: the tm_tokens cases on a client of another
//       copy of the library, PATH loaded with dlopen() (as the Python
//       binding loads it) and called through pointers from dlsym(), in the
//       same process as the cases above, so that --benchmark_enable_random_
//       interleaving runs the two copies' cases side by side. Given the
//       shared library to client_bench_static, it sets the shared library
//       against the static one in one invocation (docs/performance.md,
//       "Where the time goes"); the pointer call is what a caller built
//       with -fno-plt makes, where the PLT adds a jump.
//
// Honesty of the tm_* cases: a producer at ~10 ns per call outruns the
// sender thread, and a full ring turns every call into the "drop"
// path. So each thread times kChunk calls, then (untimed) flushes them
// through the real sender to a real Unix-socket sink in this process, and
// only then times the next chunk. Every run checks that nothing was dropped
// or rejected and that every call made was sent; a run that fails the check
// is reported as an error, not as a figure.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <msgpack.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tokenmeter/tokenmeter.h"

#ifdef TM_BENCH_HAVE_PROMETHEUS
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#endif

namespace tokenmeter::bench {
namespace {

// Calls timed between two drains. 4096 TOKENS records are 96 KiB, 4096
// ARRIVED records 128 KiB: far below the default 2 MiB ring, so no timed call
// can find the ring full.
constexpr int kChunk = 4096;
constexpr uint32_t kFlushTimeoutMs = 10000;

// Stands in for tokenmeterd: accepts connections on a Unix socket in a fresh
// temporary directory, reads every byte and, on a connection whose HELLO
// asked for ACKs, acks the BATCHes it read ([3, seq], as a daemon without a
// state directory does). Owns its thread, its sockets and the directory.
class SinkServer {
 public:
  SinkServer() = default;
  SinkServer(const SinkServer&) = delete;
  SinkServer& operator=(const SinkServer&) = delete;
  ~SinkServer() { Stop(); }

  // False (with a line on stderr) when the socket cannot be set up.
  bool Start() {
    char dir[] = "/tmp/tmbench.XXXXXX";
    if (mkdtemp(dir) == nullptr) return Fail("mkdtemp");
    dir_ = dir;
    path_ = dir_ + "/sink.sock";
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return Fail("socket");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
            0 ||
        listen(listen_fd_, 16) != 0) {
      return Fail("bind/listen");
    }
    if (pipe(stop_pipe_) != 0) return Fail("pipe");
    thread_ = std::thread([this] { Run(); });
    return true;
  }

  void Stop() {
    if (thread_.joinable()) {
      const char b = 0;
      [[maybe_unused]] ssize_t w = write(stop_pipe_[1], &b, 1);
      thread_.join();
    }
    for (int* fd : {&listen_fd_, &stop_pipe_[0], &stop_pipe_[1]}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    if (!path_.empty()) unlink(path_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
    path_.clear();
    dir_.clear();
  }

  const std::string& path() const { return path_; }
  uint64_t bytes_read() const { return bytes_.load(); }

 private:
  bool Fail(const char* what) {
    std::fprintf(stderr, "client_bench: sink %s: %s\n", what,
                 std::strerror(errno));
    return false;
  }

  void Run() {
    std::vector<pollfd> fds = {{stop_pipe_[0], POLLIN, 0},
                               {listen_fd_, POLLIN, 0}};
    std::vector<char> buf(256 * 1024);
    for (;;) {
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].revents != 0) break;
      if (fds[1].revents & POLLIN) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          fds.push_back({fd, POLLIN, 0});
          conns_.push_back(std::make_unique<Conn>());
        }
      }
      for (size_t i = 2; i < fds.size();) {
        bool closed = false;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t r = read(fds[i].fd, buf.data(), buf.size());
          if (r > 0) {
            bytes_.fetch_add(uint64_t(r), std::memory_order_relaxed);
            closed = !conns_[i - 2]->Feed(fds[i].fd, buf.data(), size_t(r));
          } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
            closed = true;
          }
        }
        if (closed) {
          close(fds[i].fd);
          fds.erase(fds.begin() + long(i));
          conns_.erase(conns_.begin() + long(i - 2));
        } else {
          ++i;
        }
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) close(fds[i].fd);
    conns_.clear();
  }

  // One connection's frames, found as they arrive by a msgpack walker that
  // skips over the events (it builds nothing: decoding them into objects
  // would cost the sink more than the client spends making them), and the
  // ACKs they call for. Every connection is walked alike, acked or not.
  class Conn {
   public:
    // Walks the bytes read from `fd` and acks the last BATCH among them.
    // False when they are not msgpack (the sink then drops the connection).
    bool Feed(int fd, const char* data, size_t n) {
      pending_.insert(pending_.end(), data, data + n);
      const uint8_t* p = pending_.data();
      const uint8_t* const end = p + pending_.size();
      uint64_t acked = 0;
      bool any = false;
      for (;;) {
        const uint8_t* next = Skip(p, end);
        if (next == kBad) return false;
        if (next == nullptr) break;  // incomplete: wait for more
        // [0, meta] or [1, seq, ...]: a fixarray, a fixint type.
        if (next - p >= 3 && (p[0] & 0xf0) == 0x90) {
          if (p[1] == 0 && Contains(p, next, kAckTrue)) ack_ = true;
          if (p[1] == 1 && ack_) {
            const uint8_t* q = p + 2;
            if (ReadUint(&q, next, &acked)) any = true;
          }
        }
        p = next;
      }
      pending_.erase(pending_.begin(),
                     pending_.begin() + (p - pending_.data()));
      if (any) {
        uint8_t frame[11] = {0x92, 0x03, 0xcf};  // [3, seq as a uint64]
        for (int k = 0; k < 8; ++k) {
          frame[3 + k] = uint8_t(acked >> (56 - 8 * k));
        }
        // 11 bytes to a socket the client keeps reading: they fit.
        [[maybe_unused]] ssize_t w =
            send(fd, frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      return true;
    }

   private:
    static inline const uint8_t* const kBad =
        reinterpret_cast<const uint8_t*>(uintptr_t{1});
    // "ack": true, as the library encodes it.
    static constexpr uint8_t kAckTrue[] = {0xa3, 'a', 'c', 'k', 0xc3};

    static bool Contains(const uint8_t* b, const uint8_t* e,
                         const uint8_t (&pat)[5]) {
      return std::search(b, e, std::begin(pat), std::end(pat)) != e;
    }

    static uint64_t BigEndian(const uint8_t* p, int n) {
      uint64_t v = 0;
      for (int k = 0; k < n; ++k) v = v << 8 | p[k];
      return v;
    }

    static bool ReadUint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
      if (*p >= end) return false;
      const uint8_t t = **p;
      const int n = t <= 0x7f                ? 0
                    : t >= 0xcc && t <= 0xcf ? 1 << (t - 0xcc)
                                             : -1;
      if (n < 0 || end - *p < 1 + n) return false;
      *v = n == 0 ? t : BigEndian(*p + 1, n);
      *p += 1 + n;
      return true;
    }

    // Past the object at p; nullptr when it does not end before `end`;
    // kBad when it is not msgpack.
    static const uint8_t* Skip(const uint8_t* p, const uint8_t* end) {
      if (p >= end) return nullptr;
      const uint8_t t = *p++;
      uint64_t items = 0;  // nested objects that follow
      size_t bytes = 0;    // raw bytes that follow
      if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
        return p;
      } else if (t <= 0x8f) {
        items = 2 * uint64_t(t & 0x0f);
      } else if (t <= 0x9f) {
        items = t & 0x0f;
      } else if (t <= 0xbf) {
        bytes = t & 0x1f;
      } else if (t == 0xc1) {
        return kBad;
      } else {
        // Widths of the length (or of the value) of the other formats.
        static constexpr int8_t kLen[] = {
            1,  2,  4,            // c4-c6 bin
            1,  2,  4,            // c7-c9 ext (+1 type byte)
            -4, -8,               // ca-cb float
            -1, -2, -4, -8,       // cc-cf uint
            -1, -2, -4, -8,       // d0-d3 int
            -2, -3, -5, -9, -17,  // d4-d8 fixext (type + data)
            1,  2,  4,            // d9-db str
            2,  4,                // dc-dd array
            2,  4};               // de-df map
        const int w = kLen[t - 0xc4];
        if (w < 0) {
          bytes = size_t(-w);
        } else {
          if (end - p < w) return nullptr;
          const uint64_t len = BigEndian(p, w);
          p += w;
          if (t >= 0xdc && t <= 0xdd) {
            items = len;
          } else if (t >= 0xde) {
            items = 2 * len;
          } else {
            bytes = size_t(len) + (t >= 0xc7 && t <= 0xc9 ? 1 : 0);
          }
        }
      }
      if (size_t(end - p) < bytes) return nullptr;
      p += bytes;
      for (uint64_t k = 0; k < items; ++k) {
        p = Skip(p, end);
        if (p == nullptr || p == kBad) return p;
      }
      return p;
    }

    std::vector<uint8_t> pending_;  // an incomplete frame's bytes
    bool ack_ = false;
  };
  std::vector<std::unique_ptr<Conn>> conns_;  // conns_[i] is fds[i + 2]'s

  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<uint64_t> bytes_{0};
};

// The calls the harness makes on a client, from the library this program
// is linked with (kLinked) or from one it loaded (LoadLibrary()).
struct Api {
  decltype(&tm_options_new) options_new;
  decltype(&tm_options_free) options_free;
  decltype(&tm_options_set_socket_path) options_set_socket_path;
  decltype(&tm_options_set_engine) options_set_engine;
  decltype(&tm_options_set_model) options_set_model;
  decltype(&tm_options_set_ack) options_set_ack;
  decltype(&tm_client_new) client_new;
  decltype(&tm_client_close) client_close;
  decltype(&tm_client_flush) client_flush;
  decltype(&tm_client_stats) client_stats;
  decltype(&tm_thread_attach) thread_attach;
  decltype(&tm_strerror) strerror;
  decltype(&tm_now_ns) now_ns;
  decltype(&tm_tokens) tokens;
};

const Api kLinked = {
    &tm_options_new,
    &tm_options_free,
    &tm_options_set_socket_path,
    &tm_options_set_engine,
    &tm_options_set_model,
    &tm_options_set_ack,
    &tm_client_new,
    &tm_client_close,
    &tm_client_flush,
    &tm_client_stats,
    &tm_thread_attach,
    &tm_strerror,
    &tm_now_ns,
    &tm_tokens,
};

// Loads the library at `path` (dlopen(), kept loaded) and fills *api from
// it; false, with a line on stderr, when it cannot.
bool LoadLibrary(const char* path, Api* api) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "client_bench: dlopen: %s\n", dlerror());
    return false;
  }
  bool ok = true;
  auto load = [&](auto* fn, const char* name) {
    void* sym = dlsym(lib, name);
    if (sym == nullptr) {
      std::fprintf(stderr, "client_bench: %s: no %s\n", path, name);
      ok = false;
    }
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(sym);
  };
  load(&api->options_new, "tm_options_new");
  load(&api->options_free, "tm_options_free");
  load(&api->options_set_socket_path, "tm_options_set_socket_path");
  load(&api->options_set_engine, "tm_options_set_engine");
  load(&api->options_set_model, "tm_options_set_model");
  load(&api->options_set_ack, "tm_options_set_ack");
  load(&api->client_new, "tm_client_new");
  load(&api->client_close, "tm_client_close");
  load(&api->client_flush, "tm_client_flush");
  load(&api->client_stats, "tm_client_stats");
  load(&api->thread_attach, "tm_thread_attach");
  load(&api->strerror, "tm_strerror");
  load(&api->now_ns, "tm_now_ns");
  load(&api->tokens, "tm_tokens");
  return ok;
}

struct Snapshot {
  uint64_t s[TM_STAT_COUNT] = {};
  explicit Snapshot(const tm_client* c, const Api& api = kLinked) {
    api.client_stats(c, s, TM_STAT_COUNT);
  }
};

// Runs `call(i)` for i = 0, 1, ... in timed chunks of `chunk` (kChunk by
// default), flushing the thread's events to the sink untimed between chunks
// (see the file comment). `api` is the library `c` belongs to.
template <typename Call>
void RunChunked(benchmark::State& state, tm_client* c, Call call,
                int chunk = kChunk, const Api& api = kLinked) {
  // Before the start barrier: no thread has made a timed call yet, and the
  // previous run flushed everything it made.
  if (api.thread_attach(c) != TM_OK) {
    state.SkipWithError("tm_thread_attach failed");
    return;
  }
  const Snapshot before(c, api);
  uint64_t i = 0;
  while (state.KeepRunningBatch(chunk)) {
    for (int k = 0; k < chunk; ++k) call(i++);
    state.PauseTiming();
    const int rc = api.client_flush(c, kFlushTimeoutMs);
    state.ResumeTiming();
    if (rc != TM_OK) state.SkipWithError("tm_client_flush failed");
  }
  // After the stop barrier every thread has made and flushed all its calls.
  if (state.thread_index() != 0 || state.error_occurred()) return;
  const Snapshot after(c, api);
  const uint64_t dropped =
      after.s[TM_STAT_EVENTS_DROPPED] - before.s[TM_STAT_EVENTS_DROPPED];
  const uint64_t rejected =
      after.s[TM_STAT_EVENTS_REJECTED] - before.s[TM_STAT_EVENTS_REJECTED];
  const uint64_t sent =
      after.s[TM_STAT_EVENTS_SENT] - before.s[TM_STAT_EVENTS_SENT];
  // Counters are summed over threads; only thread 0 sets these.
  state.counters["dropped"] = double(dropped);
  state.counters["rejected"] = double(rejected);
  state.counters["events_sent"] = double(sent);
  if (dropped != 0 || rejected != 0) {
    state.SkipWithError("events were dropped or rejected during the run");
  }
}

void TokensCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  RunChunked(state, c, [c, t0](uint64_t i) { tm_tokens(c, t0 + i, i, 1); });
}

void TokensNow(benchmark::State& state, tm_client* c) {
  RunChunked(state, c, [c](uint64_t i) { tm_tokens(c, 0, i, 1); });
}

// The same two through `api` (a loaded library's pointers).
void TokensCallerTsVia(benchmark::State& state, const Api* api, tm_client* c) {
  const auto tokens = api->tokens;
  const uint64_t t0 = api->now_ns();
  RunChunked(
      state, c, [c, t0, tokens](uint64_t i) { tokens(c, t0 + i, i, 1); },
      kChunk, *api);
}

void TokensNowVia(benchmark::State& state, const Api* api, tm_client* c) {
  const auto tokens = api->tokens;
  RunChunked(
      state, c, [c, tokens](uint64_t i) { tokens(c, 0, i, 1); }, kChunk, *api);
}

void ArrivedCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  RunChunked(state, c,
             [c, t0](uint64_t i) { tm_arrived(c, t0 + i, i, 512, 256, 1); });
}

void ArrivedNow(benchmark::State& state, tm_client* c) {
  RunChunked(state, c, [c](uint64_t i) { tm_arrived(c, 0, i, 512, 256, 1); });
}

// 512 records of 258 words (2,064 bytes) are 1 MiB: half the default ring.
constexpr int kExpertLoadChunk = 512;

void ExpertLoad256CallerTs(benchmark::State& state, tm_client* c) {
  std::vector<uint64_t> counts(256);
  for (size_t k = 0; k < counts.size(); ++k) counts[k] = 1000 + 37 * k;
  const uint64_t t0 = tm_now_ns();
  RunChunked(
      state, c,
      [c, t0, &counts](uint64_t i) {
        tm_expert_load(c, t0 + i, uint32_t(i % 64), counts.data(),
                       counts.size());
      },
      kExpertLoadChunk);
}

// One finished KV transfer of about 1 MiB, as vLLM's NIXL connector
// reports it on the prefill side.
tm_kv_transfer_info KvInfo(uint64_t start_ns) {
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  kv.role = TM_KV_SEND;
  kv.start_ns = start_ns;
  kv.bytes = 1 << 20;
  kv.blocks = 64;
  kv.connector = "nixl";
  return kv;
}

void KvTransferCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  const tm_kv_transfer_info kv = KvInfo(t0 - 1000000);
  RunChunked(state, c,
             [c, t0, &kv](uint64_t i) { tm_kv_transfer(c, t0 + i, i, &kv); });
}

void KvTransferNow(benchmark::State& state, tm_client* c) {
  const tm_kv_transfer_info kv = KvInfo(tm_now_ns());
  RunChunked(state, c, [c, &kv](uint64_t i) { tm_kv_transfer(c, 0, i, &kv); });
}

void AdmissionRejectedCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  RunChunked(state, c, [c, t0](uint64_t i) {
    tm_admission_rejected(c, t0 + i, "queue_full");
  });
}

void AdmissionRejectedNow(benchmark::State& state, tm_client* c) {
  RunChunked(state, c,
             [c](uint64_t) { tm_admission_rejected(c, 0, "queue_full"); });
}

// The same two events with the reason and connector registered once
// (tm_register_value()): the path an engine reporting them often takes.
uint32_t Registered(tm_client* c, const char* value) {
  const int id = tm_register_value(c, value);
  return id > 0 ? uint32_t(id) : 0;  // 0: every call is rejected, and seen
}

// KvInfo() with the connector registered on `c` and passed by id.
tm_kv_transfer_info KvInfoById(tm_client* c, uint64_t start_ns) {
  tm_kv_transfer_info kv = KvInfo(start_ns);
  kv.connector = nullptr;
  kv.connector_id = Registered(c, "nixl");
  return kv;
}

void KvTransferIdCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  const tm_kv_transfer_info kv = KvInfoById(c, t0 - 1000000);
  RunChunked(state, c,
             [c, t0, &kv](uint64_t i) { tm_kv_transfer(c, t0 + i, i, &kv); });
}

void KvTransferIdNow(benchmark::State& state, tm_client* c) {
  const tm_kv_transfer_info kv = KvInfoById(c, tm_now_ns());
  RunChunked(state, c, [c, &kv](uint64_t i) { tm_kv_transfer(c, 0, i, &kv); });
}

// A request id as vLLM makes them ("cmpl-" and 32 hex digits, "-0": 39
// bytes, as `daemon_ingest_bench --string-ids`): the id an engine with
// string ids passes to every call of a request.
constexpr char kStringId[] = "cmpl-000000005eed0001c13a5f4e9d2b7a61-0";
constexpr size_t kStringIdLen = sizeof kStringId - 1;
static_assert(kStringIdLen == 39);

void TokensStrCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  RunChunked(state, c, [c, t0](uint64_t i) {
    tm_tokens_str(c, t0 + i, kStringId, kStringIdLen, 1);
  });
}

void ScheduledExCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  RunChunked(state, c,
             [c, t0](uint64_t i) { tm_scheduled_ex(c, t0 + i, i, 16, 0); });
}

void KvTransferIdStrCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  const tm_kv_transfer_info kv = KvInfoById(c, t0 - 1000000);
  RunChunked(state, c, [c, t0, &kv](uint64_t i) {
    tm_kv_transfer_str(c, t0 + i, kStringId, kStringIdLen, &kv);
  });
}

void AdmissionRejectedIdCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  const uint32_t reason = Registered(c, "queue_full");
  RunChunked(state, c, [c, t0, reason](uint64_t i) {
    tm_admission_rejected_id(c, t0 + i, reason);
  });
}

void AdmissionRejectedIdNow(benchmark::State& state, tm_client* c) {
  const uint32_t reason = Registered(c, "queue_full");
  RunChunked(state, c,
             [c, reason](uint64_t) { tm_admission_rejected_id(c, 0, reason); });
}

// With the request's integer id: the record of a tm_tokens() (3 words).
void AdmissionRejectedIdRidCallerTs(benchmark::State& state, tm_client* c) {
  const uint64_t t0 = tm_now_ns();
  const uint32_t reason = Registered(c, "queue_full");
  RunChunked(state, c, [c, t0, reason](uint64_t i) {
    tm_admission_rejected_id_rid(c, t0 + i, reason, i);
  });
}

void ClockGettimeMonotonic(benchmark::State& state) {
  timespec ts;
  for (auto _ : state) {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    benchmark::DoNotOptimize(ts);
  }
}

void MutexLockUnlock(benchmark::State& state) {
  std::mutex mu;
  for (auto _ : state) {
    mu.lock();
    benchmark::ClobberMemory();
    mu.unlock();
  }
}

#ifdef TM_BENCH_HAVE_PROMETHEUS
// TTFT buckets, seconds.
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1,     2.5,   5,    7.5,  10,   20,   40,   80,  160,  640, 2560};

// Observed values cycle through these: spread over the buckets so the bucket
// search does not always take the same path.
constexpr double kTtftSamples[16] = {0.003, 0.012, 0.03, 0.05, 0.07, 0.09,
                                     0.2,   0.4,   0.6,  0.9,  1.7,  3.0,
                                     6.0,   8.5,   15.0, 0.15};

void PrometheusObserve(benchmark::State& state, prometheus::Histogram* h) {
  uint64_t i = 0;
  for (auto _ : state) h->Observe(kTtftSamples[i++ & 15]);
}
#endif

// Waits for the client's first connection to the sink (the sender connects
// in the background). False after 5 s.
bool WaitConnected(const tm_client* c, const Api& api) {
  for (int i = 0; i < 5000; ++i) {
    if (Snapshot(c, api).s[TM_STAT_CONNECTED] == 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// A client of the sink made by `api`'s library, connected; nullptr (with a
// line on stderr) if not.
tm_client* NewClient(const std::string& path, bool ack,
                     const Api& api = kLinked) {
  tm_options* opts = api.options_new();
  if (opts == nullptr ||
      api.options_set_socket_path(opts, path.c_str()) != TM_OK ||
      api.options_set_engine(opts, "bench") != TM_OK ||
      api.options_set_model(opts, "bench-model") != TM_OK ||
      api.options_set_ack(opts, ack ? 1 : 0) != TM_OK) {
    std::fprintf(stderr, "client_bench: setting options failed\n");
    api.options_free(opts);
    return nullptr;
  }
  tm_client* c = nullptr;
  const int rc = api.client_new(opts, &c);
  api.options_free(opts);
  if (rc != TM_OK) {
    std::fprintf(stderr, "client_bench: tm_client_new: %s\n", api.strerror(rc));
    return nullptr;
  }
  if (!WaitConnected(c, api)) {
    std::fprintf(stderr, "client_bench: client did not connect to the sink\n");
    api.client_close(c, nullptr, 0);
    return nullptr;
  }
  return c;
}

// Takes --shared_library=PATH out of argv (Google Benchmark refuses flags
// it does not know); nullptr when it is not there.
const char* TakeSharedLibraryFlag(int* argc, char** argv) {
  static constexpr char kFlag[] = "--shared_library=";
  const char* path = nullptr;
  int out = 0;
  for (int i = 0; i < *argc; ++i) {
    if (std::strncmp(argv[i], kFlag, sizeof kFlag - 1) == 0) {
      path = argv[i] + sizeof kFlag - 1;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return path;
}

int Main(int argc, char** argv) {
  const char* shared_library = TakeSharedLibraryFlag(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Api loaded{};
  if (shared_library != nullptr && !LoadLibrary(shared_library, &loaded)) {
    return 1;
  }

  SinkServer sink;
  if (!sink.Start()) return 1;

  // `c`: the library's defaults (ack on); `c_no_ack`: ack off.
  tm_client* c = NewClient(sink.path(), true);
  tm_client* c_no_ack = NewClient(sink.path(), false);
  // `c_loaded`: the loaded library's client, with its defaults.
  tm_client* c_loaded = shared_library != nullptr
                            ? NewClient(sink.path(), true, loaded)
                            : nullptr;
  if (c == nullptr || c_no_ack == nullptr ||
      (shared_library != nullptr && c_loaded == nullptr)) {
    tm_client_close(c, nullptr, 0);
    tm_client_close(c_no_ack, nullptr, 0);
    if (c_loaded != nullptr) loaded.client_close(c_loaded, nullptr, 0);
    return 1;
  }
  if (c_loaded != nullptr) {
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark("dlopen/tm_tokens/caller_ts",
                                   TokensCallerTsVia, &loaded, c_loaded)
          ->Threads(threads);
      benchmark::RegisterBenchmark("dlopen/tm_tokens/now", TokensNowVia,
                                   &loaded, c_loaded)
          ->Threads(threads);
    }
  }

  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark("tm_tokens/caller_ts", TokensCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_tokens/now", TokensNow, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_arrived/caller_ts", ArrivedCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_arrived/now", ArrivedNow, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_tokens/caller_ts/ack_off", TokensCallerTs,
                                 c_no_ack)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_arrived/caller_ts/ack_off",
                                 ArrivedCallerTs, c_no_ack)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_kv_transfer/caller_ts", KvTransferCallerTs,
                                 c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_kv_transfer/now", KvTransferNow, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_admission_rejected/caller_ts",
                                 AdmissionRejectedCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_admission_rejected/now",
                                 AdmissionRejectedNow, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_kv_transfer_id/caller_ts",
                                 KvTransferIdCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_kv_transfer_id/now", KvTransferIdNow, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_tokens_str/caller_ts", TokensStrCallerTs,
                                 c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_kv_transfer_id_str/caller_ts",
                                 KvTransferIdStrCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_scheduled_ex/caller_ts",
                                 ScheduledExCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_admission_rejected_id/caller_ts",
                                 AdmissionRejectedIdCallerTs, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_admission_rejected_id/now",
                                 AdmissionRejectedIdNow, c)
        ->Threads(threads);
    benchmark::RegisterBenchmark("tm_admission_rejected_id_rid/caller_ts",
                                 AdmissionRejectedIdRidCallerTs, c)
        ->Threads(threads);
  }
  benchmark::RegisterBenchmark("tm_expert_load/256/caller_ts",
                               ExpertLoad256CallerTs, c)
      ->Threads(1);
#ifdef TM_BENCH_HAVE_PROMETHEUS
  prometheus::Registry registry;
  auto& family = prometheus::BuildHistogram()
                     .Name("bench_time_to_first_token_seconds")
                     .Help("Benchmark anchor: TTFT histogram")
                     .Register(registry);
  prometheus::Histogram& h = family.Add(
      {{"model_name", "bench-model"}, {"engine", "0"}}, kTtftBuckets);
  benchmark::RegisterBenchmark("prometheus_observe", PrometheusObserve, &h)
      ->Threads(1)
      ->Threads(2);
#else
  std::fprintf(stderr,
               "client_bench: built without prometheus-cpp; no "
               "prometheus_observe anchor\n");
#endif
  benchmark::RegisterBenchmark("clock_gettime_monotonic",
                               ClockGettimeMonotonic);
  benchmark::RegisterBenchmark("mutex_lock_unlock", MutexLockUnlock);

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  uint64_t final_stats[TM_STAT_COUNT] = {};
  const int rc = tm_client_close(c, final_stats, TM_STAT_COUNT);
  uint64_t no_ack_stats[TM_STAT_COUNT] = {};
  const int rc_no_ack = tm_client_close(c_no_ack, no_ack_stats, TM_STAT_COUNT);
  uint64_t loaded_stats[TM_STAT_COUNT] = {};
  const int rc_loaded =
      c_loaded != nullptr
          ? loaded.client_close(c_loaded, loaded_stats, TM_STAT_COUNT)
          : TM_OK;
  sink.Stop();
  const uint64_t dropped = final_stats[TM_STAT_EVENTS_DROPPED] +
                           no_ack_stats[TM_STAT_EVENTS_DROPPED] +
                           loaded_stats[TM_STAT_EVENTS_DROPPED];
  if (rc != TM_OK || rc_no_ack != TM_OK || rc_loaded != TM_OK || dropped != 0) {
    std::fprintf(
        stderr, "client_bench: %llu events dropped in total, %llu unacked\n",
        static_cast<unsigned long long>(dropped),
        static_cast<unsigned long long>(final_stats[TM_STAT_EVENTS_UNACKED]));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tokenmeter::bench

int main(int argc, char** argv) { return tokenmeter::bench::Main(argc, argv); }
