// Observe() cost of the native histogram (daemon/store/native_histogram.h)
// at schema 3 beside the classic Histogram::Observe() on vLLM's TTFT bounds
// (catalog DefaultBuckets(BucketSet::kTtft)), on the same TTFT-like values:
// log-uniform in 5 ms .. 5 s. Goal: a few ns per observation. Prints ns per
// observation (the "Time" column; items_per_second is its inverse).
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/histogram.h"
#include "daemon/store/native_histogram.h"

namespace {

namespace td = tokenmeter::daemon;

// 4096 values (a power of two: the index wraps with a mask).
const std::vector<double>& Values() {
  static const std::vector<double> values = [] {
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<double> logv(std::log(0.005), std::log(5.0));
    std::vector<double> v(4096);
    for (double& x : v) x = std::exp(logv(rng));
    return v;
  }();
  return values;
}

void BM_NativeObserveSchema3(benchmark::State& state) {
  const std::vector<double>& values = Values();
  td::NativeHistogram h(3);
  size_t i = 0;
  for (auto _ : state) {
    h.Observe(values[i++ & 4095]);
  }
  benchmark::DoNotOptimize(h.zero_count());
  state.SetItemsProcessed(int64_t(state.iterations()));
  state.counters["populated"] = double(h.populated());
}
BENCHMARK(BM_NativeObserveSchema3);

void BM_ClassicObserveTtft(benchmark::State& state) {
  const std::vector<double>& values = Values();
  // Raw nanoseconds, as the daemon observes (divisor 1e9).
  std::vector<double> raw(values.size());
  for (size_t k = 0; k < values.size(); ++k) raw[k] = values[k] * 1e9;
  const td::HistogramLayout layout(
      td::DefaultBuckets(td::BucketSet::kTtft, 2048), 1e9);
  td::Histogram h(&layout);
  size_t i = 0;
  for (auto _ : state) {
    h.Observe(raw[i++ & 4095]);
  }
  benchmark::DoNotOptimize(h.count());
  state.SetItemsProcessed(int64_t(state.iterations()));
}
BENCHMARK(BM_ClassicObserveTtft);

}  // namespace

BENCHMARK_MAIN();
