#include "daemon/store/parts/reason_counts.h"

#include "daemon/base/state_io.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {
namespace {

void SaturatingInc(uint64_t& n) {
  if (n != UINT64_MAX) ++n;
}

}  // namespace

void ReasonCounts::Add(std::string_view reason) {
  // An engine's own "__other__" is the overflow's: one sample, never two
  // with the same label value.
  if (reason == kOther) {
    SaturatingInc(other_);
    return;
  }
  for (auto& [r, n] : counts_) {
    if (r == reason) {
      SaturatingInc(n);
      return;
    }
  }
  if (counts_.size() < kMaxReasons) {
    counts_.emplace_back(std::string(reason), 1);
  } else {
    SaturatingInc(other_);
  }
}

uint64_t ReasonCounts::count(std::string_view reason) const {
  if (reason == kOther) return other_;
  for (const auto& [r, n] : counts_) {
    if (r == reason) return n;
  }
  return 0;
}

void ReasonCounts::SaveState(StateWriter& w) const {
  w.U64(counts_.size());
  for (const auto& [reason, n] : counts_) {
    w.Str(reason);
    w.U64(n);
  }
  w.U64(other_);
}

void ReasonCounts::LoadState(StateReader& r) {
  counts_.resize(r.Count(kMaxReasons, 12));
  for (auto& [reason, n] : counts_) {
    reason = r.Str(TM_MAX_LABEL_VALUE_BYTES);
    n = r.U64();
    if (!tm_proto_valid_label_value(reason.data(), reason.size())) r.Fail();
  }
  other_ = r.U64();
  // A snapshot from before Add() folded "__other__" may hold it as a
  // reason: folded here the same way.
  for (auto it = counts_.begin(); it != counts_.end(); ++it) {
    if (it->first == kOther) {
      other_ =
          it->second > UINT64_MAX - other_ ? UINT64_MAX : other_ + it->second;
      counts_.erase(it);
      break;
    }
  }
}

}  // namespace tokenmeter::daemon
