// /api/v1/requests: the kept requests (request_keeper.h) as JSON, and as
// Chrome trace-event JSON with ?format=chrome-trace (docs/requests.md
// describes both documents field by field).
//
// JSON: {"window_seconds", "keep_requests", "now_unix_ns",
//        "unix_minus_monotonic_ns", "series": [{"profile", "labels": {...},
//        "requests": [{...}, ...]}, ...]}
// A request's times are integers in ns: "start_unix_ns" and
// "start_monotonic_ns" place its start (ARRIVED, else its earliest time
// point); every other time is ns after that start (exact in any JSON
// reader, JavaScript's included, where a Unix time in ns is not).
// Its "phases" are the child spans the tracer would export (queue,
// kv_transfer.send/recv, prefill, preempted, decode: trace/span_builder.h),
// so that the waterfall, the Chrome trace and the OTLP spans agree.
//
// Chrome trace: one process per series, one thread per request; an "X"
// event for the request (llm_request) and each phase, with its span
// attributes as args; an instant event per TOKENS tick (args.n). Times in
// µs after the earliest shown start (otherData.start_unix_ns places it).
//
// Cost: O(kept requests + their token ticks), on the loop, per request of
// the API; nothing between requests. Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_REQUESTS_REQUESTS_JSON_H_
#define TOKENMETER_DAEMON_REQUESTS_REQUESTS_JSON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/base/clock.h"
#include "daemon/http/server.h"
#include "daemon/requests/request_keeper.h"

namespace tokenmeter::daemon::requests {

struct RenderOptions {
  size_t keep = 50;
  uint64_t window_ns = 0;
  uint64_t now_unix_ns = 0;
  // Unix time minus CLOCK_MONOTONIC, ns (trace::UnixMinusMonotonicNs).
  int64_t unix_minus_monotonic_ns = 0;
};

// Appends the JSON document above.
void RenderRequestsJson(const std::vector<SeriesRequests>& series,
                        const RenderOptions& options, std::string& out);
// Appends the Chrome trace-event document above.
void RenderChromeTrace(const std::vector<SeriesRequests>& series,
                       const RenderOptions& options, std::string& out);

// Routes /api/v1/requests on `server`: `format=json` (the default) or
// `format=chrome-trace` in the query string; any other format, or another
// parameter, is a 400 naming it. Never cached; compressible (a Chrome
// trace of 50 requests with 4096 ticks each is megabytes). `keeper` and
// `clock` outlive the server's routes; the Unix offset is read at each
// request (CLOCK_REALTIME against clock.NowNs()).
void AddRoutes(http::Server& server, RequestKeeper& keeper, const Clock& clock);

}  // namespace tokenmeter::daemon::requests

#endif  // TOKENMETER_DAEMON_REQUESTS_REQUESTS_JSON_H_
