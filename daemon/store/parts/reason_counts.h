// Counts by a reason string the engine chooses (ADMISSION_REJECTED's
// reason, a failed KV_TRANSFER's): at most kMaxReasons distinct reasons,
// kept in the order they first came; the rest are counted under
// "__other__" (metrics-v1.md "Catalog 1.2 additions"). Used by the
// admission and KV-transfer parts.
//
// Memory: at most kMaxReasons strings of at most TM_MAX_LABEL_VALUE_BYTES.
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_REASON_COUNTS_H_
#define TOKENMETER_DAEMON_STORE_PARTS_REASON_COUNTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/store/catalog.h"

namespace tokenmeter::daemon {

class StateReader;
class StateWriter;

class ReasonCounts {
 public:
  static constexpr size_t kMaxReasons = 16;
  static constexpr std::string_view kOther = kOverflowLabelValue;

  // Counts one `reason` (label-value syntax, checked by the decoder);
  // "__other__" itself counts as the overflow. O(kMaxReasons).
  void Add(std::string_view reason);
  bool empty() const { return counts_.empty() && other_ == 0; }
  // Each reason with its count, first-come order, then __other__ if any.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [reason, n] : counts_) f(std::string_view(reason), n);
    if (other_ > 0) f(kOther, other_);
  }
  uint64_t count(std::string_view reason) const;

  void SaveState(StateWriter& w) const;
  void LoadState(StateReader& r);

 private:
  std::vector<std::pair<std::string, uint64_t>> counts_;
  uint64_t other_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_REASON_COUNTS_H_
