#include "daemon/store/window_gauges.h"

namespace tokenmeter::daemon {

namespace {

// Generation tokens of every label cell of a series (request labels split
// the counter; the window gauges are per series).
uint64_t GenerationTokens(const EngineSeries& s) {
  uint64_t n = s.count(kGenerationTokens);
  for (const LabelCell& c : s.cells()) n += c.values->count(kGenerationTokens);
  return n;
}

double Rate(uint64_t now, uint64_t before, double over) {
  return over > 0 && now >= before ? double(now - before) / over : 0.0;
}

}  // namespace

WindowGauges::Last WindowGauges::Last::Of(const EngineSeries& s) {
  return Last{GenerationTokens(s),
              s.count(kPrefixCacheQueries),
              s.count(kPrefixCacheHits),
              s.count(kSpecDecodeNumDrafts),
              s.count(kSpecDecodeNumDraftTokens),
              s.count(kSpecDecodeNumAcceptedTokens)};
}

void WindowGauges::Start(const Registry& registry) {
  registry.ForEachSeries(
      [&](const EngineSeries& s) { last_[&s] = Last::Of(s); });
}

void WindowGauges::Update(Registry& registry, double window_s) {
  if (!(window_s > 0)) return;
  registry.ForEachSeries([&](EngineSeries& s) {
    if (!s.uses(kWindowGenerationThroughput)) return;
    Last& last = last_[&s];
    const Last now = Last::Of(s);
    s.Set(kWindowGenerationThroughput,
          Rate(now.generation_tokens, last.generation_tokens, 1.0) / window_s);
    s.Set(kWindowCacheHitRate,
          Rate(now.prefix_hits, last.prefix_hits,
               double(now.prefix_queries - last.prefix_queries)));
    const double drafts = double(now.spec_drafts - last.spec_drafts);
    const double accepted_per_draft =
        Rate(now.spec_accepted_tokens, last.spec_accepted_tokens, drafts);
    s.Set(kWindowSpecAcceptLength, drafts > 0 ? 1.0 + accepted_per_draft : 0);
    s.Set(kWindowSpecAcceptRate,
          Rate(now.spec_accepted_tokens, last.spec_accepted_tokens,
               double(now.spec_draft_tokens - last.spec_draft_tokens)));
    last = now;
  });
}

}  // namespace tokenmeter::daemon
