// The live page's costs (docs/performance.md, "Live page"):
//
// * live_tick: History::Tick(), the loop time the history takes every
//   second whether or not anybody looks, per engine series (the
//   "us_per_series" counter; goal <= 1 us). Each series' rings are full (900
//   points: the steady state, where the oldest point is dropped) and each
//   second brings new TTFT, ITL and e2e observations spread over the
//   buckets, so that every quantile is computed and formatted. Only Tick()
//   is timed, in this thread's CPU time (manual time; the clock is read
//   around each Tick() of 50 or 64 series: a call of well under a
//   microsecond against tens of them), not the observations.
// * live_json: RenderJson() for 50 series (Arg) with full rings of busy
//   values, into a string reused as the HTTP handler's body would be
//   (goal <= 1 ms); the document's size is the "bytes" counter.
#include <benchmark/benchmark.h>
#include <time.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/live/history.h"
#include "daemon/live/live_json.h"
#include "daemon/store/registry.h"

namespace {

namespace td = tokenmeter::daemon;
namespace live = tokenmeter::daemon::live;

constexpr uint64_t kSec = 1'000'000'000;

// This thread's CPU time: on a shared machine the wall clock around one
// Tick() also counts the time other processes ran.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

struct Fixture {
  std::unique_ptr<td::Registry> reg;
  std::vector<td::EngineSeries*> series;
  live::History history;
  std::mt19937_64 rng{42};
  uint64_t tick = 0;

  explicit Fixture(int n) {
    if (!td::Registry::Create(td::RegistryOptions{}, &reg).ok()) std::abort();
    for (int i = 0; i < n; ++i) {
      series.push_back(reg->GetOrCreate(
          {"vllm", "model", "dp" + std::to_string(i), {{"team", "a"}}}));
    }
    history.Start(*reg, 0);
  }

  // One second of traffic on every series: a few requests' TTFT and e2e,
  // a batch's ITLs, tokens, gauges.
  void Traffic() {
    for (td::EngineSeries* s : series) {
      for (int j = 0; j < 4; ++j) {
        s->hist(td::kTimeToFirstToken).Observe(double(rng() % 800'000'000));
        s->hist(td::kE2eRequestLatency).Observe(double(rng() % 9'000'000'000));
      }
      for (int j = 0; j < 32; ++j) {
        s->hist(td::kInterTokenLatency).Observe(double(rng() % 60'000'000));
      }
      s->Add(td::kPromptTokens, 2000 + rng() % 1000);
      s->Add(td::kGenerationTokens, 900 + rng() % 300);
      s->Set(td::kKvCacheUsagePerc, double(rng() % 10'000) / 9'999);
      s->AddDerived(td::kNumRequestsRunning, int64_t(rng() % 3) - 1);
    }
  }

  void Tick() {
    ++tick;
    history.Tick(*reg, tick * kSec, int64_t(1'800'000'000 + tick));
  }

  // Fills every ring (and a bit more: the steady state drops points).
  void Fill() {
    for (size_t i = 0; i < live::kPoints + 10; ++i) {
      Traffic();
      Tick();
    }
  }
};

void BM_LiveTick(benchmark::State& state) {
  Fixture f(int(state.range(0)));
  f.Fill();
  for (auto _ : state) {
    f.Traffic();
    const double start = ThreadCpuSeconds();
    f.Tick();
    state.SetIterationTime(ThreadCpuSeconds() - start);
  }
  state.counters["us_per_series"] = benchmark::Counter(
      double(state.iterations()) * double(state.range(0)) / 1e6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_LiveTick)
    ->Arg(50)
    ->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_LiveJson(benchmark::State& state) {
  Fixture f(int(state.range(0)));
  f.Fill();
  std::string body;
  for (auto _ : state) {
    body.clear();
    live::RenderJson(*f.reg, f.history, body);
    benchmark::DoNotOptimize(body.data());
  }
  state.counters["bytes"] = double(body.size());
}
BENCHMARK(BM_LiveJson)->Arg(1)->Arg(50)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
