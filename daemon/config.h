// tokenmeterd's configuration: command-line flags (docs/operations.md lists
// them) over an optional configuration file of `key = value` lines whose
// keys are the long flag names without dashes, plus `buckets.<histogram>`
// for per-histogram bucket bounds.
#ifndef TOKENMETER_DAEMON_CONFIG_H_
#define TOKENMETER_DAEMON_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/base/status.h"
#include "daemon/ingest/ingest_options.h"
#include "daemon/ingest/tracker_options.h"
#include "daemon/otlp/otlp_config.h"
#include "daemon/store/registry_options.h"

namespace tokenmeter::daemon {

struct Config {
  std::string ingest_path = TM_DEFAULT_SOCKET_PATH;
  std::string listen = ":10062";
  // --web-config FILE (daemon/http/web_config.h): TLS and basic auth on the
  // HTTP listener. Empty: plain HTTP, no authentication.
  std::string web_config;
  uint64_t log_interval_ns = 10'000'000'000;  // 0: no summary line
  std::string log_level = "info";
  std::string config_file;
  RegistryOptions registry;
  TrackerOptions tracker;
  IngestOptions ingest;
  uint32_t http_max_connections = 256;
  // --ready-fd: once both listeners are live the daemon writes one line,
  // "ready http=HOST:PORT ingest=PATH\n", to this descriptor and closes
  // it. -1: none.
  int ready_fd = -1;
  // --state-dir DIR: state snapshots (daemon/state/snapshot.h) written
  // every --snapshot-interval and at stop, loaded at start. Empty: none.
  std::string state_dir;
  // --state-dir-unsafe-ok: accept a state directory owned by another uid or
  // writable by its group or others (refused by default: whoever can write
  // it chooses what the daemon loads).
  bool state_dir_unsafe_ok = false;
  uint64_t snapshot_interval_ns = 1'000'000'000;
  // --boot-id-file: the file whose contents name this boot (a snapshot of
  // another boot is set aside).
  std::string boot_id_file = "/proc/sys/kernel/random/boot_id";
  // Request traces over OTLP (docs/traces.md): the --otlp-* flags as given
  // (the environment is read, and everything checked, at start:
  // otlp::ParseOtlpConfig()); sampling; the exporter's queue bound.
  otlp::OtlpOverrides otlp_traces;
  double trace_ratio = 0.01;          // --trace-ratio, 0 .. 1
  uint64_t trace_slower_than_ns = 0;  // --trace-slower-than; 0: off
  uint64_t otlp_queue_spans = 65536;  // --otlp-queue-spans
  // Metrics over OTLP (docs/otlp-metrics.md): the endpoint flag (the other
  // --otlp-* flags are otlp_traces'); the push interval (none given: the
  // OTEL_METRIC_EXPORT_INTERVAL variable, else 15 s, decided at start);
  // histograms as explicit (classic) rather than exponential (native).
  std::optional<std::string> otlp_metrics_endpoint;
  std::optional<uint64_t> otlp_metrics_interval_ns;
  bool otlp_histograms_explicit = false;
  // --keep-requests: requests kept per series for /api/v1/requests (the
  // slowest and failed of the last 15 minutes); 0: the API is off.
  uint64_t keep_requests = 50;
  bool show_version = false;
  bool show_help = false;
};

// Parses argv (argv[0] is skipped). A --config file is read first; flags
// given on the command line win over it. Errors name the flag or the file
// and line.
Status ParseConfig(int argc, const char* const* argv, Config* config);

// Checks that `fd` (--ready-fd) is open for writing, so that a bad one
// stops the start-up before anything is bound. The error names the flag.
Status CheckReadyFd(int fd);

// Writes the --ready-fd line for these addresses to `fd` and closes it.
// An error (e.g. the reader has gone) names the flag.
Status WriteReadyLine(int fd, std::string_view http_address,
                      std::string_view ingest_path);

// Descriptors FitConnectionCaps() keeps for the daemon beyond those open
// at start: its loop, listeners, the ingest spare, the journal, /proc
// reads while rendering.
inline constexpr uint64_t kDaemonFdHeadroom = 32;

// Fits --max-connections and --max-http-connections under `fd_limit`
// (the soft RLIMIT_NOFILE), each connection taking one descriptor, after
// `fds_in_use` (open at start) plus kDaemonFdHeadroom: when they do not
// fit, both are lowered in proportion (each to at least 1) and *clamped
// says so in one line to log; otherwise *clamped is empty and the config
// unchanged. An error when the limit leaves not one descriptor for each.
Status FitConnectionCaps(uint64_t fd_limit, uint64_t fds_in_use, Config* config,
                         std::string* clamped);

// The --help text.
std::string_view UsageText();

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_CONFIG_H_
