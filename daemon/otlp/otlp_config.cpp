#include "daemon/otlp/otlp_config.h"

#include <curl/curl.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <memory>

extern char** environ;

namespace tokenmeter::daemon::otlp {
namespace {

constexpr std::string_view kPrefix = "OTEL_EXPORTER_OTLP_";

// The value in quotes, control characters as \xNN (an error stays one
// line).
std::string Quoted(std::string_view v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// RFC 9110 token characters.
bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') ||
                    std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
    if (!ok || c == '\0') return false;
  }
  return true;
}

bool HasControl(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

// One value looked up with its precedence: the flag, then the signal's
// variable, then the general one. `name` is what an error calls it.
struct Lookup {
  std::optional<std::string_view> value;
  std::string name;
  EndpointSource source = EndpointSource::kNone;
};

// Whether a found enum setting is `want`: a flag exactly, a variable in
// any case (the OpenTelemetry specification: enum values SHOULD be read
// case-insensitively).
bool Is(const Lookup& l, std::string_view want) {
  return l.source == EndpointSource::kFlag ? *l.value == want
                                           : EqualsIgnoreCase(*l.value, want);
}

std::optional<std::string_view> Env(const Environment& env,
                                    const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return std::string_view(it->second);
}

Lookup Find(const std::optional<std::string>& flag, std::string_view flag_name,
            const Environment& env, Signal signal, std::string_view suffix) {
  Lookup l;
  if (flag.has_value()) {
    l.value = *flag;
    l.name = std::string(flag_name);
    l.source = EndpointSource::kFlag;
    return l;
  }
  std::string specific(kPrefix);
  specific += signal == Signal::kTraces ? "TRACES_" : "METRICS_";
  specific += suffix;
  if (auto v = Env(env, specific)) {
    l.value = v;
    l.name = std::move(specific);
    l.source = EndpointSource::kSignalEnv;
    return l;
  }
  std::string general(kPrefix);
  general += suffix;
  if (auto v = Env(env, general)) {
    l.value = v;
    l.name = std::move(general);
    l.source = EndpointSource::kGeneralEnv;
  }
  return l;
}

Status Bad(const std::string& name, std::string_view value,
           std::string_view why) {
  return Status::Error(name + ": " + Quoted(value) + " " + std::string(why));
}

Status CheckUrl(const std::string& name, std::string_view url) {
  static constexpr std::string_view kWhy =
      "is not an http:// or https:// URL with a host";
  if (url.empty() || HasControl(url) || url.find(' ') != url.npos) {
    return Bad(name, url, kWhy);
  }
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> u(curl_url(),
                                                        &curl_url_cleanup);
  if (u == nullptr) return Status::Error(name + ": out of memory");
  const std::string copy(url);
  if (curl_url_set(u.get(), CURLUPART_URL, copy.c_str(), 0) != CURLUE_OK) {
    return Bad(name, url, kWhy);
  }
  char* scheme = nullptr;
  char* host = nullptr;
  bool ok =
      curl_url_get(u.get(), CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
      curl_url_get(u.get(), CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      host != nullptr && host[0] != '\0' &&
      (std::strcmp(scheme, "http") == 0 || std::strcmp(scheme, "https") == 0);
  curl_free(scheme);
  curl_free(host);
  // The scheme must also be written out: curl guesses "http" for
  // "collector:4318", which OpenTelemetry does not.
  const size_t colon = url.find("://");
  ok = ok && colon != url.npos &&
       (EqualsIgnoreCase(url.substr(0, colon), "http") ||
        EqualsIgnoreCase(url.substr(0, colon), "https"));
  return ok ? Status::Ok() : Bad(name, url, kWhy);
}

// Splits "k=v, k2=v2" into trimmed pairs (value not yet decoded). An item
// without '=' is an error; empty items are skipped.
Status SplitPairs(const std::string& name, std::string_view list,
                  bool quote_items, KeyValues* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == list.npos) comma = list.size();
    const std::string_view item = Trim(list.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == item.npos) {
      // A header item without '=' may be a secret pasted whole: name only
      // its position.
      return quote_items ? Bad(name, item, "is not key=value")
                         : Status::Error(name + ": item " +
                                         std::to_string(out->size() + 1) +
                                         " is not key=value");
    }
    out->emplace_back(std::string(Trim(item.substr(0, eq))),
                      std::string(Trim(item.substr(eq + 1))));
  }
  return Status::Ok();
}

void PutLast(KeyValues* list, std::string key, std::string value,
             bool ignore_case) {
  for (auto it = list->begin(); it != list->end(); ++it) {
    if (ignore_case ? EqualsIgnoreCase(it->first, key) : it->first == key) {
      list->erase(it);
      break;
    }
  }
  list->emplace_back(std::move(key), std::move(value));
}

Status ParseHeaders(const std::string& name, std::string_view text,
                    KeyValues* out) {
  KeyValues raw;
  Status s = SplitPairs(name, text, /*quote_items=*/false, &raw);
  if (!s.ok()) return s;
  KeyValues headers;
  for (auto& [key, value] : raw) {
    if (!IsToken(key)) {
      return Status::Error(name + ": header name " + Quoted(key) +
                           " is not an HTTP token");
    }
    std::string decoded;
    if (!PercentDecode(value, &decoded)) {
      return Status::Error(name + ": the value of header " + Quoted(key) +
                           " has a '%' not followed by two hex digits");
    }
    decoded = std::string(Trim(decoded));
    if (HasControl(decoded)) {
      return Status::Error(name + ": the value of header " + Quoted(key) +
                           " holds a control character");
    }
    PutLast(&headers, std::move(key), std::move(decoded), true);
  }
  *out = std::move(headers);
  return Status::Ok();
}

Status ParseResource(const Environment& env, const std::string& default_name,
                     const std::string& default_instance, KeyValues* out) {
  KeyValues attributes;
  if (auto text = Env(env, "OTEL_RESOURCE_ATTRIBUTES")) {
    static const std::string kName = "OTEL_RESOURCE_ATTRIBUTES";
    KeyValues raw;
    Status s = SplitPairs(kName, *text, /*quote_items=*/true, &raw);
    if (!s.ok()) return s;
    for (auto& [key, value] : raw) {
      std::string k, v;
      if (!PercentDecode(key, &k) || !PercentDecode(value, &v)) {
        return Bad(kName, key + "=" + value,
                   "has a '%' not followed by two hex digits");
      }
      if (k.empty()) return Bad(kName, key + "=" + value, "has an empty key");
      PutLast(&attributes, std::move(k), std::move(v), false);
    }
  }
  std::string service = default_name;
  for (auto it = attributes.begin(); it != attributes.end(); ++it) {
    if (it->first == "service.name") {
      service = std::move(it->second);
      attributes.erase(it);
      break;
    }
  }
  if (auto name = Env(env, "OTEL_SERVICE_NAME")) service = std::string(*name);
  attributes.insert(attributes.begin(), {"service.name", std::move(service)});
  if (!default_instance.empty() &&
      std::none_of(attributes.begin(), attributes.end(), [](const auto& kv) {
        return kv.first == "service.instance.id";
      })) {
    attributes.emplace_back("service.instance.id", default_instance);
  }
  *out = std::move(attributes);
  return Status::Ok();
}

}  // namespace

std::string_view OtlpConfig::content_type() const {
  return protocol == Protocol::kHttpJson ? "application/json"
                                         : "application/x-protobuf";
}

std::string_view SignalName(Signal signal) {
  return signal == Signal::kTraces ? "traces" : "metrics";
}

bool PercentDecode(std::string_view in, std::string* out) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      *out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hex(in[i + 1]);
    const int lo = hex(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

// Whether the OpenTelemetry variables turn `signal` off: OTEL_SDK_DISABLED
// "true", or OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER "none" (in any
// case). Other values of those are read as the SDKs' default (otlp).
bool OffByEnvironment(const Environment& env, Signal signal) {
  if (auto v = Env(env, "OTEL_SDK_DISABLED");
      v.has_value() && EqualsIgnoreCase(Trim(*v), "true")) {
    return true;
  }
  auto v = Env(env, signal == Signal::kTraces ? "OTEL_TRACES_EXPORTER"
                                              : "OTEL_METRICS_EXPORTER");
  return v.has_value() && EqualsIgnoreCase(Trim(*v), "none");
}

Status ParseOtlpConfig(Signal signal, const OtlpOverrides& overrides,
                       const Environment& env, OtlpConfig* out) {
  OtlpConfig c;
  const Lookup endpoint = Find(
      overrides.endpoint,
      signal == Signal::kTraces ? kTracesEndpointFlag : kMetricsEndpointFlag,
      env, signal, "ENDPOINT");
  // An endpoint from the environment is the SDKs' setting, which their
  // off switches override; a flag's is this daemon's own.
  if (!endpoint.value.has_value() ||
      (endpoint.source != EndpointSource::kFlag &&
       OffByEnvironment(env, signal))) {
    // Off. The flags are checked even so (a bad value given on the command
    // line is a mistake whether or not a signal uses it), by the rules
    // below without the environment (an OTEL_* value may be meant for
    // another program); the endpoint stands in for the one not given.
    OtlpOverrides flags = overrides;
    flags.endpoint = "http://off.invalid";
    OtlpConfig unused;
    Status s = ParseOtlpConfig(signal, flags, Environment(), &unused);
    if (!s.ok()) return s;
    *out = OtlpConfig();
    return Status::Ok();
  }
  Status s = CheckUrl(endpoint.name, *endpoint.value);
  if (!s.ok()) return s;
  c.endpoint = std::string(*endpoint.value);
  c.endpoint_source = endpoint.source;
  if (endpoint.source == EndpointSource::kGeneralEnv) {
    if (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
    c.endpoint += signal == Signal::kTraces ? "/v1/traces" : "/v1/metrics";
  }

  const Lookup protocol =
      Find(overrides.protocol, kProtocolFlag, env, signal, "PROTOCOL");
  if (protocol.value.has_value()) {
    if (Is(protocol, "http/protobuf")) {
      c.protocol = Protocol::kHttpProtobuf;
    } else if (Is(protocol, "http/json")) {
      c.protocol = Protocol::kHttpJson;
    } else if (Is(protocol, "grpc")) {
      return Bad(protocol.name, *protocol.value,
                 "is not supported (only http/protobuf or http/json)");
    } else {
      return Bad(protocol.name, *protocol.value,
                 "is not http/protobuf or http/json");
    }
  }

  const Lookup headers =
      Find(overrides.headers, kHeadersFlag, env, signal, "HEADERS");
  if (headers.value.has_value()) {
    s = ParseHeaders(headers.name, *headers.value, &c.headers);
    if (!s.ok()) return s;
  }

  const Lookup compression =
      Find(overrides.compression, kCompressionFlag, env, signal, "COMPRESSION");
  if (compression.value.has_value()) {
    if (Is(compression, "gzip")) {
      c.compression = Compression::kGzip;
    } else if (Is(compression, "none")) {
      c.compression = Compression::kNone;
    } else {
      return Bad(compression.name, *compression.value, "is not gzip or none");
    }
  }

  const Lookup timeout =
      Find(overrides.timeout_ms, kTimeoutFlag, env, signal, "TIMEOUT");
  if (timeout.value.has_value()) {
    const std::string_view v = *timeout.value;
    uint64_t ms = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), ms);
    if (ec != std::errc() || end != v.data() + v.size() || ms < 1 ||
        ms > kMaxTimeoutMs) {
      return Bad(timeout.name, v,
                 "is not a whole number of milliseconds from 1 to " +
                     std::to_string(kMaxTimeoutMs));
    }
    c.timeout_ns = ms * 1'000'000;
  }

  struct File {
    const std::optional<std::string>& flag;
    std::string_view flag_name;
    std::string_view suffix;
    std::string* field;
    std::string name;  // where the value came from
  };
  File files[] = {
      {overrides.certificate, kCertificateFlag, "CERTIFICATE",
       &c.certificate_file, ""},
      {overrides.client_certificate, kClientCertificateFlag,
       "CLIENT_CERTIFICATE", &c.client_certificate_file, ""},
      {overrides.client_key, kClientKeyFlag, "CLIENT_KEY", &c.client_key_file,
       ""},
  };
  for (File& f : files) {
    const Lookup l = Find(f.flag, f.flag_name, env, signal, f.suffix);
    if (!l.value.has_value()) continue;
    if (l.value->empty() || HasControl(*l.value)) {
      return Bad(l.name, *l.value, "is not a file path");
    }
    *f.field = std::string(*l.value);
    f.name = l.name;
  }
  // A certificate without its key (or the reverse) cannot be used.
  if (c.client_certificate_file.empty() != c.client_key_file.empty()) {
    const File& given = c.client_key_file.empty() ? files[1] : files[2];
    return Bad(given.name, *given.field,
               c.client_key_file.empty()
                   ? "is a client certificate without a client key"
                   : "is a client key without a client certificate");
  }

  s = ParseResource(env, overrides.default_service_name,
                    overrides.default_instance_id, &c.resource_attributes);
  if (!s.ok()) return s;
  *out = std::move(c);
  return Status::Ok();
}

Environment ProcessOtlpEnvironment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.substr(0, 5) != "OTEL_") continue;
    const size_t eq = entry.find('=');
    if (eq == entry.npos) continue;
    env.emplace(std::string(entry.substr(0, eq)),
                std::string(entry.substr(eq + 1)));
  }
  return env;
}

}  // namespace tokenmeter::daemon::otlp
