// The loop time of a state snapshot (docs/performance.md, "State
// snapshots"): what the daemon does on its loop every --snapshot-interval
// before handing the bytes to libuv's thread pool, i.e. every component's
// SaveState() and the header and checksum (EncodeSnapshot()). The file write
// and fsync run off the loop and are timed apart (snapshot_write).
//
// State: --series engine series (default 100), each with a histogram spread
// and counters, and --requests requests in flight (default 10,000) spread
// over them, each ARRIVED, SCHEDULED and with some tokens, with string ids
// for half. Before timing, the snapshot is loaded into fresh components and
// both expositions compared; the program exits 1 if they differ.
//
// Flags: --series=N --requests=N, then any Google Benchmark flag.
#include <benchmark/benchmark.h>
#include <uv.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/exposition/exposition.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/state/snapshot.h"
#include "daemon/store/registry.h"

namespace {

namespace td = tokenmeter::daemon;

int g_series = 100;
int g_requests = 10'000;

struct State {
  uv_loop_t loop{};
  td::Config config;
  td::SystemClock clock;
  std::unique_ptr<td::Pipeline> pipeline;
  td::Registry* reg = nullptr;
  td::Tracker* tracker = nullptr;
  std::vector<td::EngineSeries*> series;

  State() {
    uv_loop_init(&loop);
    if (!td::Pipeline::Create(
             &loop, clock,
             {config.registry, td::TrackerOptions{}, config.ingest}, &pipeline)
             .ok()) {
      std::abort();
    }
    reg = &pipeline->registry();
    tracker = &pipeline->tracker();
  }
  ~State() {
    pipeline.reset();
    uv_loop_close(&loop);
  }

  void Save(td::StateWriter& w) { pipeline->SaveState(w); }
  bool Load(td::StateReader& r) {
    pipeline->LoadState(r);
    return r.ok() && r.at_end();
  }
};

void Fill(State& st) {
  for (int i = 0; i < g_series; ++i) {
    td::SeriesIdentity id{"vllm", "m", "dp" + std::to_string(i), {}};
    st.series.push_back(st.reg->GetOrCreate(id));
  }
  const uint64_t now = st.clock.NowNs();
  std::vector<std::string> names(static_cast<size_t>(g_requests));
  for (int r = 0; r < g_requests; ++r) {
    td::EngineSeries* s = st.series[size_t(r % g_series)];
    const td::Source src{s, uint64_t(1 + r % g_series)};
    td::Event ev{};
    if (r % 2 == 0) {
      names[size_t(r)] = "chatcmpl-" + std::to_string(r) + "-0123456789abcdef";
      ev.rid.is_string = true;
      ev.rid.text = names[size_t(r)];
    } else {
      ev.rid.number = uint64_t(r);
    }
    const uint64_t t = now - 5'000'000'000 + uint64_t(r) * 1000;
    ev.kind = td::EventKind::kArrived;
    ev.t_ns = t;
    ev.count = 100 + uint64_t(r % 900);
    st.tracker->Apply(src, ev, nullptr, now);
    ev.kind = td::EventKind::kScheduled;
    ev.t_ns = t + 1'000'000;
    st.tracker->Apply(src, ev, nullptr, now);
    for (int k = 0; k < 3; ++k) {
      ev.kind = td::EventKind::kTokens;
      ev.t_ns = t + 2'000'000 + uint64_t(k) * 20'000'000;
      ev.count = 1;
      st.tracker->Apply(src, ev, nullptr, now);
    }
  }
}

std::string Exposition(const State& st) {
  std::string out;
  td::Render(*st.reg, td::ExpositionFormat::kText004, out);
  return out;
}

State* g_state = nullptr;
std::string g_bytes;

void BM_snapshot_encode(benchmark::State& state) {
  const td::SnapshotFingerprint fp = g_state->pipeline->Fingerprint();
  std::string bytes;
  for (auto _ : state) {
    bytes.reserve(g_bytes.size() + g_bytes.size() / 8);
    td::EncodeSnapshot(
        "boot", fp, [](td::StateWriter& w) { g_state->Save(w); }, &bytes);
    benchmark::DoNotOptimize(bytes.data());
  }
  state.counters["bytes"] = double(bytes.size());
}
BENCHMARK(BM_snapshot_encode)->Unit(benchmark::kMillisecond);

// The checksum, off the loop (with the write).
void BM_snapshot_seal(benchmark::State& state) {
  for (auto _ : state) {
    std::string bytes = g_bytes;
    td::SealSnapshot(&bytes);
    benchmark::DoNotOptimize(bytes.data());
  }
}
BENCHMARK(BM_snapshot_seal)->Unit(benchmark::kMillisecond);

void BM_snapshot_write(benchmark::State& state) {
  char dir[] = "/tmp/tm-snapshot-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) std::abort();
  for (auto _ : state) {
    if (!td::WriteFileAtomically(td::StateDir{dir}, "snapshot", g_bytes).ok())
      std::abort();
  }
  std::string path = std::string(dir) + "/snapshot";
  unlink(path.c_str());
  rmdir(dir);
}
BENCHMARK(BM_snapshot_write)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--series=", 9) == 0) {
      g_series = std::atoi(argv[i] + 9);
    } else if (std::strncmp(argv[i], "--requests=", 11) == 0) {
      g_requests = std::atoi(argv[i] + 11);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (g_series < 1 || g_requests < 0) {
    std::fprintf(stderr, "--series >= 1, --requests >= 0\n");
    return 2;
  }
  State st;
  Fill(st);
  g_state = &st;
  if (st.tracker->size() != size_t(g_requests)) {
    std::fprintf(stderr, "tracked %zu requests, expected %d\n",
                 st.tracker->size(), g_requests);
    return 1;
  }
  const td::SnapshotFingerprint fp = st.pipeline->Fingerprint();
  td::EncodeSnapshot(
      "boot", fp, [&st](td::StateWriter& w) { st.Save(w); }, &g_bytes);
  // The round trip: a fresh set of components from the payload (after the
  // 8-byte magic, version, boot id and fingerprint; unsealed).
  {
    State copy;
    td::StateReader r(g_bytes.data(), g_bytes.size());
    r.U64();  // magic
    r.U32();
    r.Str();
    for (int i = 0; i < 3; ++i) r.Str(1 << 20);
    if (!copy.Load(r) || copy.tracker->size() != st.tracker->size() ||
        Exposition(copy) != Exposition(st)) {
      std::fprintf(stderr, "the snapshot does not load back equal\n");
      return 1;
    }
  }
  std::printf("state: %d series, %zu requests in flight, snapshot %zu bytes\n",
              g_series, st.tracker->size(), g_bytes.size());
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
