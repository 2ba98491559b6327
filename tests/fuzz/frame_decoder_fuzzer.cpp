// libFuzzer target: arbitrary bytes through one connection's FrameDecoder
// into a shared Tracker and Registry, as IngestServer wires them.
//
// The first input byte picks where the stream is split (the decoder must
// give the same result however the bytes arrive); the first part goes
// through Prepare/Commit in small reads, the rest through Feed in one go.
// State (registry, tracker, a fake clock) persists across inputs so that
// the tracker's maps, eviction and the series cap are exercised too; every
// 256 inputs the registry is rendered in both formats and the tracker
// swept.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/exposition/exposition.h"
#include "daemon/ingest/frame_decoder.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/tracker.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {
namespace {

class FakeClock : public Clock {
 public:
  uint64_t NowNs() const override { return now_ns; }
  uint64_t now_ns = uint64_t{3} * 3600 * 1'000'000'000;  // 3 h after boot
};

struct State {
  State() {
    RegistryOptions options;
    options.max_engine_series = 64;
    // Per-request labels on, with a small cap, so that the label cells,
    // __other__ and the LoRA sets are reached.
    options.request_labels = {"tenant", "team"};
    options.request_label_values = 4;
    options.legacy_names = true;
    options.moe_expert_series = true;
    TrackerOptions t;
    t.max_requests = 4096;
    if (!Pipeline::Create(nullptr, clock, {options, t, IngestOptions{}},
                          &pipeline)
             .ok()) {
      __builtin_trap();
    }
    registry = &pipeline->registry();
    stats = &pipeline->stats();
    tracker = &pipeline->tracker();
  }
  FakeClock clock;
  std::unique_ptr<Pipeline> pipeline;
  Registry* registry = nullptr;
  IngestStats* stats = nullptr;
  Tracker* tracker = nullptr;
  uint64_t inputs = 0;
  uint64_t next_space = 1;
};

State& GetState() {
  static State* state = new State;
  return *state;
}

class Sink : public FrameSink {
 public:
  explicit Sink(State& state) : state_(state) {}
  void OnHello(const Hello& hello) override {
    if (hello_seen_) __builtin_trap();  // the decoder must refuse a second
    hello_seen_ = true;
    // As IngestServer: the HELLO's profile, else auto.
    const Profile profile = hello.profile.empty()
                                ? AutoProfile(hello.engine)
                                : *ParseProfile(hello.profile);
    SeriesIdentity id{ProfileNamespace(profile, hello.engine, ""), hello.model,
                      hello.instance, hello.labels, profile};
    EngineSeries* series = state_.registry->GetOrCreate(id);
    if (series == nullptr) return;  // cap, or another profile's namespace
    if (hello.has_cache_config) {
      series->part<CacheConfigPart>().Set(hello.cache_config);
    }
    if (hello.has_max_lora) series->part<LoraPart>().SetMaxLora(hello.max_lora);
    source_ = Source{series, state_.next_space++ % 8};
  }
  void OnBatch(const Batch& batch) override {
    if (!hello_seen_) __builtin_trap();  // BATCH before HELLO must fail
    if (source_.series != nullptr) state_.tracker->ApplyBatch(source_, batch);
  }
  void OnGoodbye() override {
    if (!hello_seen_) __builtin_trap();
  }
  void OnEventError(IngestError error) override {
    if (!IsEventLevel(error)) __builtin_trap();
  }

 private:
  State& state_;
  bool hello_seen_ = false;
  Source source_{nullptr, 0};
};

}  // namespace
}  // namespace tokenmeter::daemon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokenmeter::daemon;
  if (size < 2) return 0;
  State& state = GetState();
  const uint8_t control = data[0];
  ++data;
  --size;
  DecoderLimits limits;
  // Small limits half of the time, so that the limit paths are reached
  // with small inputs.
  if (control & 0x80) {
    limits.max_frame_bytes = 1024;
    limits.max_batch_events = 16;
    limits.max_string_bytes = 32;
    limits.max_rid_bytes = 8;
    limits.max_depth = 6;
    limits.max_spec_positions = 4;
    limits.max_hello_labels = 2;
  }
  FrameDecoder decoder(limits);
  Sink sink(state);
  const size_t split = size * (control & 0x7f) / 127;
  const size_t read_size = 1 + (control & 0x0f);
  size_t pos = 0;
  bool ok = true;
  while (ok && pos < split) {
    std::span<char> buf = decoder.Prepare(read_size);
    if (buf.empty()) __builtin_trap();  // empty only after a failure
    const size_t n = std::min({buf.size(), read_size, split - pos});
    std::memcpy(buf.data(), data + pos, n);
    ok = decoder.Commit(n, sink);
    pos += n;
  }
  if (ok && pos < size) ok = decoder.Feed(data + pos, size - pos, sink);
  if (ok == decoder.failed()) __builtin_trap();
  if (!ok && IsEventLevel(decoder.error())) __builtin_trap();
  if (!ok && decoder.Feed("\x90", 1, sink)) __builtin_trap();  // stays dead

  state.clock.now_ns += 1'000'000;  // 1 ms per input
  if (++state.inputs % 256 == 0) {
    state.tracker->Sweep();
    std::string out;
    Render(*state.registry, ExpositionFormat::kText004, out);
    out.clear();
    Render(*state.registry, ExpositionFormat::kOpenMetrics100, out);
  }
  return 0;
}
