#include "daemon/requests/request_keeper.h"

#include <algorithm>
#include <utility>

#include "daemon/trace/span_builder.h"

namespace tokenmeter::daemon::requests {
namespace {

// The series' key: engine family, profile and label pairs, joined with
// separators no label holds in practice (and that only group, never match
// across).
std::string SeriesKey(const trace::RequestTimeline& t) {
  std::string key = t.engine_family;
  key += '\x1d';
  key += t.profile;
  for (const auto& [name, value] : t.engine_labels) {
    key += '\x1e';
    key += name;
    key += '\x1f';
    key += value;
  }
  return key;
}

bool Failed(const std::string& reason) {
  return reason == "error" || reason == "abort";
}

}  // namespace

RequestKeeper::RequestKeeper(RequestKeeperOptions options) : options_(options) {
  if (options_.keep == 0) options_.keep = 1;
}

void RequestKeeper::OnRetired(trace::RequestTimeline& timeline, bool evicted) {
  if (evicted || timeline.finished_ns == 0) return;
  const trace::RequestExtent extent = trace::RootExtent(timeline);
  if (!extent.valid) return;
  KeptRequest k;
  k.start_ns = extent.start_ns;
  k.end_ns = timeline.finished_ns;
  k.e2e_ns = extent.end_ns - extent.start_ns;
  k.failed = Failed(timeline.finish_reason);
  Series& s = series_[SeriesKey(timeline)];
  const size_t keep = options_.keep;
  if (k.failed) {
    if (s.failed.size() == keep) s.failed.erase(s.failed.begin());
  } else {
    // Those this one beats `keep` times over can never be shown again.
    for (KeptRequest& e : s.slow) {
      if (e.e2e_ns <= k.e2e_ns) ++e.beaten;
    }
    std::erase_if(s.slow,
                  [keep](const KeptRequest& e) { return e.beaten >= keep; });
    if (s.slow.size() == MaxCandidates()) {
      // The cap: forget the fastest (of equal ones, the oldest).
      auto fastest =
          std::min_element(s.slow.begin(), s.slow.end(),
                           [](const KeptRequest& a, const KeptRequest& b) {
                             return a.e2e_ns < b.e2e_ns;
                           });
      ++capped_;
      if (fastest->e2e_ns > k.e2e_ns) return;  // this one is the fastest
      s.slow.erase(fastest);
    }
  }
  timeline.tokens.shrink_to_fit();
  k.timeline = std::make_unique<trace::RequestTimeline>(std::move(timeline));
  (k.failed ? s.failed : s.slow).push_back(std::move(k));
}

void RequestKeeper::Expire(uint64_t now_ns) {
  const uint64_t cutoff =
      now_ns > options_.window_ns ? now_ns - options_.window_ns : 0;
  const auto old = [cutoff](const KeptRequest& e) { return e.end_ns < cutoff; };
  for (auto it = series_.begin(); it != series_.end();) {
    std::erase_if(it->second.slow, old);
    std::erase_if(it->second.failed, old);
    if (it->second.slow.empty() && it->second.failed.empty()) {
      it = series_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<SeriesRequests> RequestKeeper::Select(uint64_t now_ns) {
  Expire(now_ns);
  std::vector<SeriesRequests> out;
  out.reserve(series_.size());
  for (const auto& [key, s] : series_) {
    SeriesRequests r;
    for (auto it = s.failed.rbegin();
         it != s.failed.rend() && r.requests.size() < options_.keep; ++it) {
      r.requests.push_back(&*it);
    }
    // Newest first, then a stable sort: of equal ones the newer first.
    std::vector<const KeptRequest*> slow;
    slow.reserve(s.slow.size());
    for (auto it = s.slow.rbegin(); it != s.slow.rend(); ++it) {
      slow.push_back(&*it);
    }
    std::stable_sort(slow.begin(), slow.end(),
                     [](const KeptRequest* a, const KeptRequest* b) {
                       return a->e2e_ns > b->e2e_ns;
                     });
    for (size_t i = 0; i < slow.size() && r.requests.size() < options_.keep;
         ++i) {
      r.requests.push_back(slow[i]);
    }
    r.first = r.requests.front()->timeline.get();
    out.push_back(std::move(r));
  }
  return out;
}

size_t RequestKeeper::held() const {
  size_t n = 0;
  for (const auto& [key, s] : series_) n += s.slow.size() + s.failed.size();
  return n;
}

}  // namespace tokenmeter::daemon::requests
