// The live page's history (issue 19): for every engine series, one point a
// second over the last 15 minutes of what the page at `/` charts and
// `/api/v1/live` serves: running and waiting requests, KV-cache usage,
// prompt / generation tokens per second, preemptions per second, the
// prefix-cache hit rate (hits / queries of the second), the
// p50 and p99 of TTFT, ITL and e2e latency among the observations of that
// second, and (protocol 1.2, null for a series without them) admission
// rejections per second and the waiting requests by reason.
//
// Quantiles come from the classic histograms' bucket deltas over the second
// (BucketQuantile(), Prometheus' histogram_quantile() rule), so they are as
// exact as the buckets: the true value lies in the same bucket as the
// answer, which interpolates linearly inside it.
//
// Each point is kept as JSON text (TextRing) formatted once, at the tick, so
// that rendering /api/v1/live copies spans and formats nothing.
//
// Memory: at most kMaxSeries series get a history (the first ones seen);
// each holds kNumLiveKeys + 1 text rings of at most kPoints entries of at
// most kMaxEntryBytes bytes, plus its histograms' previous bucket counts.
// MaxBytesPerSeries() is the bound (about 660 KB); a series of busy values
// (every latency with six digits) holds about 165 KB once its rings are
// full (docs/operations.md, "Live page").
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_LIVE_HISTORY_H_
#define TOKENMETER_DAEMON_LIVE_HISTORY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daemon/store/registry.h"
#include "daemon/store/series_windows.h"

namespace tokenmeter::daemon::live {

// The values of a point, in JSON order (docs/operations.md names them).
enum LiveKey : uint8_t {
  kRunning,
  kWaiting,
  kKvUsage,
  kPromptTokensPerS,
  kGenerationTokensPerS,
  kPreemptionsPerS,
  kPrefixCacheHitRate,
  kTtftP50,
  kTtftP99,
  kItlP50,
  kItlP99,
  kE2eP50,
  kE2eP99,
  kAdmissionRejectionsPerS,  // null until the series' first rejection
  kWaitingCapacity,          // null until its first STEP waiting_deferred
  kWaitingDeferred,          // likewise
  kNumLiveKeys,
};
inline constexpr std::string_view kLiveKeyNames[kNumLiveKeys] = {
    "running",
    "waiting",
    "kv_usage",
    "prompt_tokens_per_s",
    "generation_tokens_per_s",
    "preemptions_per_s",
    "prefix_cache_hit_rate",
    "ttft_p50_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "admission_rejections_per_s",
    "waiting_capacity",
    "waiting_deferred"};

inline constexpr size_t kPoints = 900;        // 15 minutes at 1 s
inline constexpr size_t kMaxSeries = 64;      // series with a history
inline constexpr size_t kMaxEntryBytes = 16;  // one number's text, at most

// The q-quantile (0 < q < 1) of the observations whose per-bucket counts
// are `counts` (bounds.size() + 1 entries, the last the +Inf bucket) under
// the finite upper bounds `bounds`, as Prometheus' histogram_quantile()
// computes it: the bucket holding rank q * total, linear interpolation
// between its lower bound (0 for the first bucket, unless its bound is <= 0:
// then that bound) and its upper bound; the highest finite bound when the
// rank falls in +Inf. NaN when the counts sum to 0. O(buckets).
double BucketQuantile(double q, const std::vector<double>& bounds,
                      const uint64_t* counts);

// Appends `v` as a JSON number of at most kMaxEntryBytes bytes: integers as
// such, other finite values with at most `decimals` (0..9) decimals,
// trailing zeros dropped ("0.0125", "3"); magnitudes of 1e12 and more in
// exponent form with 6 significant digits; NaN and infinities as "null".
// Independent of the C locale.
void AppendJsonNumber(std::string& out, double v, int decimals);

// Up to kPoints entries of text, oldest first, kept as one comma-joined
// string so that the whole ring is one span. Push() drops the oldest entry
// when full; the dropped text is reclaimed by moving the rest down once it
// exceeds a quarter of what is kept, so the string holds at most 1.25 times
// the live text plus 256 bytes (amortised O(1) per Push()).
class TextRing {
 public:
  // `entry`: a JSON number or null (AppendJsonNumber()), so no comma; more
  // than kMaxEntryBytes bytes is a broken invariant (abort).
  void Push(std::string_view entry);
  // The entries joined by ",", oldest first ("" when empty).
  std::string_view Joined() const;
  // The newest entry ("" when empty).
  std::string_view Last() const;
  size_t size() const { return count_; }
  // Bytes held (the string's capacity), for the memory bound's test.
  size_t capacity() const { return text_.capacity(); }

 private:
  std::string text_;  // entries, each followed by ','; live from begin_
  size_t begin_ = 0;
  std::array<uint8_t, kPoints> len_{};  // entry lengths with the comma
  size_t head_ = 0;                     // index of the oldest in len_
  size_t count_ = 0;
};

class History {
 public:
  History();
  History(const History&) = delete;
  History& operator=(const History&) = delete;
  ~History();

  // Starts the clock at `now_ns` (CLOCK_MONOTONIC) and takes the series
  // that exist now (restored from a snapshot) at their present totals, so
  // that their first point holds one second's increase, not the totals.
  // Call once, before the first Tick(). O(series).
  void Start(const Registry& registry, uint64_t now_ns);

  // Adds one point to every followed series: the gauges now, the counters'
  // and histograms' increase (admission rejections: the admission part's
  // total) since the previous Tick() (or since Start(), or since the
  // series was created) per second of `now_ns` minus the
  // previous tick's time, at the wall-clock second `unix_s` (points of one
  // series are strictly increasing in time: a `unix_s` not after the
  // previous one becomes that plus 1). A new series is followed while
  // fewer than kMaxSeries are. O(series * buckets); no allocation for a
  // series already followed once its rings are full.
  void Tick(const Registry& registry, uint64_t now_ns, int64_t unix_s);

  // One followed series' history.
  struct Series {
    std::array<TextRing, kNumLiveKeys> values;
    TextRing t;  // unix seconds
    // The newest point's values (NaN for null): what values[k].Last() says.
    std::array<double, kNumLiveKeys> last{};
  };
  // The history of `s`, or nullptr when it is not followed (the cap).
  const Series* Find(const EngineSeries& s) const;
  size_t followed() const { return states_.size(); }
  // Series seen at a tick but not followed (over kMaxSeries).
  size_t unfollowed() const { return unfollowed_; }

  // The most bytes one followed series holds (rings at their bound, the
  // histograms' previous counts of `buckets` buckets each).
  static size_t MaxBytesPerSeries(size_t buckets);
  // Bytes held for `s` now (string capacities and bucket vectors), or 0.
  size_t BytesHeld(const EngineSeries& s) const;

 private:
  struct State;
  State* StateFor(const EngineSeries& s, bool baseline);

  std::unordered_map<const EngineSeries*, std::unique_ptr<State>> states_;
  size_t unfollowed_ = 0;
  uint64_t last_tick_ns_ = 0;
  int64_t last_unix_s_ = 0;
  bool started_ = false;
  SeriesWindows windows_;  // the window arithmetic (marks in each State)
};

}  // namespace tokenmeter::daemon::live

#endif  // TOKENMETER_DAEMON_LIVE_HISTORY_H_
