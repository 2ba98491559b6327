// The requests API's memory (interfaces.md "Requests API and the live
// page's request view"; docs/requests.md): for each engine series, the
// slowest requests (by e2e) and the failed ones (FINISHED with `error` or
// `abort`) of the last 15 minutes, with their whole timelines, at most
// `keep` per series when shown.
//
// A timeline sink (trace/timeline.h), added after the tracer so that the
// trace id it exported under is known. At each retirement the keeper moves
// the timeline it wants out of the tracker's hands (no copy of the token
// ticks); a request retired unfinished (evicted) has no e2e and is not
// kept.
//
// Exact top-`keep` of a sliding window without keeping the whole window: a
// request is forgotten once `keep` requests that finished after it were at
// least as slow (they stay in the window as long as it does, so it can
// never again be among the slowest). What remains per series is about
// keep * (1 + ln(W / keep)) for W requests in the window in random order
// (the records of a random sequence), so 8 * keep + 64 holds a window of
// about 1000 * keep requests (50 000 at the default: 55 a second); past
// MaxCandidates() the fastest is forgotten (counted in capped(); only then
// can the answer differ from the exact one). Failed requests: the newest
// `keep` of the window.
//
// Memory: per series at most MaxCandidates() + keep timelines (514 at the
// default), each at
// most sizeof(RequestTimeline) + its strings + 4096 token ticks of 16
// bytes (about 66 KB for a request of 4096 or more TOKENS events, about
// 1 KB for one of 50); the series are the registry's (bounded by its
// caps). A series without a kept request is forgotten.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_REQUESTS_REQUEST_KEEPER_H_
#define TOKENMETER_DAEMON_REQUESTS_REQUEST_KEEPER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/trace/timeline.h"

namespace tokenmeter::daemon::requests {

struct RequestKeeperOptions {
  // --keep-requests: requests shown per series at most (> 0).
  size_t keep = 50;
  // How far back the window reaches, by FINISHED time.
  uint64_t window_ns = 900'000'000'000;
};

// One kept request.
struct KeptRequest {
  std::unique_ptr<trace::RequestTimeline> timeline;
  uint64_t start_ns = 0;  // the root span's extent (trace::RootExtent)
  uint64_t end_ns = 0;    // FINISHED
  uint64_t e2e_ns = 0;    // end_ns - start_ns
  bool failed = false;    // FINISHED with error or abort
  // Requests kept after this one that were at least as slow.
  uint32_t beaten = 0;
};

// One series' requests as shown: failed ones newest first, then the
// slowest (e2e descending; of equal ones the newer first), at most `keep`
// in all.
struct SeriesRequests {
  const trace::RequestTimeline* first = nullptr;  // its labels and profile
  std::vector<const KeptRequest*> requests;
};

class RequestKeeper final : public trace::TimelineSink {
 public:
  static constexpr size_t kSlowFactor = 8;
  static constexpr size_t kSlowExtra = 64;
  // Slow candidates per series at most.
  size_t MaxCandidates() const {
    return kSlowFactor * options_.keep + kSlowExtra;
  }

  explicit RequestKeeper(RequestKeeperOptions options);

  // trace::TimelineSink: token ticks wanted (the waterfall draws them).
  bool wants_token_ticks() const override { return true; }
  // Keeps a finished request that is failed or may be among the slowest
  // (moving it out of `timeline`). Cost: O(kept requests of its series),
  // a few hundred comparisons at most, and one allocation when kept.
  void OnRetired(trace::RequestTimeline& timeline, bool evicted) override;

  // Forgets what finished before now_ns - window, then returns each
  // series' requests as shown (series in the order of their label
  // values). The pointers are valid until the next OnRetired or Select.
  std::vector<SeriesRequests> Select(uint64_t now_ns);

  const RequestKeeperOptions& options() const { return options_; }
  // Timelines held now, in all series.
  size_t held() const;
  // Candidates forgotten because of the kSlowFactor cap, since start.
  uint64_t capped() const { return capped_; }

 private:
  struct Series {
    std::vector<KeptRequest> slow;    // oldest first
    std::vector<KeptRequest> failed;  // oldest first, at most keep
  };
  void Expire(uint64_t now_ns);

  RequestKeeperOptions options_;
  std::map<std::string, Series> series_;  // by the joined engine labels
  uint64_t capped_ = 0;
};

}  // namespace tokenmeter::daemon::requests

#endif  // TOKENMETER_DAEMON_REQUESTS_REQUEST_KEEPER_H_
