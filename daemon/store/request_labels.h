// Per-request labels (metrics-v1.md "Per-request labels"): the label names
// of --request-label, the values seen so far, interned to small ids, and
// the LoRA adapter names of ARRIVED params, interned the same way. Owns
// tokenmeter_request_label_overflow_total while request labels are on.
//
// Memory: at most kMaxValues values per label and kMaxLoras adapter names,
// each at most 128 bytes (protocol.h), and kMaxSets combinations of them
// (about 60 bytes each). Nothing is forgotten while the daemon runs.
// Single-threaded (the daemon's loop).
#ifndef TOKENMETER_DAEMON_STORE_REQUEST_LABELS_H_
#define TOKENMETER_DAEMON_STORE_REQUEST_LABELS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/metric_writer.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

class StateReader;
class StateWriter;

class RequestLabels : public Collector {
 public:
  // The label absent: "" (for --priority-label's label "0", the bucket of
  // a request without a priority, ARRIVED's or none).
  static constexpr uint16_t kEmpty = 0;
  static constexpr uint16_t kOther = 1;  // "__other__"
  static constexpr std::string_view kOtherValue = kOverflowLabelValue;
  static constexpr size_t kMaxValues = 65535;
  static constexpr size_t kMaxLoras = 65535;  // id 0 is "no adapter"

  // names: at most TM_MAX_REQUEST_LABELS valid, distinct label names
  // (Config checks them); max_values: --request-label-values;
  // last_is_priority: the last name is --priority-label's, whose absent
  // value (kEmpty) is "0".
  RequestLabels(std::vector<std::string> names, size_t max_values,
                bool last_is_priority = false);

  const std::vector<std::string>& names() const { return names_; }
  size_t max_values() const { return max_values_; }
  // Whether label `label`'s values per engine series are held to
  // max_values(): all but --priority-label's, whose values are its five
  // buckets (metrics-v1.md), never __other__.
  bool capped(size_t label) const {
    return !(last_is_priority_ && label + 1 == names_.size());
  }
  bool enabled() const { return !names_.empty(); }

  // The id of `value` of label `label`, if it has one ("" and the absent
  // value are kEmpty, "__other__" is kOther).
  std::optional<uint16_t> Find(size_t label, std::string_view value) const;
  // Gives `value` an id (the next free one); kEmpty and kOther as Find(),
  // and kOther when the table is full.
  uint16_t Intern(size_t label, std::string_view value);
  std::string_view Value(size_t label, uint16_t id) const {
    return values_[label][id];
  }
  // Ids given so far to label `label`'s values (kEmpty and kOther
  // included), and to adapters (0 included).
  size_t value_count(size_t label) const { return values_[label].size(); }
  size_t lora_count() const { return loras_.size(); }

  static uint16_t Unpack(uint64_t key, size_t label) {
    return uint16_t(key >> (16 * label));
  }
  static uint64_t Pack(uint64_t key, size_t label, uint16_t id) {
    const unsigned shift = unsigned(16 * label);
    return (key & ~(uint64_t{0xffff} << shift)) | (uint64_t{id} << shift);
  }

  // A request whose value of `label` became __other__.
  void CountOverflow(size_t label) { ++overflow_[label]; }
  uint64_t overflow(size_t label) const { return overflow_[label]; }

  // LoRA adapters: 0 for an empty name, else the adapter's id; 0 too once
  // kMaxLoras names are known (such a request is in no adapter set).
  uint16_t InternLora(std::string_view name);
  std::string_view LoraName(uint16_t id) const { return loras_[id]; }

  // A request's label values and adapter as one id, so that a tracked
  // request keeps 4 bytes for them: 0 for (0, 0); the same id for the same
  // pair. Past kMaxSets pairs (about 64 MiB of table) a new one gets 0 (no
  // labels, no adapter).
  static constexpr size_t kMaxSets = size_t{1} << 20;
  uint32_t InternSet(uint64_t key, uint16_t lora);
  uint64_t SetKey(uint32_t id) const { return sets_[id].key; }
  uint16_t SetLora(uint32_t id) const { return sets_[id].lora; }
  size_t set_count() const { return sets_.size(); }  // (0, 0) included

  void Collect(DaemonMetric id, MetricWriter& w) const override;

  // Snapshots (daemon/base/state_io.h): the interned values, adapters and
  // sets and the overflow counts; the names and the cap are configuration
  // (the snapshot's fingerprint). LoadState() fills a fresh table.
  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  struct Set {
    uint64_t key;
    uint16_t lora;
    bool operator==(const Set&) const = default;
  };
  struct SetHash {
    size_t operator()(const Set& s) const noexcept {
      return std::hash<uint64_t>()(s.key * 0x9e3779b97f4a7c15ull ^ s.lora);
    }
  };
  std::vector<Set> sets_{{0, 0}};
  std::unordered_map<Set, uint32_t, SetHash> set_ids_;
  // kEmpty for "" and the absent value, kOther for "__other__": the ids
  // no value is interned for. O(length).
  std::optional<uint16_t> FixedId(size_t label, std::string_view value) const {
    if (value.empty() || value == values_[label][kEmpty]) return kEmpty;
    if (value == kOtherValue) return kOther;
    return std::nullopt;
  }

  const std::vector<std::string> names_;
  const size_t max_values_;
  const bool last_is_priority_;
  std::vector<std::vector<std::string>> values_;  // [label][id]
  std::vector<std::unordered_map<std::string, uint16_t>> ids_;
  std::vector<uint64_t> overflow_;
  std::vector<std::string> loras_;  // [id], [0] = ""
  std::unordered_map<std::string, uint16_t> lora_ids_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_REQUEST_LABELS_H_
