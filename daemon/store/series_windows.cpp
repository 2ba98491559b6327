#include "daemon/store/series_windows.h"

namespace tokenmeter::daemon {
namespace {

uint64_t Child(const SeriesValues& v, EngineMetric m, size_t i) {
  const std::vector<uint64_t>& c = v.children(m);
  return i < c.size() ? c[i] : 0;
}

double Ratio(uint64_t num, uint64_t den) {
  return den > 0 ? double(num) / double(den) : 0.0;
}

// An increase, moving the mark on; a value below its mark is none.
uint64_t Delta(uint64_t now, uint64_t& mark) {
  const uint64_t d = now >= mark ? now - mark : 0;
  mark = now;
  return d;
}

}  // namespace

uint64_t CellSum(const EngineSeries& s, EngineMetric m) {
  uint64_t n = s.count(m);
  for (const LabelCell& c : s.cells()) n += c.values->count(m);
  return n;
}

uint64_t CellChildSum(const EngineSeries& s, EngineMetric m, size_t i) {
  uint64_t n = Child(s, m, i);
  for (const LabelCell& c : s.cells()) n += Child(*c.values, m, i);
  return n;
}

WindowCounters WindowCounters::Of(const EngineSeries& s) {
  WindowCounters c;
  c.prompt_tokens = CellSum(s, kPromptTokens);
  c.generation_tokens = CellSum(s, kGenerationTokens);
  c.prompt_tokens_cached = CellSum(s, kPromptTokensCached);
  c.preemptions = s.count(kNumPreemptions);
  c.prefix_queries = s.count(kPrefixCacheQueries);
  c.prefix_hits = s.count(kPrefixCacheHits);
  c.spec_drafts = s.count(kSpecDecodeNumDrafts);
  c.spec_draft_tokens = s.count(kSpecDecodeNumDraftTokens);
  c.spec_accepted_tokens = s.count(kSpecDecodeNumAcceptedTokens);
  return c;
}

double WindowCounters::CacheHitRate() const {
  return Ratio(prefix_hits, prefix_queries);
}

double WindowCounters::SpecAcceptLength() const {
  return spec_drafts > 0 ? 1.0 + Ratio(spec_accepted_tokens, spec_drafts) : 0.0;
}

double WindowCounters::SpecAcceptRate() const {
  return Ratio(spec_accepted_tokens, spec_draft_tokens);
}

EngineMetric WindowLatency(const EngineSeries& s, size_t i) {
  switch (i) {
    case 0:
      return kTimeToFirstToken;
    case 1:
      // SGLang's profile shows the per-token ITL as its inter-token latency.
      return s.uses(kInterTokenLatency) ? kInterTokenLatency
                                        : kInterTokenLatencyPerToken;
    default:
      return kE2eRequestLatency;
  }
}

void SeriesWindows::SumBuckets(const EngineSeries& s, EngineMetric m,
                               std::vector<uint64_t>* out) {
  const std::vector<uint64_t>& own = s.hist(m).counts();
  out->assign(own.begin(), own.end());
  for (const LabelCell& c : s.cells()) {
    const std::vector<uint64_t>& counts = c.values->hist(m).counts();
    for (size_t i = 0; i < out->size(); ++i) (*out)[i] += counts[i];
  }
}

SeriesWindows::Marks& SeriesWindows::MarksOf(const EngineSeries& s) {
  return marks_[&s];
}

void SeriesWindows::Mark(const EngineSeries& s, Marks& m) {
  m.counters = WindowCounters::Of(s);
  if (!latencies_) return;
  for (size_t h = 0; h < kNumWindowLatencies; ++h) {
    SumBuckets(s, WindowLatency(s, h), &m.buckets[h]);
  }
}

void SeriesWindows::Restart(const Registry& registry) {
  registry.ForEachSeries([this](const EngineSeries& s) { Mark(s); });
}

const SeriesWindows::Window& SeriesWindows::Advance(const EngineSeries& s,
                                                    Marks& m) {
  const WindowCounters now = WindowCounters::Of(s);
  WindowCounters& mark = m.counters;
  WindowCounters& d = window_.increase;
  d.prompt_tokens = Delta(now.prompt_tokens, mark.prompt_tokens);
  d.generation_tokens = Delta(now.generation_tokens, mark.generation_tokens);
  d.prompt_tokens_cached =
      Delta(now.prompt_tokens_cached, mark.prompt_tokens_cached);
  d.preemptions = Delta(now.preemptions, mark.preemptions);
  d.prefix_queries = Delta(now.prefix_queries, mark.prefix_queries);
  d.prefix_hits = Delta(now.prefix_hits, mark.prefix_hits);
  d.spec_drafts = Delta(now.spec_drafts, mark.spec_drafts);
  d.spec_draft_tokens = Delta(now.spec_draft_tokens, mark.spec_draft_tokens);
  d.spec_accepted_tokens =
      Delta(now.spec_accepted_tokens, mark.spec_accepted_tokens);
  if (!latencies_) return window_;
  // One pass per histogram: each bucket summed over the cells and its
  // increase taken at once (this runs every second for each followed
  // series).
  for (size_t h = 0; h < kNumWindowLatencies; ++h) {
    const EngineMetric metric = WindowLatency(s, h);
    const std::vector<uint64_t>& own = s.hist(metric).counts();
    std::vector<uint64_t>& prev = m.buckets[h];
    if (prev.size() != own.size()) prev.assign(own.size(), 0);  // created
    std::vector<uint64_t>& inc = increase_[h];
    inc.resize(own.size());
    uint64_t total = 0;
    for (size_t i = 0; i < own.size(); ++i) {
      uint64_t now = own[i];
      for (const LabelCell& c : s.cells()) {
        now += c.values->hist(metric).counts()[i];
      }
      inc[i] = Delta(now, prev[i]);
      total += inc[i];
    }
    window_.buckets[h] = &inc;
    window_.observations[h] = total;
  }
  return window_;
}

size_t SeriesWindows::BytesHeld(const EngineSeries& s) const {
  auto it = marks_.find(&s);
  return it == marks_.end() ? 0 : BytesHeld(it->second);
}

size_t SeriesWindows::BytesHeld(const Marks& m) {
  size_t n = sizeof(Marks);
  for (const std::vector<uint64_t>& b : m.buckets) {
    n += b.capacity() * sizeof(uint64_t);
  }
  return n;
}

}  // namespace tokenmeter::daemon
