#include "daemon/store/window_gauges.h"

namespace tokenmeter::daemon {

void WindowGauges::Update(Registry& registry, double window_s) {
  if (!(window_s > 0)) return;
  registry.ForEachSeries([&](EngineSeries& s) {
    if (!s.uses(kWindowGenerationThroughput)) return;
    const WindowCounters& d = windows_.Advance(s).increase;
    s.Set(kWindowGenerationThroughput, double(d.generation_tokens) / window_s);
    s.Set(kWindowCacheHitRate, d.CacheHitRate());
    s.Set(kWindowSpecAcceptLength, d.SpecAcceptLength());
    s.Set(kWindowSpecAcceptRate, d.SpecAcceptRate());
  });
}

}  // namespace tokenmeter::daemon
