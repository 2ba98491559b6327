#include "daemon/store/window_gauges.h"

namespace tokenmeter::daemon {
namespace {

double Ratio(uint64_t num, double den) {
  return den > 0 ? double(num) / den : 0.0;
}

}  // namespace

void WindowGauges::Update(Registry& registry, double window_s) {
  if (!(window_s > 0)) return;
  registry.ForEachSeries([&](EngineSeries& s) {
    if (!s.uses(kWindowGenerationThroughput)) return;
    const WindowCounters& d = windows_.Advance(s).increase;
    s.Set(kWindowGenerationThroughput,
          Ratio(d.generation_tokens, 1.0) / window_s);
    s.Set(kWindowCacheHitRate, Ratio(d.prefix_hits, double(d.prefix_queries)));
    const double drafts = double(d.spec_drafts);
    const double accepted_per_draft = Ratio(d.spec_accepted_tokens, drafts);
    s.Set(kWindowSpecAcceptLength, drafts > 0 ? 1.0 + accepted_per_draft : 0);
    s.Set(kWindowSpecAcceptRate,
          Ratio(d.spec_accepted_tokens, double(d.spec_draft_tokens)));
  });
}

}  // namespace tokenmeter::daemon
