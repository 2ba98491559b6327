// ParseOtlpConfig: the OpenTelemetry precedence (flag > signal variable >
// general variable), the endpoint rule for each source, every value's
// syntax, the resource, and one test per bad input.
#include "daemon/otlp/otlp_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>
#include <vector>

namespace tokenmeter::daemon::otlp {
namespace {

OtlpConfig MustParse(Signal signal, const OtlpOverrides& o,
                     const Environment& env) {
  OtlpConfig c;
  Status s = ParseOtlpConfig(signal, o, env, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

std::string ErrorOf(Signal signal, const OtlpOverrides& o,
                    const Environment& env) {
  OtlpConfig c;
  c.endpoint = "untouched";
  Status s = ParseOtlpConfig(signal, o, env, &c);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(c.endpoint, "untouched") << "*out changed on error";
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  return s.message();
}

const Environment kBase = {{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"}};

Environment With(Environment env, const std::string& k, const std::string& v) {
  env[k] = v;
  return env;
}

TEST(OtlpConfigTest, OffWithoutAnyEndpoint) {
  OtlpConfig c = MustParse(Signal::kTraces, {}, {});
  EXPECT_FALSE(c.enabled());
  EXPECT_EQ(c.endpoint_source, EndpointSource::kNone);
}

TEST(OtlpConfigTest, OffIgnoresOtherBadValues) {
  OtlpConfig c = MustParse(Signal::kTraces, {},
                           {{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"}});
  EXPECT_FALSE(c.enabled());
}

// interfaces.md: "A bad value is a start-up error with one line": a flag
// is checked whether or not a signal is on (an OTEL_* variable only when
// it is, above).
TEST(OtlpConfigTest, OffStillRejectsBadFlags) {
  using Field = std::optional<std::string> OtlpOverrides::*;
  struct Case {
    Field field;
    const char* value;
    const char* part;
  };
  const Case cases[] = {
      {&OtlpOverrides::protocol, "grpc", "--otlp-protocol: \"grpc\""},
      {&OtlpOverrides::compression, "br", "--otlp-compression: \"br\""},
      {&OtlpOverrides::timeout_ms, "abc", "--otlp-timeout: \"abc\""},
      {&OtlpOverrides::headers, "badheader", "--otlp-headers"},
      {&OtlpOverrides::client_key, "/k.pem", "--otlp-client-key"},
      {&OtlpOverrides::certificate, "", "--otlp-certificate"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.part);
    OtlpOverrides o;
    o.*c.field = c.value;
    for (Signal signal : {Signal::kTraces, Signal::kMetrics}) {
      const std::string e = ErrorOf(signal, o, {});
      EXPECT_NE(e.find(c.part), std::string::npos) << e;
      EXPECT_EQ(e.find("off.invalid"), std::string::npos) << e;
    }
  }
  // Good flags alone: off, nothing kept.
  OtlpOverrides good;
  good.protocol = "http/json";
  good.timeout_ms = "500";
  good.certificate = "/nonexistent/ca.pem";  // files: checked when used
  const OtlpConfig c = MustParse(Signal::kTraces, good, {});
  EXPECT_FALSE(c.enabled());
  EXPECT_EQ(c.protocol, Protocol::kHttpProtobuf);
  EXPECT_TRUE(c.certificate_file.empty());
}

TEST(OtlpConfigTest, EndpointPrecedenceAndPaths) {
  struct Case {
    const char* name;
    Signal signal;
    std::optional<std::string> flag;
    Environment env;
    std::string want;
    EndpointSource source;
  };
  const std::vector<Case> cases = {
      {"general + /v1/traces",
       Signal::kTraces,
       {},
       kBase,
       "http://c:4318/v1/traces",
       EndpointSource::kGeneralEnv},
      {"general + /v1/metrics",
       Signal::kMetrics,
       {},
       kBase,
       "http://c:4318/v1/metrics",
       EndpointSource::kGeneralEnv},
      {"general with a trailing slash",
       Signal::kTraces,
       {},
       {{"OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318/"}},
       "https://c:4318/v1/traces",
       EndpointSource::kGeneralEnv},
      {"general with a path",
       Signal::kTraces,
       {},
       {{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/otlp"}},
       "http://c:4318/otlp/v1/traces",
       EndpointSource::kGeneralEnv},
      {"signal-specific used as is",
       Signal::kTraces,
       {},
       With(kBase, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
       "http://t:1/x",
       EndpointSource::kSignalEnv},
      {"signal-specific without a path",
       Signal::kMetrics,
       {},
       With(kBase, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:2"),
       "http://m:2",
       EndpointSource::kSignalEnv},
      {"the other signal's variable is ignored",
       Signal::kMetrics,
       {},
       With(kBase, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
       "http://c:4318/v1/metrics",
       EndpointSource::kGeneralEnv},
      {"flag over both", Signal::kTraces, "https://f:9/p",
       With(kBase, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
       "https://f:9/p", EndpointSource::kFlag},
      {"empty signal variable counts as unset",
       Signal::kTraces,
       {},
       With(kBase, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
       "http://c:4318/v1/traces",
       EndpointSource::kGeneralEnv},
      {"IPv6 literal",
       Signal::kTraces,
       "http://[::1]:4318/v1/traces",
       {},
       "http://[::1]:4318/v1/traces",
       EndpointSource::kFlag},
      {"upper-case scheme",
       Signal::kTraces,
       "HTTP://c:1/v1/traces",
       {},
       "HTTP://c:1/v1/traces",
       EndpointSource::kFlag},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(t.name);
    OtlpOverrides o;
    o.endpoint = t.flag;
    OtlpConfig c = MustParse(t.signal, o, t.env);
    EXPECT_EQ(c.endpoint, t.want);
    EXPECT_EQ(c.endpoint_source, t.source);
  }
}

TEST(OtlpConfigTest, Defaults) {
  OtlpConfig c = MustParse(Signal::kTraces, {}, kBase);
  EXPECT_EQ(c.protocol, Protocol::kHttpProtobuf);
  EXPECT_EQ(c.content_type(), "application/x-protobuf");
  EXPECT_EQ(c.compression, Compression::kNone);
  EXPECT_EQ(c.timeout_ns, 10'000'000'000u);
  EXPECT_TRUE(c.headers.empty());
  EXPECT_TRUE(c.certificate_file.empty());
  EXPECT_TRUE(c.client_certificate_file.empty());
  EXPECT_TRUE(c.client_key_file.empty());
  ASSERT_EQ(c.resource_attributes.size(), 1u);
  EXPECT_EQ(c.resource_attributes[0].first, "service.name");
  EXPECT_EQ(c.resource_attributes[0].second, "unknown_service:tokenmeterd");
}

// Every setting but the endpoint: flag > signal > general, for each.
TEST(OtlpConfigTest, SettingPrecedence) {
  Environment env = kBase;
  env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf";
  env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/json";
  env["OTEL_EXPORTER_OTLP_COMPRESSION"] = "none";
  env["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"] = "gzip";
  env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1000";
  env["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"] = "2000";
  env["OTEL_EXPORTER_OTLP_HEADERS"] = "a=general";
  env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = "b=traces";
  env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = "/g/ca.pem";
  env["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"] = "/t/ca.pem";
  env["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"] = "/g/c.pem";
  env["OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"] = "/t/c.pem";
  env["OTEL_EXPORTER_OTLP_CLIENT_KEY"] = "/g/k.pem";
  env["OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"] = "/t/k.pem";

  // Signal-specific over general (and metrics sees only the general ones).
  OtlpConfig t = MustParse(Signal::kTraces, {}, env);
  EXPECT_EQ(t.protocol, Protocol::kHttpJson);
  EXPECT_EQ(t.content_type(), "application/json");
  EXPECT_EQ(t.compression, Compression::kGzip);
  EXPECT_EQ(t.timeout_ns, 2'000'000'000u);
  ASSERT_EQ(t.headers.size(), 1u);  // Replaced, not merged.
  EXPECT_EQ(t.headers[0],
            std::make_pair(std::string("b"), std::string("traces")));
  EXPECT_EQ(t.certificate_file, "/t/ca.pem");
  EXPECT_EQ(t.client_certificate_file, "/t/c.pem");
  EXPECT_EQ(t.client_key_file, "/t/k.pem");

  OtlpConfig m = MustParse(Signal::kMetrics, {}, env);
  EXPECT_EQ(m.protocol, Protocol::kHttpProtobuf);
  EXPECT_EQ(m.compression, Compression::kNone);
  EXPECT_EQ(m.timeout_ns, 1'000'000'000u);
  ASSERT_EQ(m.headers.size(), 1u);
  EXPECT_EQ(m.headers[0].second, "general");
  EXPECT_EQ(m.certificate_file, "/g/ca.pem");
  EXPECT_EQ(m.client_certificate_file, "/g/c.pem");
  EXPECT_EQ(m.client_key_file, "/g/k.pem");

  // Flags over both.
  OtlpOverrides o;
  o.protocol = "http/protobuf";
  o.compression = "none";
  o.timeout_ms = "3000";
  o.headers = "c=flag";
  o.certificate = "/f/ca.pem";
  o.client_certificate = "/f/c.pem";
  o.client_key = "/f/k.pem";
  OtlpConfig f = MustParse(Signal::kTraces, o, env);
  EXPECT_EQ(f.protocol, Protocol::kHttpProtobuf);
  EXPECT_EQ(f.compression, Compression::kNone);
  EXPECT_EQ(f.timeout_ns, 3'000'000'000u);
  ASSERT_EQ(f.headers.size(), 1u);
  EXPECT_EQ(f.headers[0].first, "c");
  EXPECT_EQ(f.certificate_file, "/f/ca.pem");
  EXPECT_EQ(f.client_certificate_file, "/f/c.pem");
  EXPECT_EQ(f.client_key_file, "/f/k.pem");
}

TEST(OtlpConfigTest, HeadersAreTrimmedDecodedAndLastWins) {
  OtlpOverrides o;
  o.headers =
      " api-key = secret%20value ,x-b=%2C%3D%25 ,, "
      "Authorization=Basic%20dTpw,API-KEY=second, empty=";
  OtlpConfig c = MustParse(Signal::kTraces, o, kBase);
  const KeyValues want = {{"x-b", ",=%"},
                          {"Authorization", "Basic dTpw"},
                          {"API-KEY", "second"},
                          {"empty", ""}};
  EXPECT_EQ(c.headers, want);
}

TEST(OtlpConfigTest, HeaderValueMayHoldEqualsAndPlus) {
  OtlpOverrides o;
  o.headers = "k=a=b+c";
  OtlpConfig c = MustParse(Signal::kTraces, o, kBase);
  ASSERT_EQ(c.headers.size(), 1u);
  EXPECT_EQ(c.headers[0].second, "a=b+c");
}

TEST(OtlpConfigTest, TimeoutBounds) {
  OtlpOverrides o;
  o.timeout_ms = "1";
  EXPECT_EQ(MustParse(Signal::kTraces, o, kBase).timeout_ns, 1'000'000u);
  o.timeout_ms = std::to_string(kMaxTimeoutMs);
  EXPECT_EQ(MustParse(Signal::kTraces, o, kBase).timeout_ns,
            kMaxTimeoutMs * 1'000'000);
}

TEST(OtlpConfigTest, ResourceAttributes) {
  Environment env = kBase;
  env["OTEL_RESOURCE_ATTRIBUTES"] =
      "deployment.environment=prod, host.name = h%201 ,k%3D=v%2C,"
      "deployment.environment=staging";
  OtlpConfig c = MustParse(Signal::kTraces, {}, env);
  const KeyValues want = {{"service.name", "unknown_service:tokenmeterd"},
                          {"host.name", "h 1"},
                          {"k=", "v,"},
                          {"deployment.environment", "staging"}};
  EXPECT_EQ(c.resource_attributes, want);
}

TEST(OtlpConfigTest, ServiceNamePrecedence) {
  Environment env = kBase;
  OtlpOverrides o;
  o.default_service_name = "tokenmeterd-default";
  EXPECT_EQ(MustParse(Signal::kTraces, o, env).resource_attributes[0].second,
            "tokenmeterd-default");
  env["OTEL_RESOURCE_ATTRIBUTES"] = "a=1,service.name=from-attrs";
  OtlpConfig c = MustParse(Signal::kTraces, o, env);
  const KeyValues want = {{"service.name", "from-attrs"}, {"a", "1"}};
  EXPECT_EQ(c.resource_attributes, want);
  env["OTEL_SERVICE_NAME"] = "from-service-name";
  c = MustParse(Signal::kTraces, o, env);
  const KeyValues want2 = {{"service.name", "from-service-name"}, {"a", "1"}};
  EXPECT_EQ(c.resource_attributes, want2);
  env["OTEL_SERVICE_NAME"] = "";  // Empty: unset.
  EXPECT_EQ(MustParse(Signal::kTraces, o, env).resource_attributes[0].second,
            "from-attrs");
}

// The metrics push's default service.instance.id: last, unless
// OTEL_RESOURCE_ATTRIBUTES names one; none when the default is empty.
TEST(OtlpConfigTest, DefaultInstanceIdUnlessTheAttributesNameOne) {
  Environment env = kBase;
  OtlpOverrides o;
  EXPECT_EQ(MustParse(Signal::kMetrics, o, env).resource_attributes,
            (KeyValues{{"service.name", "unknown_service:tokenmeterd"}}));
  o.default_instance_id = "gpu-7:10062";
  env["OTEL_RESOURCE_ATTRIBUTES"] = "a=1";
  EXPECT_EQ(MustParse(Signal::kMetrics, o, env).resource_attributes,
            (KeyValues{{"service.name", "unknown_service:tokenmeterd"},
                       {"a", "1"},
                       {"service.instance.id", "gpu-7:10062"}}));
  env["OTEL_RESOURCE_ATTRIBUTES"] = "service.instance.id=mine,a=1";
  EXPECT_EQ(MustParse(Signal::kMetrics, o, env).resource_attributes,
            (KeyValues{{"service.name", "unknown_service:tokenmeterd"},
                       {"service.instance.id", "mine"},
                       {"a", "1"}}));
}

TEST(OtlpConfigTest, RejectsBadEndpoints) {
  struct Case {
    std::optional<std::string> flag;
    Environment env;
    std::string want;  // the error's beginning
  };
  const std::vector<Case> cases = {
      {"ftp://c:1/x", {}, "--otlp-endpoint: \"ftp://c:1/x\" is not"},
      {"c:4318", {}, "--otlp-endpoint: \"c:4318\" is not"},
      {"http://", {}, "--otlp-endpoint: \"http://\" is not"},
      {"", {}, "--otlp-endpoint: \"\" is not"},
      {"http://c:1/a b", {}, "--otlp-endpoint: \"http://c:1/a b\" is not"},
      {"http://c:99999", {}, "--otlp-endpoint: \"http://c:99999\" is not"},
      {{},
       {{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://x"}},
       "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: \"grpc://x\" is not"},
      {{},
       {{"OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"}},
       "OTEL_EXPORTER_OTLP_ENDPOINT: \"localhost:4318\" is not"},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(t.want);
    OtlpOverrides o;
    o.endpoint = t.flag;
    EXPECT_EQ(ErrorOf(Signal::kTraces, o, t.env).rfind(t.want, 0), 0u)
        << ErrorOf(Signal::kTraces, o, t.env);
  }
  OtlpOverrides o;
  o.endpoint = "nope";
  EXPECT_EQ(
      ErrorOf(Signal::kMetrics, o, {}).rfind("--otlp-metrics-endpoint", 0), 0u);
}

TEST(OtlpConfigTest, RejectsBadProtocol) {
  EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                    With(kBase, "OTEL_EXPORTER_OTLP_PROTOCOL", "http/xml")),
            "OTEL_EXPORTER_OTLP_PROTOCOL: \"http/xml\" is not http/protobuf "
            "or http/json");
  OtlpOverrides o;
  o.protocol = "grpc";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-protocol: \"grpc\" is not supported (only http/protobuf "
            "or http/json)");
}

// The SDKs' off switches turn off a signal whose endpoint comes from the
// environment (OTEL_SDK_DISABLED=true; OTEL_<SIGNAL>_EXPORTER=none), not
// one given by flag; other exporter values are the default (otlp).
TEST(OtlpConfigTest, SdkOffSwitchesTurnAnEnvironmentEndpointOff) {
  OtlpConfig t, m;
  // Both signals from `env`, each parsed without error.
  const auto parse_both = [&](const Environment& env) {
    EXPECT_TRUE(ParseOtlpConfig(Signal::kTraces, {}, env, &t).ok());
    EXPECT_TRUE(ParseOtlpConfig(Signal::kMetrics, {}, env, &m).ok());
  };
  parse_both(With(kBase, "OTEL_TRACES_EXPORTER", "none"));
  EXPECT_FALSE(t.enabled());
  EXPECT_TRUE(m.enabled());
  parse_both(With(kBase, "OTEL_METRICS_EXPORTER", " NONE "));
  EXPECT_TRUE(t.enabled());
  EXPECT_FALSE(m.enabled());
  Environment env = With(kBase, "OTEL_SDK_DISABLED", "True");
  // Off: the other variables are not read, a bad one included.
  env["OTEL_EXPORTER_OTLP_COMPRESSION"] = "zstd";
  parse_both(env);
  EXPECT_FALSE(t.enabled());
  EXPECT_FALSE(m.enabled());
  // A flag's endpoint is this daemon's own setting.
  OtlpOverrides o;
  o.endpoint = "http://flag:4318/v1/traces";
  ASSERT_TRUE(ParseOtlpConfig(Signal::kTraces, o,
                              With(kBase, "OTEL_TRACES_EXPORTER", "none"), &t)
                  .ok());
  EXPECT_EQ(t.endpoint, "http://flag:4318/v1/traces");
  // Anything else is the default exporter.
  for (const char* v : {"otlp", "console", "false"}) {
    SCOPED_TRACE(v);
    env = With(kBase, "OTEL_TRACES_EXPORTER", v);
    env["OTEL_SDK_DISABLED"] = v;
    ASSERT_TRUE(ParseOtlpConfig(Signal::kTraces, {}, env, &t).ok());
    EXPECT_TRUE(t.enabled());
  }
}

// OpenTelemetry: enum values of the variables are read in any case; a
// flag takes the documented spelling only.
TEST(OtlpConfigTest, VariableEnumValuesIgnoreCase) {
  OtlpConfig c;
  Environment env = With(kBase, "OTEL_EXPORTER_OTLP_PROTOCOL", "HTTP/JSON");
  env["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"] = "Gzip";
  ASSERT_TRUE(ParseOtlpConfig(Signal::kTraces, {}, env, &c).ok());
  EXPECT_EQ(c.protocol, Protocol::kHttpJson);
  EXPECT_EQ(c.compression, Compression::kGzip);
  EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                    With(kBase, "OTEL_EXPORTER_OTLP_PROTOCOL", "GRPC")),
            "OTEL_EXPORTER_OTLP_PROTOCOL: \"GRPC\" is not supported (only "
            "http/protobuf or http/json)");
  OtlpOverrides o;
  o.protocol = "HTTP/JSON";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-protocol: \"HTTP/JSON\" is not http/protobuf or "
            "http/json");
}

TEST(OtlpConfigTest, RejectsBadCompression) {
  EXPECT_EQ(
      ErrorOf(Signal::kMetrics, {},
              With(kBase, "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "zstd")),
      "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION: \"zstd\" is not gzip or none");
  OtlpOverrides o;
  o.compression = "GZIP";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-compression: \"GZIP\" is not gzip or none");
}

TEST(OtlpConfigTest, RejectsBadTimeouts) {
  for (const char* v :
       {"0", "-1", "10s", "1.5", " 10", "3600001", "99999999999999999999999"}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                      With(kBase, "OTEL_EXPORTER_OTLP_TIMEOUT", v)),
              std::string("OTEL_EXPORTER_OTLP_TIMEOUT: \"") + v +
                  "\" is not a whole number of milliseconds from 1 to "
                  "3600000");
  }
  OtlpOverrides o;
  o.timeout_ms = "";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase).rfind("--otlp-timeout: \"\"", 0),
            0u);
}

TEST(OtlpConfigTest, RejectsHeaderWithoutEqualsWithoutEchoingIt) {
  const std::string e =
      ErrorOf(Signal::kTraces, {},
              With(kBase, "OTEL_EXPORTER_OTLP_HEADERS", "a=1,Bearer secret"));
  EXPECT_EQ(e, "OTEL_EXPORTER_OTLP_HEADERS: item 2 is not key=value");
}

TEST(OtlpConfigTest, RejectsHeaderNameThatIsNoToken) {
  OtlpOverrides o;
  o.headers = "bad name=1";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-headers: header name \"bad name\" is not an HTTP token");
  o.headers = "=1";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-headers: header name \"\" is not an HTTP token");
}

TEST(OtlpConfigTest, RejectsBadPercentEscapeInHeaderWithoutTheValue) {
  for (const char* v : {"key=sec%zzret", "key=secret%", "key=secret%4"}) {
    SCOPED_TRACE(v);
    const std::string e = ErrorOf(Signal::kTraces, {},
                                  With(kBase, "OTEL_EXPORTER_OTLP_HEADERS", v));
    EXPECT_EQ(e,
              "OTEL_EXPORTER_OTLP_HEADERS: the value of header \"key\" has a "
              "'%' not followed by two hex digits");
    EXPECT_EQ(e.find("secret"), std::string::npos);
  }
}

TEST(OtlpConfigTest, RejectsHeaderInjection) {
  OtlpOverrides o;
  o.headers = "k=a%0D%0AHost: evil";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-headers: the value of header \"k\" holds a control "
            "character");
}

TEST(OtlpConfigTest, RejectsBadResourceAttributes) {
  EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                    With(kBase, "OTEL_RESOURCE_ATTRIBUTES", "a=1,b")),
            "OTEL_RESOURCE_ATTRIBUTES: \"b\" is not key=value");
  EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                    With(kBase, "OTEL_RESOURCE_ATTRIBUTES", "a=%G1")),
            "OTEL_RESOURCE_ATTRIBUTES: \"a=%G1\" has a '%' not followed by "
            "two hex digits");
  EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                    With(kBase, "OTEL_RESOURCE_ATTRIBUTES", " =v")),
            "OTEL_RESOURCE_ATTRIBUTES: \"=v\" has an empty key");
}

TEST(OtlpConfigTest, RejectsEmptyOrControlCertificatePaths) {
  OtlpOverrides o;
  o.certificate = "";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-certificate: \"\" is not a file path");
  EXPECT_EQ(ErrorOf(Signal::kTraces, {},
                    With(kBase, "OTEL_EXPORTER_OTLP_CLIENT_KEY", "/a\nb")),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY: \"/a\\x0ab\" is not a file path");
}

TEST(OtlpConfigTest, RejectsClientCertificateWithoutKeyAndTheReverse) {
  OtlpOverrides o;
  o.client_certificate = "/c.pem";
  EXPECT_EQ(ErrorOf(Signal::kTraces, o, kBase),
            "--otlp-client-certificate: \"/c.pem\" is a client certificate "
            "without a client key");
  EXPECT_EQ(
      ErrorOf(Signal::kTraces, {},
              With(kBase, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/k.pem")),
      "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY: \"/k.pem\" is a client key "
      "without a client certificate");
}

TEST(OtlpConfigTest, PercentDecode) {
  std::string out;
  EXPECT_TRUE(PercentDecode("a%41%2c+%7E", &out));
  EXPECT_EQ(out, "aA,+~");
  EXPECT_TRUE(PercentDecode("", &out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(PercentDecode("%", &out));
  EXPECT_FALSE(PercentDecode("%4", &out));
  EXPECT_FALSE(PercentDecode("%4g", &out));
}

TEST(OtlpConfigTest, ProcessEnvironmentReadsOnlyOtelVariables) {
  ASSERT_EQ(setenv("OTEL_TOKENMETER_TEST_X", "a=b", 1), 0);
  ASSERT_EQ(setenv("TOKENMETER_OTEL_TEST_Y", "c", 1), 0);
  const Environment env = ProcessOtlpEnvironment();
  unsetenv("OTEL_TOKENMETER_TEST_X");
  unsetenv("TOKENMETER_OTEL_TEST_Y");
  ASSERT_EQ(env.count("OTEL_TOKENMETER_TEST_X"), 1u);
  EXPECT_EQ(env.at("OTEL_TOKENMETER_TEST_X"), "a=b");
  EXPECT_EQ(env.count("TOKENMETER_OTEL_TEST_Y"), 0u);
  for (const auto& [k, v] : env) EXPECT_EQ(k.rfind("OTEL_", 0), 0u) << k;
}

}  // namespace
}  // namespace tokenmeter::daemon::otlp
