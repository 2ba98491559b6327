// Cost per event call of libtokenmeter, beside in-process anchors.
//
// Cases (docs/performance.md explains how to read them):
//   tm_tokens/caller_ts, tm_tokens/now, tm_arrived/caller_ts, tm_arrived/now
//       one event call each, at 1 and 2 threads (each thread its own ring,
//       one client); "now" passes t_ns = 0 so the library reads the clock.
//   tm_expert_load/256/caller_ts   one MoE EXPERT_LOAD of 256 experts
//       (protocol 1.1) per call: the count check and the 2 KiB copy.
//   prometheus_observe   prometheus-cpp Histogram::Observe on a child
//       resolved once outside the loop (22 TTFT buckets), at 1 and 2 threads
//       (both threads on the same child, as an engine would share it).
//   clock_gettime_monotonic, mutex_lock_unlock   reference points.
//
// Honesty of the tm_* cases: a producer at ~10 ns per call outruns the
// sender thread, and a full ring turns every call into the "drop"
// path. So each thread times kChunk calls, then (untimed) flushes them
// through the real sender to a real Unix-socket sink in this process, and
// only then times the next chunk. Every run checks that nothing was dropped
// or rejected and that every call made was sent; a run that fails the check
// is reported as an error, not as a figure.
#include <benchmark/benchmark.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
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
// temporary directory and reads and discards every byte. Owns its thread,
// its sockets and the directory.
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
        if (fd >= 0) fds.push_back({fd, POLLIN, 0});
      }
      for (size_t i = 2; i < fds.size();) {
        bool closed = false;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t r = read(fds[i].fd, buf.data(), buf.size());
          if (r > 0) {
            bytes_.fetch_add(uint64_t(r), std::memory_order_relaxed);
          } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
            closed = true;
          }
        }
        if (closed) {
          close(fds[i].fd);
          fds.erase(fds.begin() + long(i));
        } else {
          ++i;
        }
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) close(fds[i].fd);
  }

  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<uint64_t> bytes_{0};
};

struct Snapshot {
  uint64_t s[TM_STAT_COUNT] = {};
  explicit Snapshot(const tm_client* c) {
    tm_client_stats(c, s, TM_STAT_COUNT);
  }
};

// Runs `call(i)` for i = 0, 1, ... in timed chunks of `chunk` (kChunk by
// default), flushing the thread's events to the sink untimed between chunks
// (see the file comment).
template <typename Call>
void RunChunked(benchmark::State& state, tm_client* c, Call call,
                int chunk = kChunk) {
  // Before the start barrier: no thread has made a timed call yet, and the
  // previous run flushed everything it made.
  if (tm_thread_attach(c) != TM_OK) {
    state.SkipWithError("tm_thread_attach failed");
    return;
  }
  const Snapshot before(c);
  uint64_t i = 0;
  while (state.KeepRunningBatch(chunk)) {
    for (int k = 0; k < chunk; ++k) call(i++);
    state.PauseTiming();
    const int rc = tm_client_flush(c, kFlushTimeoutMs);
    state.ResumeTiming();
    if (rc != TM_OK) state.SkipWithError("tm_client_flush failed");
  }
  // After the stop barrier every thread has made and flushed all its calls.
  if (state.thread_index() != 0 || state.error_occurred()) return;
  const Snapshot after(c);
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
bool WaitConnected(const tm_client* c) {
  for (int i = 0; i < 5000; ++i) {
    if (Snapshot(c).s[TM_STAT_CONNECTED] == 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  SinkServer sink;
  if (!sink.Start()) return 1;

  tm_options* opts = tm_options_new();
  if (opts == nullptr ||
      tm_options_set_socket_path(opts, sink.path().c_str()) != TM_OK ||
      tm_options_set_engine(opts, "bench") != TM_OK ||
      tm_options_set_model(opts, "bench-model") != TM_OK) {
    std::fprintf(stderr, "client_bench: setting options failed\n");
    return 1;
  }
  tm_client* c = nullptr;
  int rc = tm_client_new(opts, &c);
  tm_options_free(opts);
  if (rc != TM_OK) {
    std::fprintf(stderr, "client_bench: tm_client_new: %s\n", tm_strerror(rc));
    return 1;
  }
  if (!WaitConnected(c)) {
    std::fprintf(stderr, "client_bench: client did not connect to the sink\n");
    tm_client_close(c, nullptr, 0);
    return 1;
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
  rc = tm_client_close(c, final_stats, TM_STAT_COUNT);
  sink.Stop();
  if (rc != TM_OK || final_stats[TM_STAT_EVENTS_DROPPED] != 0) {
    std::fprintf(
        stderr, "client_bench: %llu events dropped in total\n",
        static_cast<unsigned long long>(final_stats[TM_STAT_EVENTS_DROPPED]));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tokenmeter::bench

int main(int argc, char** argv) { return tokenmeter::bench::Main(argc, argv); }
