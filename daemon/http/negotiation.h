// Content negotiation for /metrics: which exposition format a scraper
// prefers (Accept) and whether it takes gzip (Accept-Encoding).
//
// The parsers are total functions over arbitrary bytes: they never read out
// of bounds, never allocate, never throw, and treat anything they cannot
// parse as absent. They are pure, so any thread may call them.
#ifndef TOKENMETER_DAEMON_HTTP_NEGOTIATION_H_
#define TOKENMETER_DAEMON_HTTP_NEGOTIATION_H_

#include <string_view>

namespace tokenmeter::daemon::http {

enum class Format {
  kText004,         // text/plain; version=0.0.4
  kOpenMetrics100,  // application/openmetrics-text; version=1.0.0
  // application/vnd.google.protobuf;
  //     proto=io.prometheus.client.MetricFamily; encoding=delimited
  kProtobufDelimited,
};

// Chooses the exposition format for an Accept header value (RFC 9110
// section 12.5.1). Each format takes the q-value of the most specific media
// range matching it (type/subtype with a matching `version` or `charset`
// parameter, then type/subtype, then type/*, then */*; equally specific
// ranges: the highest q). A `version` parameter other than 0.0.4 (text) or
// 1.0.0 (OpenMetrics) makes a range not match; a `charset` other than
// utf-8 likewise; other parameters (e.g. Prometheus 3's `escaping`) are
// ignored. A range with a malformed q (not 0..1 with at most 3 decimals) or
// malformed syntax is ignored. OpenMetrics 1.0.0 is chosen only when its q
// is strictly greater than text's; ties, an empty header and garbage give
// kText004.
//
// The protobuf format is binary, so it is sent only to a scraper that names
// it: a range application/vnd.google.protobuf whose `proto` parameter is
// io.prometheus.client.MetricFamily and whose `encoding` is delimited (as
// Prometheus sends it with --enable-feature=native-histograms, and as
// client_golang's expfmt.Negotiate reads it); wildcards, a missing or other
// `proto`, and other encodings (text, compact-text) never select it. It is
// chosen when its q is strictly greater than both text formats'.
// Cost: one pass over the header, no allocation.
Format ChooseFormat(std::string_view accept);

// The Content-Type header value for a format, exactly:
// "text/plain; version=0.0.4; charset=utf-8",
// "application/openmetrics-text; version=1.0.0; charset=utf-8" or
// "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
// encoding=delimited".
std::string_view ContentType(Format format);

// True when an Accept-Encoding header value allows gzip: an explicit `gzip`
// or `x-gzip` coding with q > 0 decides; without one, `*` with q > 0 does.
// `gzip;q=0` excludes gzip even if `*` is present. An empty or unparsable
// header gives false (the server then sends identity).
bool AcceptsGzip(std::string_view accept_encoding);

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_NEGOTIATION_H_
