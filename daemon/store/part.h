// Engine-family parts: the per-series state of one feature (the HELLO
// cache_config, the LoRA sets, MoE expert load, LMDeploy's per-chunk token
// memo), each a room of its own under store/parts/: its state, its observe
// API (called by whoever observes the feature: the tracker, the ingest
// server at HELLO), whether each of its families is shown, how it writes
// them, and its snapshot.
//
// An EngineSeries holds one pointer per part kind (PartSet), the part made
// on first use, so a series that never sends EXPERT_LOAD pays one null
// pointer for MoE. The profile tables (profile.cpp) say which families
// come from which part (FamilySource::kPart, FamilyDef::part and
// part_family); Render() asks the part. Only store/parts/parts.cpp (the
// factory) and the observers include the parts' own headers; the rest of
// the store knows this interface. docs/architecture.md, "Adding a part",
// lists the files a new part touches.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PART_H_
#define TOKENMETER_DAEMON_STORE_PART_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tokenmeter::daemon {

class EngineSeries;
class MetricWriter;
class StateReader;
class StateWriter;
struct FamilyDef;
struct RegistryOptions;

// The kinds, in snapshot order (a snapshot names a part by this number:
// append, never renumber). kNone: no part (FamilyDef::part's default).
enum class PartKind : uint8_t {
  kLora,
  kCacheConfig,
  kMoe,
  kChunkTokens,
  // Protocol 1.2.
  kAdmission,
  kWaitingReason,
  kKvTransfer,
  kSleep,
  kNone,
};
inline constexpr size_t kNumPartKinds = size_t(PartKind::kNone);

// The families parts write (FamilyDef::part_family): the part of
// FamilyDef::part says what each of its own means.
enum class PartFamily : uint8_t {
  kNone,
  kCacheConfigInfo,    // 1, labelled with the HELLO cache_config entries
  kCacheConfigValue,   // the number of the cache_config entry FamilyDef::key
  kLoraRequestsInfo,   // Unix time of the last change of the LoRA sets
  kMoeRoutedTokens,    // per layer: the sum of its EXPERT_LOAD counts
  kMoeExpertTokens,    // per layer and expert (--moe-expert-series)
  kMoeLayerImbalance,  // per layer: max / mean of its latest non-zero load
  // Protocol 1.2.
  kAdmissionRejections,    // per reason: ADMISSION_REJECTED events
  kWaitingByReason,        // capacity and deferred: STEP waiting_deferred
  kKvTransferTime,         // histogram per role: KV_TRANSFER t - start
  kKvTransferBytes,        // histogram per role: KV_TRANSFER bytes
  kKvTransferFailures,     // per role and reason: KV_TRANSFER ok false
  kKvTransferFailedTotal,  // all failed KV_TRANSFERs (SGLang's)
  kKvTransferTimeouts,     // failed ones by SGLang's stage (kTimeoutStages)
  kSleepState,             // vLLM's legacy engine_sleep_state
  kSleepResourceState,     // 1 for each resource's current state
  kFullyAwake,             // 1 when nothing sleeps
};

class Part {
 public:
  virtual ~Part() = default;
  virtual PartKind kind() const = 0;
  // Whether family `f` (whose FamilyDef::part is this part's kind) has a
  // sample in this series under the registry's options `o`. O(1) or
  // O(entries of the part).
  virtual bool Shows(const FamilyDef& f, const RegistryOptions& o) const = 0;
  // Writes the samples of `f` for the series `s` that holds this part.
  virtual void Write(const FamilyDef& f, const EngineSeries& s,
                     MetricWriter& w) const = 0;
  // Snapshots (daemon/base/state_io.h): the part's whole state.
  // LoadState() fills a part just made for the same series; a value out of
  // range fails the reader.
  virtual void SaveState(StateWriter& w) const = 0;
  virtual void LoadState(StateReader& r) = 0;
};

// One series' parts, one slot per kind; owns them.
class PartSet {
 public:
  Part* get(PartKind k) const {
    return k < PartKind::kNone ? slots_[size_t(k)].get() : nullptr;
  }
  // Puts `p` in its kind's slot (replacing what was there).
  void Put(std::unique_ptr<Part> p) {
    const size_t k = size_t(p->kind());
    slots_[k] = std::move(p);
  }
  void Remove(PartKind k) { slots_[size_t(k)].reset(); }
  size_t size() const {
    size_t n = 0;
    for (const auto& s : slots_) n += s != nullptr;
    return n;
  }
  // Every part, in kind order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& s : slots_) {
      if (s != nullptr) f(*s);
    }
  }

 private:
  std::array<std::unique_ptr<Part>, kNumPartKinds> slots_;
};

// The part of kind `k` for series `s`, as a snapshot holds it: made empty,
// to be filled by LoadState(). Defined in store/parts/parts.cpp.
std::unique_ptr<Part> MakePart(PartKind k, EngineSeries& s);
// The parts every series has from its creation (the LoRA sets, whose
// family shows every series); called by EngineSeries' constructor.
void MakeEveryPart(EngineSeries& s);
// Snapshot formats 1 and 2 kept cache_config, max_lora, the MoE layers and
// the LoRA sets in fields of the series, in that order after its admitted
// values: reads them into the parts of `s`.
void LoadLegacyParts(StateReader& r, EngineSeries& s);
// The MoE layers of `s` and their experts (0 and 0 without the part).
// O(layers).
struct MoeSize {
  size_t layers = 0;
  size_t experts = 0;
};
MoeSize MoePartSize(const EngineSeries& s);
// After a snapshot load: makes the MoE part of `s` (if any) keep
// per-expert counts iff `per_expert` (--moe-expert-series; counts the
// snapshot lacks start at 0, ones it had are dropped without the flag).
// O(layers + experts).
void FitMoePart(EngineSeries& s, bool per_expert);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PART_H_
