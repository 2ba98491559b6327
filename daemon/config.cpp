#include "daemon/config.h"

#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include "daemon/http/listen_address.h"
#include "daemon/store/native_histogram.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {
namespace {

// The longest --ingest path: sun_path holds it and its NUL.
constexpr size_t kMaxIngestPathBytes = sizeof(sockaddr_un::sun_path) - 1;

constexpr std::string_view kUsage =
    R"(Usage: tokenmeterd [FLAGS]

Collects LLM serving events from engines over a Unix socket and serves
them as Prometheus metrics.

  --ingest PATH              engine socket (default /run/tokenmeter/ingest.sock)
  --listen HOST:PORT         HTTP address (default :10062, every interface)
  --web-config FILE          TLS and basic auth for the HTTP listener: the
                             exporter-toolkit web configuration file
                             (tls_server_config, basic_auth_users)
  --log-interval SECONDS     summary-line period, 0 disables (default 10)
  --state-dir DIR            keep counters, histograms and requests in flight
                             across restarts: snapshots written there
                             (default: none); DIR must be the daemon's
                             uid's and writable by no one else
  --state-dir-unsafe-ok      use a --state-dir owned by another uid or
                             writable by group or others (files in it are
                             still checked)
  --snapshot-interval SECONDS
                             snapshot period with --state-dir, 0.01 to 3600
                             (default 1)
  --boot-id-file PATH        names this boot; a snapshot of another boot is
                             set aside (default
                             /proc/sys/kernel/random/boot_id)
  --namespace NAME           metric namespace for every engine (default: the
                             engine name each engine sends)
  --profile NAME             naming profile of engines that do not choose one:
                             auto (sglang for engine sglang, lmdeploy for
                             engine lmdeploy, vllm otherwise), vllm, sglang,
                             lmdeploy (default auto)
  --legacy-names             vllm profile: also the pre-v1 names routers
                             read (vllm:gpu_cache_usage_perc, ...)
  --moe-expert-series        also moe_expert_tokens{layer,expert}: one series
                             per expert of every MoE layer, counted toward
                             --max-engine-series
  --native-histogram-schema N
                             initial schema of the native histogram buckets
                             in the protobuf exposition, -4 to 8 (default 3)
  --request-label NAME       add request label NAME from ARRIVED params
                             labels to request series (repeatable, at most 4)
  --request-label-values N   distinct values per request label per engine
                             series, later ones are __other__ (default 100)
  --priority-label           request label "priority" from ARRIVED priority,
                             bucketed as vLLM does (<-1 -1 0 1 >1)
  --max-model-len N          top of the token-count buckets (default 32768)
  --config FILE              key = value file; flags override it
  --log-level LEVEL          trace, debug, info, warn, error (default info)
  --max-requests N           requests tracked at once (default 1000000)
  --request-idle-timeout S   forget unfinished requests idle this long
                             (default 600)
  --finished-grace S         keep finished requests for late events (default 2)
  --max-frame-bytes N        largest frame accepted (default 1048576)
  --max-batch-events N       most events in one batch (default 65536)
  --max-connections N        engine connections at once (default 1024)
  --max-connections-per-uid N
                             engine connections of one uid at once
                             (default 256)
  --hello-timeout SECONDS    close a connection that sent no HELLO this
                             long (default 10)
  --max-http-connections N   HTTP connections at once (default 256)
  --max-engine-series N      engine label sets at once (default 4096)
  --max-moe-layers N         MoE layers all engine series hold together,
                             0 to refuse every EXPERT_LOAD (default 262144)
  --ingest-group NAME        group of the ingest socket file (default: the
                             daemon's group)
  --allow-uids LIST          comma-separated uids allowed to send (checked
                             with SO_PEERCRED; default: anyone who can
                             open the socket)
  --allow-gids LIST          comma-separated gids allowed to send; a peer
                             passes if its uid or its gid is listed
  --otlp-endpoint URL        export request traces over OTLP/HTTP to URL
                             (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                             else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces;
                             none of the three set: no traces)
  --otlp-protocol P          http/protobuf or http/json (default
                             http/protobuf)
  --otlp-headers K=V,...     request headers (OTEL_EXPORTER_OTLP_HEADERS)
  --otlp-compression C       gzip or none (default none)
  --otlp-timeout MS          per request attempt (default 10000)
  --otlp-certificate FILE    CA bundle verifying the receiver
  --otlp-client-certificate FILE
                             client certificate (mutual TLS)
  --otlp-client-key FILE     the client certificate's key
  --otlp-queue-spans N       spans (and metric data points, for the
                             metrics push) waiting for export at most;
                             more are dropped and counted (default 65536)
  --trace-ratio R            share of requests without a parent context
                             traced, 0 to 1 (default 0.01)
  --trace-slower-than S      also trace every request whose end-to-end
                             time is at least S seconds (default 0: off)
  --otlp-metrics-endpoint URL
                             push every series over OTLP/HTTP to URL
                             (default: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
                             else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/metrics;
                             none of the three set: no push); the
                             other --otlp-* flags apply
  --otlp-metrics-interval S  seconds between pushes (default:
                             OTEL_METRIC_EXPORT_INTERVAL ms, else 15)
  --otlp-histograms FORM     exponential (native buckets, the default) or
                             explicit (classic buckets)
  --keep-requests N          requests kept per engine series for
                             /api/v1/requests and the live page: the
                             slowest and the failed of the last 15
                             minutes (default 50; 0: off)
  --ready-fd N               once both listeners are live, write one line
                             "ready http=HOST:PORT ingest=PATH" to file
                             descriptor N and close it (default: none)
  --version, -V              print the version and exit
  --help                     print this text and exit
)";

Status ParseUint(std::string_view flag, std::string_view v, uint64_t min,
                 uint64_t max, uint64_t* out) {
  uint64_t x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < min || x > max) {
    return Status::Error("--" + std::string(flag) + ": \"" + std::string(v) +
                         "\" is not a whole number from " +
                         std::to_string(min) + " to " + std::to_string(max));
  }
  *out = x;
  return Status::Ok();
}

// A number of seconds (decimals allowed) >= min, at most 1e7, as
// nanoseconds.
Status ParseSecondsNs(std::string_view flag, std::string_view v, double min,
                      uint64_t* out_ns) {
  double x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x) ||
      x < min || x > 1e7) {
    return Status::Error(
        "--" + std::string(flag) + ": \"" + std::string(v) +
        "\" is not a number of seconds >= " + std::to_string(int(min)));
  }
  *out_ns = uint64_t(std::llround(x * 1e9));
  return Status::Ok();
}

// "0,1000, 1001": at least one whole number, at most 256 of them.
Status ParseIdList(std::string_view flag, std::string_view v,
                   std::vector<uint32_t>* out) {
  std::vector<uint32_t> ids;
  const auto bad = [&] {
    return Status::Error("--" + std::string(flag) + ": \"" + std::string(v) +
                         "\" is not a comma-separated list of ids from 0 " +
                         "to 4294967294 (at most 256)");
  };
  size_t pos = 0;
  while (true) {
    const size_t comma = v.find(',', pos);
    std::string_view item =
        v.substr(pos, comma == std::string_view::npos ? std::string_view::npos
                                                      : comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    uint32_t x = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    // (uid_t)-1 means "no id" to the kernel: never a real peer.
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() ||
        x == UINT32_MAX || ids.size() >= 256) {
      return bad();
    }
    ids.push_back(x);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  *out = std::move(ids);
  return Status::Ok();
}

bool ValidNamespace(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

using Setter = std::function<Status(std::string_view, Config*)>;

struct Flag {
  std::string_view name;
  Setter set;
  // A switch takes no value on the command line ("--legacy-names"; also
  // "--legacy-names=false"); in the file it takes true or false.
  bool is_switch = false;
  // Repeatable: every occurrence adds a value; the command line's replace
  // the file's. `clear` empties the list.
  std::function<void(Config*)> clear = {};
};

Status ParseBool(std::string_view flag, std::string_view v, bool* out) {
  if (v == "true" || v == "1" || v == "yes") {
    *out = true;
  } else if (v == "false" || v == "0" || v == "no") {
    *out = false;
  } else {
    return Status::Error("--" + std::string(flag) + ": \"" + std::string(v) +
                         "\" is not true or false");
  }
  return Status::Ok();
}

Status SetUint(std::string_view name, std::string_view v, uint64_t min,
               uint64_t max, auto* field) {
  uint64_t x = 0;
  Status s = ParseUint(name, v, min, max, &x);
  if (s.ok()) *field = static_cast<std::remove_pointer_t<decltype(field)>>(x);
  return s;
}

// An --otlp-* flag: its value kept as given in Config::otlp_traces (checked
// at start, with the OTEL_* variables, by otlp::ParseOtlpConfig()).
Flag OtlpFlag(std::string_view name,
              std::optional<std::string> otlp::OtlpOverrides::*field) {
  return {name, [field](std::string_view v, Config* c) {
            c->otlp_traces.*field = std::string(v);
            return Status::Ok();
          }};
}

const std::vector<Flag>& Flags() {
  static const std::vector<Flag> flags = {
      {"ingest",
       [](std::string_view v, Config* c) {
         // A path a Unix socket can take (sun_path: 107 bytes and the NUL).
         if (v.empty() || v.size() > kMaxIngestPathBytes) {
           return Status::Error("--ingest: \"" + std::string(v) +
                                "\" is not a socket path of 1 to " +
                                std::to_string(kMaxIngestPathBytes) + " bytes");
         }
         c->ingest_path = v;
         return Status::Ok();
       }},
      {"listen",
       [](std::string_view v, Config* c) {
         // The syntax now (a bad flag, exit 2); addresses and names when
         // the daemon listens.
         http::ListenAddress a;
         if (Status s = http::ParseListenAddress(v, &a); !s.ok()) {
           return Status::Error("--listen \"" + std::string(v) +
                                "\": " + s.message());
         }
         c->listen = v;
         return Status::Ok();
       }},
      {"web-config",
       [](std::string_view v, Config* c) {
         if (v.empty()) return Status::Error("--web-config: empty path");
         c->web_config = v;
         return Status::Ok();
       }},
      {"state-dir",
       [](std::string_view v, Config* c) {
         if (v.empty()) return Status::Error("--state-dir: empty path");
         c->state_dir = v;
         return Status::Ok();
       }},
      {"state-dir-unsafe-ok",
       [](std::string_view v, Config* c) {
         return ParseBool("state-dir-unsafe-ok", v, &c->state_dir_unsafe_ok);
       },
       true},
      {"snapshot-interval",
       [](std::string_view v, Config* c) {
         uint64_t ns = 0;
         Status s = ParseSecondsNs("snapshot-interval", v, 0, &ns);
         if (!s.ok() || ns < 10'000'000 || ns > 3'600'000'000'000) {
           return Status::Error("--snapshot-interval: \"" + std::string(v) +
                                "\" is not a number of seconds from 0.01 to "
                                "3600");
         }
         c->snapshot_interval_ns = ns;
         return Status::Ok();
       }},
      {"boot-id-file",
       [](std::string_view v, Config* c) {
         if (v.empty()) return Status::Error("--boot-id-file: empty path");
         c->boot_id_file = v;
         return Status::Ok();
       }},
      {"log-interval",
       [](std::string_view v, Config* c) {
         return ParseSecondsNs("log-interval", v, 0, &c->log_interval_ns);
       }},
      {"namespace",
       [](std::string_view v, Config* c) {
         if (!ValidNamespace(v)) {
           return Status::Error("--namespace: \"" + std::string(v) +
                                "\" must match [a-zA-Z_][a-zA-Z0-9_]*");
         }
         c->ingest.namespace_override = v;
         return Status::Ok();
       }},
      {"profile",
       [](std::string_view v, Config* c) {
         if (v == "auto") {
           c->ingest.profile.reset();
           return Status::Ok();
         }
         const std::optional<Profile> p = ParseProfile(v);
         if (!p) {
           return Status::Error("--profile: \"" + std::string(v) +
                                "\" is not auto, vllm, sglang or lmdeploy");
         }
         c->ingest.profile = *p;
         return Status::Ok();
       }},
      {"legacy-names",
       [](std::string_view v, Config* c) {
         return ParseBool("legacy-names", v, &c->registry.legacy_names);
       },
       true},
      {"priority-label",
       [](std::string_view v, Config* c) {
         return ParseBool("priority-label", v, &c->registry.priority_label);
       },
       true},
      {"moe-expert-series",
       [](std::string_view v, Config* c) {
         return ParseBool("moe-expert-series", v,
                          &c->registry.moe_expert_series);
       },
       true},
      {"native-histogram-schema",
       [](std::string_view v, Config* c) {
         int schema = 0;
         auto [end, ec] =
             std::from_chars(v.data(), v.data() + v.size(), schema);
         if (ec != std::errc() || end != v.data() + v.size() ||
             schema < NativeHistogram::kMinSchema ||
             schema > NativeHistogram::kMaxSchema) {
           return Status::Error("--native-histogram-schema: \"" +
                                std::string(v) +
                                "\" is not a whole number from -4 to 8");
         }
         c->registry.native_histogram_schema = schema;
         return Status::Ok();
       }},
      {"request-label",
       [](std::string_view v, Config* c) {
         std::vector<std::string>& names = c->registry.request_labels;
         if (!tm_proto_valid_label(v.data(), v.size(), "", 0)) {
           return Status::Error(
               "--request-label: \"" + std::string(v) +
               "\" is not a label name the daemon leaves to engines (it must "
               "match [a-zA-Z_][a-zA-Z0-9_]*, not start with __, and not be "
               "one of the daemon's own labels)");
         }
         if (std::find(names.begin(), names.end(), v) != names.end()) {
           return Status::Error("--request-label: \"" + std::string(v) +
                                "\" given twice");
         }
         if (names.size() >= TM_MAX_REQUEST_LABELS) {
           return Status::Error("--request-label: at most 4 labels");
         }
         names.emplace_back(v);
         return Status::Ok();
       },
       false, [](Config* c) { c->registry.request_labels.clear(); }},
      {"request-label-values",
       [](std::string_view v, Config* c) {
         return SetUint("request-label-values", v, 1, 65533,
                        &c->registry.request_label_values);
       }},
      {"max-model-len",
       [](std::string_view v, Config* c) {
         return SetUint("max-model-len", v, 1, uint64_t(1) << 40,
                        &c->registry.max_model_len);
       }},
      {"log-level",
       [](std::string_view v, Config* c) {
         c->log_level = v;
         return Status::Ok();
       }},
      {"max-requests",
       [](std::string_view v, Config* c) {
         return SetUint("max-requests", v, 1, 100'000'000,
                        &c->tracker.max_requests);
       }},
      {"request-idle-timeout",
       [](std::string_view v, Config* c) {
         return ParseSecondsNs("request-idle-timeout", v, 1,
                               &c->tracker.idle_timeout_ns);
       }},
      {"finished-grace",
       [](std::string_view v, Config* c) {
         return ParseSecondsNs("finished-grace", v, 0, &c->tracker.grace_ns);
       }},
      {"max-frame-bytes",
       [](std::string_view v, Config* c) {
         return SetUint("max-frame-bytes", v, 1024, 64 << 20,
                        &c->ingest.limits.max_frame_bytes);
       }},
      {"max-batch-events",
       [](std::string_view v, Config* c) {
         return SetUint("max-batch-events", v, 1, 1 << 24,
                        &c->ingest.limits.max_batch_events);
       }},
      {"max-connections",
       [](std::string_view v, Config* c) {
         return SetUint("max-connections", v, 1, 1 << 20,
                        &c->ingest.max_connections);
       }},
      {"max-connections-per-uid",
       [](std::string_view v, Config* c) {
         return SetUint("max-connections-per-uid", v, 1, 1 << 20,
                        &c->ingest.max_connections_per_uid);
       }},
      {"hello-timeout",
       [](std::string_view v, Config* c) {
         return ParseSecondsNs("hello-timeout", v, 1,
                               &c->ingest.hello_timeout_ns);
       }},
      {"max-http-connections",
       [](std::string_view v, Config* c) {
         return SetUint("max-http-connections", v, 1, 1 << 16,
                        &c->http_max_connections);
       }},
      {"max-engine-series",
       [](std::string_view v, Config* c) {
         return SetUint("max-engine-series", v, 1, 1 << 24,
                        &c->registry.max_engine_series);
       }},
      {"max-moe-layers",
       [](std::string_view v, Config* c) {
         return SetUint("max-moe-layers", v, 0, 1 << 24,
                        &c->registry.max_moe_layers);
       }},
      {"ingest-group",
       [](std::string_view v, Config* c) {
         if (v.empty()) return Status::Error("--ingest-group: empty name");
         c->ingest.group = v;
         return Status::Ok();
       }},
      {"allow-uids",
       [](std::string_view v, Config* c) {
         return ParseIdList("allow-uids", v, &c->ingest.allow_uids);
       }},
      OtlpFlag("otlp-endpoint", &otlp::OtlpOverrides::endpoint),
      OtlpFlag("otlp-protocol", &otlp::OtlpOverrides::protocol),
      OtlpFlag("otlp-headers", &otlp::OtlpOverrides::headers),
      OtlpFlag("otlp-compression", &otlp::OtlpOverrides::compression),
      OtlpFlag("otlp-timeout", &otlp::OtlpOverrides::timeout_ms),
      OtlpFlag("otlp-certificate", &otlp::OtlpOverrides::certificate),
      OtlpFlag("otlp-client-certificate",
               &otlp::OtlpOverrides::client_certificate),
      OtlpFlag("otlp-client-key", &otlp::OtlpOverrides::client_key),
      {"otlp-queue-spans",
       [](std::string_view v, Config* c) {
         return SetUint("otlp-queue-spans", v, 1, 1 << 24,
                        &c->otlp_queue_spans);
       }},
      {"otlp-metrics-endpoint",
       [](std::string_view v, Config* c) {
         c->otlp_metrics_endpoint = std::string(v);
         return Status::Ok();
       }},
      {"otlp-metrics-interval",
       [](std::string_view v, Config* c) {
         uint64_t ns = 0;
         Status s = ParseSecondsNs("otlp-metrics-interval", v, 1, &ns);
         if (s.ok()) c->otlp_metrics_interval_ns = ns;
         return s;
       }},
      {"otlp-histograms",
       [](std::string_view v, Config* c) {
         if (v != "exponential" && v != "explicit") {
           return Status::Error("--otlp-histograms: \"" + std::string(v) +
                                "\" is not exponential or explicit");
         }
         c->otlp_histograms_explicit = v == "explicit";
         return Status::Ok();
       }},
      {"keep-requests",
       [](std::string_view v, Config* c) {
         return SetUint("keep-requests", v, 0, 1000, &c->keep_requests);
       }},
      {"trace-ratio",
       [](std::string_view v, Config* c) {
         double x = 0;
         auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
         if (ec != std::errc() || end != v.data() + v.size() ||
             !(x >= 0 && x <= 1)) {
           return Status::Error("--trace-ratio: \"" + std::string(v) +
                                "\" is not a number from 0 to 1");
         }
         c->trace_ratio = x;
         return Status::Ok();
       }},
      {"trace-slower-than",
       [](std::string_view v, Config* c) {
         // 0: off, the default (a configuration file can say so); a
         // positive value below 1 ns, which would round to 0, is refused.
         const Status s = ParseSecondsNs("trace-slower-than", v, 0,
                                         &c->trace_slower_than_ns);
         double x = 0;
         std::from_chars(v.data(), v.data() + v.size(), x);
         if (!s.ok() || (c->trace_slower_than_ns == 0 && x > 0)) {
           return Status::Error("--trace-slower-than: \"" + std::string(v) +
                                "\" is not a number of seconds >= 0 (0: off)");
         }
         return s;
       }},
      {"ready-fd",
       [](std::string_view v, Config* c) {
         return SetUint("ready-fd", v, 0, INT32_MAX, &c->ready_fd);
       }},
      {"allow-gids",
       [](std::string_view v, Config* c) {
         return ParseIdList("allow-gids", v, &c->ingest.allow_gids);
       }},
  };
  return flags;
}

const Flag* FindFlag(std::string_view name) {
  for (const Flag& f : Flags()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

Status ParseBuckets(std::string_view suffix, std::string_view v,
                    Config* config) {
  std::vector<double> bounds;
  std::string text(v);
  for (char& ch : text) {
    if (ch == ',') ch = ' ';
  }
  std::istringstream in(text);
  std::string item;
  while (in >> item) {
    double x = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    if (ec != std::errc() || end != item.data() + item.size()) {
      return Status::Error("buckets." + std::string(suffix) + ": \"" + item +
                           "\" is not a number");
    }
    bounds.push_back(x);
  }
  // Check the name and the bounds here, so that the error names the file
  // and line (the registry applies the same rules).
  RegistryOptions one;
  one.buckets[std::string(suffix)] = bounds;
  std::unique_ptr<Registry> unused;
  if (Status s = Registry::Create(one, &unused); !s.ok()) return s;
  config->registry.buckets[std::string(suffix)] = std::move(bounds);
  return Status::Ok();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

Status ReadConfigFile(const std::string& path, Config* config) {
  std::ifstream in(path);
  if (!in) return Status::Error("cannot read config file \"" + path + "\"");
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string_view l = Trim(line);
    if (l.empty() || l.front() == '#') continue;
    const size_t eq = l.find('=');
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    if (eq == std::string_view::npos) {
      return Status::Error(where + "expected key = value");
    }
    // Keys are the flag names; metrics-v1.md spells them with '_' too
    // (native_histogram_schema), so '_' stands for '-' outside buckets.*.
    const std::string_view key = Trim(l.substr(0, eq));
    std::string flag(key);
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string_view value = Trim(l.substr(eq + 1));
    Status s = Status::Ok();
    if (key.substr(0, 8) == "buckets.") {
      s = ParseBuckets(key.substr(8), value, config);
    } else if (const Flag* f = FindFlag(flag);
               f != nullptr && flag != "config") {
      s = f->set(value, config);
    } else {
      return Status::Error(where + "unknown key \"" + std::string(key) + "\"");
    }
    if (!s.ok()) return Status::Error(where + s.message());
  }
  return Status::Ok();
}

}  // namespace

std::string_view UsageText() { return kUsage; }

Status FitConnectionCaps(uint64_t fd_limit, uint64_t fds_in_use, Config* config,
                         std::string* clamped) {
  clamped->clear();
  const uint64_t reserve = fds_in_use + kDaemonFdHeadroom;
  const uint64_t ingest = config->ingest.max_connections;
  const uint64_t http = config->http_max_connections;
  if (fd_limit < reserve + 2) {
    return Status::Error(
        "the file descriptor limit (RLIMIT_NOFILE) is " +
        std::to_string(fd_limit) + ": the daemon keeps " +
        std::to_string(reserve) + " for itself (" + std::to_string(fds_in_use) +
        " open at start, " + std::to_string(kDaemonFdHeadroom) +
        " more for its own use) and needs at least one more for each "
        "listener's connections; raise it (LimitNOFILE=, ulimit -n)");
  }
  const uint64_t available = fd_limit - reserve;
  if (ingest + http <= available) return Status::Ok();
  // Shrink both in proportion, each to at least 1.
  const uint64_t new_http =
      std::max<uint64_t>(1, http * available / (ingest + http));
  const uint64_t new_ingest = available - new_http;
  config->ingest.max_connections = uint32_t(new_ingest);
  config->http_max_connections = uint32_t(new_http);
  *clamped = "file descriptors: the limit (RLIMIT_NOFILE) of " +
             std::to_string(fd_limit) + " less " + std::to_string(reserve) +
             " kept for the daemon leaves " + std::to_string(available) +
             " for connections: --max-connections " + std::to_string(ingest) +
             " lowered to " + std::to_string(new_ingest) +
             ", --max-http-connections " + std::to_string(http) +
             " lowered to " + std::to_string(new_http) +
             " (raise LimitNOFILE= or ulimit -n, or lower the caps)";
  return Status::Ok();
}

Status CheckReadyFd(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) {
    return Status::Error("--ready-fd: " + std::to_string(fd) +
                         " is not an open file descriptor");
  }
  if ((flags & O_ACCMODE) == O_RDONLY) {
    return Status::Error("--ready-fd: " + std::to_string(fd) +
                         " is not open for writing");
  }
  return Status::Ok();
}

Status WriteReadyLine(int fd, std::string_view http_address,
                      std::string_view ingest_path) {
  const std::string line = "ready http=" + std::string(http_address) +
                           " ingest=" + std::string(ingest_path) + "\n";
  size_t done = 0;
  int err = 0;
  while (done < line.size()) {
    const ssize_t n = write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    done += size_t(n);
  }
  close(fd);
  if (err != 0) {
    return Status::Error("--ready-fd: cannot write to " + std::to_string(fd) +
                         ": " + std::strerror(err));
  }
  return Status::Ok();
}

Status ParseConfig(int argc, const char* const* argv, Config* config) {
  // Split into (name, value) pairs first so that --config can be read
  // before the flags that override it.
  std::vector<std::pair<std::string, std::string>> given;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      config->show_help = true;
      continue;
    }
    if (arg == "--version" || arg == "-V") {
      config->show_version = true;
      continue;
    }
    if (arg.substr(0, 2) != "--") {
      return Status::Error("unexpected argument \"" + std::string(arg) +
                           "\" (see --help)");
    }
    arg.remove_prefix(2);
    std::string name, value;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else {
      name = arg;
      const Flag* f = FindFlag(name);
      if (name != "config" && f == nullptr) {
        return Status::Error("unknown flag --" + name + " (see --help)");
      }
      if (f != nullptr && f->is_switch) {
        value = "true";
      } else {
        if (i + 1 >= argc) {
          return Status::Error("--" + name + " needs a value");
        }
        value = argv[++i];
      }
    }
    if (name != "config" && FindFlag(name) == nullptr) {
      return Status::Error("unknown flag --" + name + " (see --help)");
    }
    given.emplace_back(std::move(name), std::move(value));
  }
  for (const auto& [name, value] : given) {
    if (name == "config") {
      config->config_file = value;
      Status s = ReadConfigFile(value, config);
      if (!s.ok()) return s;
    }
  }
  std::vector<const Flag*> cleared;
  for (const auto& [name, value] : given) {
    if (name == "config") continue;
    const Flag* f = FindFlag(name);
    if (f->clear &&
        std::find(cleared.begin(), cleared.end(), f) == cleared.end()) {
      f->clear(config);  // the command line's list replaces the file's
      cleared.push_back(f);
    }
    Status s = f->set(value, config);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace tokenmeter::daemon
