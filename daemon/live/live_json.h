// /api/v1/live: the live page's data as JSON (docs/operations.md, "Live
// page"):
//   {"series": [{"engine_family", "model_name", "engine", "labels": {...},
//                "now": {"t": unix s, K: number|null, ...},
//                "history": {"t": [...], K: [...], ...}}, ...],
//    "points_max": 900, "series_max": 64, "series_unfollowed": N}
// one entry per engine series in exposition order; a series without a
// history (over the cap: counted in series_unfollowed; or created since the
// last tick) has "now" values of null and empty history arrays.
//
// Cost: the history holds every number as text already, so rendering
// copies spans: O(series * points) bytes, no number formatting.
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_LIVE_LIVE_JSON_H_
#define TOKENMETER_DAEMON_LIVE_LIVE_JSON_H_

#include <string>
#include <string_view>

#include "daemon/http/server.h"
#include "daemon/live/history.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon::live {

inline constexpr std::string_view kJsonContentType =
    "application/json; charset=utf-8";
inline constexpr std::string_view kPageContentType = "text/html; charset=utf-8";
// The page's Content-Security-Policy: its inline script and style, requests
// to its own origin only, nothing else (no frame, form, base or plugin).
inline constexpr std::string_view kPagePolicy =
    "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

// Appends the document above for every series of `registry`.
void RenderJson(const Registry& registry, const History& history,
                std::string& out);

// The page at `/` (daemon/live/page.html, embedded at build time).
std::string_view PageHtml();

// Routes `/` (the page, with kPagePolicy, compressible) and
// `/api/v1/live` (the document above, never cached, not compressed: gzip
// would cost the loop more than the copy) on `server`. `registry` and
// `history` outlive the server's routes.
void AddRoutes(http::Server& server, const Registry& registry,
               const History& history);

}  // namespace tokenmeter::daemon::live

#endif  // TOKENMETER_DAEMON_LIVE_LIVE_JSON_H_
