// Windows over engine series: what each series' counters (and, when asked,
// its latency histograms' buckets) gained since the previous window. One
// helper for every periodic reader of the store: the summary line and the
// window gauges (a window of --log-interval) and the live page's history
// (one second) each keep an instance, and a restart from a snapshot marks
// them all where the restored totals stand (Restart()), so that no window
// takes the totals for one window's increase.
//
// Request-level counters (prompt and generation tokens) are summed over
// the series' label cells: a window is per series, whatever per-request
// labels split it into.
//
// Memory: per series seen, the counters (72 bytes) and, with latencies,
// the bucket counts of three histograms. Series live as long as the
// daemon, so their addresses are stable keys; bounded by the registry's
// series cap. Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_SERIES_WINDOWS_H_
#define TOKENMETER_DAEMON_STORE_SERIES_WINDOWS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "daemon/store/catalog.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

// The counters a window is measured over.
struct WindowCounters {
  uint64_t prompt_tokens = 0;      // summed over label cells
  uint64_t generation_tokens = 0;  // summed over label cells
  // Of prompt_tokens, those found cached or received (SCHEDULED info:
  // prompt_tokens_cached), summed over label cells.
  uint64_t prompt_tokens_cached = 0;
  uint64_t preemptions = 0;
  uint64_t prefix_queries = 0;
  uint64_t prefix_hits = 0;
  uint64_t spec_drafts = 0;
  uint64_t spec_draft_tokens = 0;
  uint64_t spec_accepted_tokens = 0;
  // The totals of `s` now. O(label cells).
  static WindowCounters Of(const EngineSeries& s);

  // The window figures SGLang computes the same way (its gen_throughput
  // aside), shared by the window gauges and the summary line; 0 where the
  // window had nothing to divide by. Prefix hits / prefix queries.
  double CacheHitRate() const;
  // 1 + accepted tokens / drafts: the accepted tokens of one draft round
  // with the bonus token.
  double SpecAcceptLength() const;
  // Accepted tokens / draft tokens.
  double SpecAcceptRate() const;
};

// A counter of `s` summed over its label cells (request-level counters are
// split by per-request labels); for a counter with an own label, child `i`
// (0 where the child was never added). O(label cells).
uint64_t CellSum(const EngineSeries& s, EngineMetric m);
uint64_t CellChildSum(const EngineSeries& s, EngineMetric m, size_t i);

// The latency histograms a window can follow: TTFT, the inter-token
// latency the series' profile shows (SGLang's is token-weighted), e2e.
inline constexpr size_t kNumWindowLatencies = 3;
EngineMetric WindowLatency(const EngineSeries& s, size_t i);

class SeriesWindows {
 public:
  // With `latencies`, Advance() also reports the per-bucket increase of
  // the kNumWindowLatencies histograms, summed over label cells.
  explicit SeriesWindows(bool latencies = false) : latencies_(latencies) {}

  struct Window {
    WindowCounters increase;
    // With latencies: each histogram's per-bucket increase (bounds().size()
    // + 1 entries) and their sum. Valid until the next Advance().
    std::array<const std::vector<uint64_t>*, kNumWindowLatencies> buckets{};
    std::array<uint64_t, kNumWindowLatencies> observations{};
  };
  // Where the next window of one series starts.
  struct Marks {
    WindowCounters counters;
    std::array<std::vector<uint64_t>, kNumWindowLatencies> buckets;
  };

  // What `s` gained since the previous Advance(s), or since it was marked
  // (Mark(), Restart()), or since it was created; moves its mark to now.
  // A counter below its mark (never, but a restore could) counts as no
  // increase. O(label cells), and O(buckets x cells) with latencies.
  const Window& Advance(const EngineSeries& s) {
    return Advance(s, MarksOf(s));
  }
  // Marks `s` at its present totals: its next window starts now.
  void Mark(const EngineSeries& s) { Mark(s, MarksOf(s)); }
  // The same with marks the caller keeps for `s` (one lookup fewer for a
  // reader that holds per-series state anyway: the live history). `m`
  // starts value-initialized (the series' creation) or from Mark().
  const Window& Advance(const EngineSeries& s, Marks& m);
  void Mark(const EngineSeries& s, Marks& m);
  // Marks every series of `registry` (after a snapshot was loaded).
  // O(series x cells).
  void Restart(const Registry& registry);

  // Bytes kept for `s` (0 when never seen), for the live page's bound.
  size_t BytesHeld(const EngineSeries& s) const;
  static size_t BytesHeld(const Marks& m);
  size_t series() const { return marks_.size(); }

 private:
  Marks& MarksOf(const EngineSeries& s);
  // The summed bucket counts of histogram m of `s` into *out.
  static void SumBuckets(const EngineSeries& s, EngineMetric m,
                         std::vector<uint64_t>* out);

  const bool latencies_;
  std::unordered_map<const EngineSeries*, Marks> marks_;
  Window window_;
  std::array<std::vector<uint64_t>, kNumWindowLatencies> increase_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_SERIES_WINDOWS_H_
