// The OTLP/HTTP exporter's settings for one signal (traces or metrics),
// built from command-line values over the OpenTelemetry environment
// variables with the OpenTelemetry SDK's precedence:
//
//   flag  >  OTEL_EXPORTER_OTLP_<SIGNAL>_<X>  >  OTEL_EXPORTER_OTLP_<X>
//
// and for the endpoint: the flag or the signal-specific variable is used
// as is; the general OTEL_EXPORTER_OTLP_ENDPOINT is a base URL to which
// "/v1/traces" or "/v1/metrics" is appended (one trailing '/' of the base
// is dropped first, so "http://c:4318/" and "http://c:4318" both give
// "http://c:4318/v1/traces"). An environment variable set to the empty
// string counts as unset (OpenTelemetry's rule for every variable).
//
// ParseOtlpConfig is a pure function: it reads neither the process
// environment nor any file (that certificate files exist is checked by
// OtlpHttpExporter::Create). Cost: linear in the length of the values.
#ifndef TOKENMETER_DAEMON_OTLP_OTLP_CONFIG_H_
#define TOKENMETER_DAEMON_OTLP_OTLP_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/base/status.h"

namespace tokenmeter::daemon::otlp {

enum class Signal : uint8_t { kTraces, kMetrics };

// OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf" (the default) or
// "http/json". "grpc" is a valid OpenTelemetry value that this exporter
// does not speak: an error.
enum class Protocol : uint8_t { kHttpProtobuf, kHttpJson };

enum class Compression : uint8_t { kNone, kGzip };

// Where the endpoint came from, so that the caller can decide whether a
// general endpoint in the environment turns a signal on.
enum class EndpointSource : uint8_t {
  kNone,        // no endpoint anywhere: the signal is off
  kFlag,        // OtlpOverrides::endpoint
  kSignalEnv,   // OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / ..._METRICS_ENDPOINT
  kGeneralEnv,  // OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/<signal>"
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct OtlpConfig {
  // The full URL requests are POSTed to; empty when the signal is off.
  std::string endpoint;
  EndpointSource endpoint_source = EndpointSource::kNone;
  Protocol protocol = Protocol::kHttpProtobuf;
  // Extra request headers, names as given (HTTP tokens), values decoded.
  // A name given twice keeps the last value (compared case-insensitively).
  KeyValues headers;
  Compression compression = Compression::kNone;
  // Per request attempt (connect + send + response), > 0.
  uint64_t timeout_ns = 10'000'000'000;
  // PEM files; empty: not set. certificate: the CA bundle that verifies the
  // server (empty: the system's trust store). client_*: mutual TLS.
  std::string certificate_file;
  std::string client_certificate_file;
  std::string client_key_file;
  // The resource: "service.name" first (OTEL_SERVICE_NAME, else the
  // service.name of OTEL_RESOURCE_ATTRIBUTES, else OtlpOverrides's
  // default_service_name), then the other OTEL_RESOURCE_ATTRIBUTES pairs
  // in their order, a key given twice keeping its last value; then, where
  // those name no "service.instance.id" and OtlpOverrides's
  // default_instance_id is not empty, that id.
  KeyValues resource_attributes;

  bool enabled() const { return !endpoint.empty(); }
  // "application/x-protobuf" or "application/json".
  std::string_view content_type() const;
};

// The flags (and config-file keys of the same names, without the dashes)
// whose values override the environment. nullopt: not given. Each value
// has the syntax of the environment variable it overrides (the timeout in
// milliseconds, headers as "k=v,k2=v2"). The flag names below are used in
// error messages.
struct OtlpOverrides {
  std::optional<std::string> endpoint;            // kTracesEndpointFlag or
                                                  // kMetricsEndpointFlag
  std::optional<std::string> protocol;            // --otlp-protocol
  std::optional<std::string> headers;             // --otlp-headers
  std::optional<std::string> compression;         // --otlp-compression
  std::optional<std::string> timeout_ms;          // --otlp-timeout
  std::optional<std::string> certificate;         // --otlp-certificate
  std::optional<std::string> client_certificate;  // --otlp-client-certificate
  std::optional<std::string> client_key;          // --otlp-client-key
  // service.name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES
  // names one (OpenTelemetry: "unknown_service:" + the executable's name).
  std::string default_service_name = "unknown_service:tokenmeterd";
  // service.instance.id when OTEL_RESOURCE_ATTRIBUTES names none; empty:
  // none. The metrics push sets it (Prometheus' `instance` label, which
  // tells two daemons' series apart; daemon.cpp, DefaultInstanceId()).
  std::string default_instance_id;
};

inline constexpr std::string_view kTracesEndpointFlag = "--otlp-endpoint";
inline constexpr std::string_view kMetricsEndpointFlag =
    "--otlp-metrics-endpoint";
inline constexpr std::string_view kProtocolFlag = "--otlp-protocol";
inline constexpr std::string_view kHeadersFlag = "--otlp-headers";
inline constexpr std::string_view kCompressionFlag = "--otlp-compression";
inline constexpr std::string_view kTimeoutFlag = "--otlp-timeout";
inline constexpr std::string_view kCertificateFlag = "--otlp-certificate";
inline constexpr std::string_view kClientCertificateFlag =
    "--otlp-client-certificate";
inline constexpr std::string_view kClientKeyFlag = "--otlp-client-key";

// The largest timeout accepted, in milliseconds (one hour).
inline constexpr uint64_t kMaxTimeoutMs = 3'600'000;

// Environment variables by name (only the OTEL_* ones matter).
using Environment = std::map<std::string, std::string, std::less<>>;

// Builds *out for `signal`. When no endpoint is given anywhere the signal
// is off: *out has an empty endpoint, the OTEL_* variables are not looked
// at (a bad value meant for another program does not stop the daemon) and
// the flags are checked alone (a bad flag is an error all the same). So
// it is, the same way, when the endpoint comes from the environment and
// the SDKs' off switches are set there: OTEL_SDK_DISABLED=true, or
// OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER=none (any case); a flag's
// endpoint is not turned off by them.
// Otherwise every value is checked and the first bad one is an
// error of one line naming the flag or variable and the value, e.g.
//   OTEL_EXPORTER_OTLP_COMPRESSION: "zstd" is not gzip or none
// except that a header's value is never repeated (it may be a secret):
// the error names the header. *out is unchanged on error.
//
// Rules: endpoint: an absolute http:// or https:// URL with a host, no
// spaces or control characters. headers / OTEL_RESOURCE_ATTRIBUTES:
// comma-separated key=value pairs, blanks around keys and values dropped,
// empty items (",,") skipped; values percent-decoded (resource keys too),
// a '%' not followed by two hex digits is an error; header names are HTTP
// tokens and decoded header values may not hold control characters;
// resource keys may not be empty. timeout: whole milliseconds from 1 to
// kMaxTimeoutMs. compression: "gzip" or "none". protocol: "http/protobuf"
// or "http/json". Certificate paths are taken as given (never empty).
Status ParseOtlpConfig(Signal signal, const OtlpOverrides& overrides,
                       const Environment& env, OtlpConfig* out);

// The process environment's OTEL_* variables (reads `environ`: call it on
// the main thread before starting threads that may call setenv).
Environment ProcessOtlpEnvironment();

// "traces" or "metrics".
std::string_view SignalName(Signal signal);

// Percent-decodes `in` into *out ("%2C" -> ","; '+' stays '+'). False when
// a '%' is not followed by two hex digits (*out is then unspecified).
bool PercentDecode(std::string_view in, std::string* out);

}  // namespace tokenmeter::daemon::otlp

#endif  // TOKENMETER_DAEMON_OTLP_OTLP_CONFIG_H_
