// tokenmeterd's flags and configuration file (daemon/config.h): defaults,
// both flag spellings, one error per bad value naming its flag, and the
// file's syntax, precedence and file:line errors.
#include "daemon/config.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/store/profile.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {
namespace {

constexpr uint64_t kSecond = 1'000'000'000;

// Runs ParseConfig on {"tokenmeterd", args...}.
Status Parse(const std::vector<std::string>& args, Config* config) {
  std::vector<const char*> argv = {"tokenmeterd"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseConfig(int(argv.size()), argv.data(), config);
}

Config MustParse(const std::vector<std::string>& args) {
  Config c;
  const Status s = Parse(args, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class TempConfigFile {
 public:
  explicit TempConfigFile(const std::string& contents) {
    char tmpl[] = "/tmp/tm_config_XXXXXX";
    const int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    if (fd >= 0) close(fd);
    path_ = tmpl;
    std::ofstream(path_, std::ios::trunc) << contents;
  }
  ~TempConfigFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ConfigTest, Defaults) {
  const Config c = MustParse({});
  EXPECT_EQ(c.ingest_path, "/run/tokenmeter/ingest.sock");
  EXPECT_EQ(c.listen, ":10062");
  EXPECT_EQ(c.log_interval_ns, 10'000'000'000u);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.config_file, "");
  EXPECT_EQ(c.ingest.namespace_override, "");
  EXPECT_EQ(c.registry.max_model_len, 32768u);
  EXPECT_TRUE(c.registry.buckets.empty());
  EXPECT_EQ(c.registry.max_engine_series, 4096u);
  EXPECT_EQ(c.registry.max_moe_layers, 262144u);
  EXPECT_EQ(c.tracker.max_requests, 1'000'000u);
  EXPECT_EQ(c.tracker.idle_timeout_ns, 600 * kSecond);
  EXPECT_EQ(c.tracker.grace_ns, 2 * kSecond);
  EXPECT_EQ(c.tracker.max_future_ns, kSecond);
  EXPECT_EQ(c.tracker.max_past_ns, 3600 * kSecond);
  EXPECT_EQ(c.ingest.limits.max_frame_bytes, 1024u * 1024u);
  EXPECT_EQ(c.ingest.limits.max_batch_events, 65536u);
  EXPECT_EQ(c.ingest.max_connections, 1024u);
  EXPECT_EQ(c.ingest.max_connections_per_uid, 256u);
  EXPECT_EQ(c.ingest.hello_timeout_ns, 10 * kSecond);
  EXPECT_EQ(c.http_max_connections, 256u);
  EXPECT_EQ(c.ingest.group, "");
  EXPECT_TRUE(c.ingest.allow_uids.empty());
  EXPECT_TRUE(c.ingest.allow_gids.empty());
  EXPECT_EQ(c.ready_fd, -1);
  EXPECT_FALSE(c.show_help);
  EXPECT_FALSE(c.show_version);
}

struct FlagCase {
  std::string flag;
  std::string value;
  std::function<void(const Config&)> check;
};

TEST(ConfigTest, EveryFlagInBothSpellings) {
  const FlagCase cases[] = {
      {"ingest", "/tmp/x.sock",
       [](const Config& c) { EXPECT_EQ(c.ingest_path, "/tmp/x.sock"); }},
      {"ingest", "/" + std::string(106, 'a'),  // the longest: 107 bytes
       [](const Config& c) { EXPECT_EQ(c.ingest_path.size(), 107u); }},
      {"listen", "127.0.0.1:0",
       [](const Config& c) { EXPECT_EQ(c.listen, "127.0.0.1:0"); }},
      {"listen", "[::1]:9000",
       [](const Config& c) { EXPECT_EQ(c.listen, "[::1]:9000"); }},
      {"log-interval", "2.5",
       [](const Config& c) { EXPECT_EQ(c.log_interval_ns, 2'500'000'000u); }},
      {"log-interval", "0",
       [](const Config& c) { EXPECT_EQ(c.log_interval_ns, 0u); }},
      {"namespace", "my_ns1",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.namespace_override, "my_ns1");
       }},
      {"max-model-len", "4096",
       [](const Config& c) { EXPECT_EQ(c.registry.max_model_len, 4096u); }},
      {"log-level", "debug",
       [](const Config& c) { EXPECT_EQ(c.log_level, "debug"); }},
      {"max-requests", "10",
       [](const Config& c) { EXPECT_EQ(c.tracker.max_requests, 10u); }},
      {"request-idle-timeout", "30",
       [](const Config& c) {
         EXPECT_EQ(c.tracker.idle_timeout_ns, 30 * kSecond);
       }},
      {"finished-grace", "0.5",
       [](const Config& c) { EXPECT_EQ(c.tracker.grace_ns, kSecond / 2); }},
      {"finished-grace", "0",
       [](const Config& c) { EXPECT_EQ(c.tracker.grace_ns, 0u); }},
      {"max-frame-bytes", "2048",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.limits.max_frame_bytes, 2048u);
       }},
      {"max-batch-events", "100",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.limits.max_batch_events, 100u);
       }},
      {"max-connections", "7",
       [](const Config& c) { EXPECT_EQ(c.ingest.max_connections, 7u); }},
      {"max-http-connections", "9",
       [](const Config& c) { EXPECT_EQ(c.http_max_connections, 9u); }},
      {"max-connections-per-uid", "3",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.max_connections_per_uid, 3u);
       }},
      {"max-connections-per-uid", "1048576",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.max_connections_per_uid, 1048576u);
       }},
      {"hello-timeout", "2.5",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.hello_timeout_ns, 2'500'000'000u);
       }},
      {"hello-timeout", "1",
       [](const Config& c) { EXPECT_EQ(c.ingest.hello_timeout_ns, kSecond); }},
      {"max-engine-series", "11",
       [](const Config& c) { EXPECT_EQ(c.registry.max_engine_series, 11u); }},
      {"max-moe-layers", "0",
       [](const Config& c) { EXPECT_EQ(c.registry.max_moe_layers, 0u); }},
      {"max-moe-layers", "16777216",
       [](const Config& c) {
         EXPECT_EQ(c.registry.max_moe_layers, 16777216u);
       }},
      {"ingest-group", "tokenmeter",
       [](const Config& c) { EXPECT_EQ(c.ingest.group, "tokenmeter"); }},
      {"allow-uids", "0",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.allow_uids, std::vector<uint32_t>{0});
       }},
      {"allow-uids", "1000, 1001,4294967294",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.allow_uids,
                   (std::vector<uint32_t>{1000, 1001, 4294967294u}));
         EXPECT_TRUE(c.ingest.allow_gids.empty());
       }},
      {"ready-fd", "3", [](const Config& c) { EXPECT_EQ(c.ready_fd, 3); }},
      {"ready-fd", "0", [](const Config& c) { EXPECT_EQ(c.ready_fd, 0); }},
      {"ready-fd", "2147483647",
       [](const Config& c) { EXPECT_EQ(c.ready_fd, 2147483647); }},
      {"allow-gids", "5,6",
       [](const Config& c) {
         EXPECT_EQ(c.ingest.allow_gids, (std::vector<uint32_t>{5, 6}));
         EXPECT_TRUE(c.ingest.allow_uids.empty());
       }},
  };
  for (const FlagCase& c : cases) {
    {
      SCOPED_TRACE("--" + c.flag + " " + c.value);
      c.check(MustParse({"--" + c.flag, c.value}));
    }
    {
      SCOPED_TRACE("--" + c.flag + "=" + c.value);
      c.check(MustParse({"--" + c.flag + "=" + c.value}));
    }
  }
}

TEST(ConfigTest, HelpAndVersion) {
  EXPECT_TRUE(MustParse({"--help"}).show_help);
  EXPECT_TRUE(MustParse({"-h"}).show_help);
  EXPECT_TRUE(MustParse({"--version"}).show_version);
  EXPECT_TRUE(MustParse({"-V"}).show_version);
  EXPECT_TRUE(Contains(std::string(UsageText()), "--version, -V"));
  EXPECT_FALSE(UsageText().empty());
  for (const char* flag : {"--ingest",
                           "--listen",
                           "--log-interval",
                           "--namespace",
                           "--max-model-len",
                           "--config",
                           "--log-level",
                           "--max-requests",
                           "--request-idle-timeout",
                           "--finished-grace",
                           "--max-frame-bytes",
                           "--max-batch-events",
                           "--max-connections",
                           "--max-http-connections",
                           "--max-engine-series",
                           "--max-moe-layers",
                           "--ingest-group",
                           "--allow-uids",
                           "--allow-gids",
                           "--ready-fd",
                           "--version",
                           "--help"}) {
    EXPECT_TRUE(Contains(std::string(UsageText()), flag)) << flag;
  }
}

TEST(ConfigTest, LaterFlagWins) {
  const Config c = MustParse({"--max-requests", "5", "--max-requests=6"});
  EXPECT_EQ(c.tracker.max_requests, 6u);
}

struct BadValueCase {
  std::string flag;
  std::string value;
};

TEST(ConfigTest, EveryBadValueNamesItsFlag) {
  const BadValueCase cases[] = {
      {"ingest", ""},
      {"ingest", "/" + std::string(107, 'a')},  // 108 bytes: no NUL room
      {"log-interval", "-1"},
      {"log-interval", "abc"},
      {"log-interval", "1s"},
      {"log-interval", "inf"},
      {"log-interval", "nan"},
      {"log-interval", "1e8"},
      {"log-interval", ""},
      {"namespace", "1abc"},
      {"namespace", "a-b"},
      {"namespace", "a:b"},
      {"namespace", ""},
      {"max-model-len", "0"},
      {"max-model-len", "-5"},
      {"max-model-len", "12x"},
      {"max-model-len", "1.5"},
      {"max-model-len", ""},
      {"max-model-len", "1099511627777"},  // 2^40 + 1
      {"max-model-len", "99999999999999999999999"},
      {"max-requests", "0"},
      {"max-requests", "100000001"},
      {"max-requests", " 5"},
      {"request-idle-timeout", "0.5"},
      {"request-idle-timeout", "x"},
      {"finished-grace", "-0.1"},
      {"finished-grace", "2 s"},
      {"max-frame-bytes", "1023"},
      {"max-frame-bytes", "67108865"},
      {"max-batch-events", "0"},
      {"max-batch-events", "16777217"},
      {"max-connections", "0"},
      {"max-connections", "1048577"},
      {"max-http-connections", "0"},
      {"max-http-connections", "65537"},
      {"max-connections-per-uid", "0"},
      {"max-connections-per-uid", "1048577"},
      {"max-connections-per-uid", "-1"},
      {"max-connections-per-uid", "x"},
      {"hello-timeout", "0"},
      {"hello-timeout", "0.5"},
      {"hello-timeout", "-1"},
      {"hello-timeout", "1e8"},
      {"hello-timeout", "10s"},
      {"hello-timeout", ""},
      {"max-engine-series", "0"},
      {"max-engine-series", "16777217"},
      {"max-moe-layers", "16777217"},
      {"max-moe-layers", "-1"},
      {"max-moe-layers", "1e3"},
      {"max-moe-layers", ""},
      {"ingest-group", ""},
      {"allow-uids", ""},
      {"allow-uids", "1,"},
      {"allow-uids", ",1"},
      {"allow-uids", "1,,2"},
      {"allow-uids", "-1"},
      {"allow-uids", "root"},
      {"allow-uids", "4294967295"},
      {"allow-uids", "4294967296"},
      {"allow-gids", "1;2"},
      {"allow-gids", "1.5"},
      {"ready-fd", "-1"},
      {"ready-fd", ""},
      {"ready-fd", "x"},
      {"ready-fd", "3.0"},
      {"ready-fd", "2147483648"},
  };
  for (const BadValueCase& c : cases) {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--" + c.flag, c.value},
          std::vector<std::string>{"--" + c.flag + "=" + c.value}}) {
      SCOPED_TRACE(args.size() == 2 ? args[0] + " '" + args[1] + "'"
                                    : "'" + args[0] + "'");
      Config config;
      const Status s = Parse(args, &config);
      EXPECT_FALSE(s.ok());
      EXPECT_TRUE(Contains(s.message(), "--" + c.flag)) << s.message();
    }
  }
}

// --listen's syntax is checked with the flags (a bad flag, exit 2); what
// HOST is (address or name) only when the daemon listens.
TEST(ConfigTest, ListenSyntax) {
  for (const char* ok : {":10062", "127.0.0.1:0", "[::1]:80", "[::]:65535",
                         "localhost:9090", "no-such-host.invalid:1"}) {
    EXPECT_EQ(MustParse({"--listen", ok}).listen, ok);
  }
  struct Bad {
    const char* value;
    const char* why;
  };
  for (const Bad& b :
       {Bad{":99999", "bad port \"99999\" (want 0-65535)"},
        Bad{":65536", "bad port \"65536\""}, Bad{":", "bad port \"\""},
        Bad{":-1", "bad port \"-1\""}, Bad{":123456", "bad port \"123456\""},
        Bad{"127.0.0.1", "expected HOST:PORT"}, Bad{"", "expected HOST:PORT"},
        Bad{"[::1]", "expected [IPV6]:PORT"},
        Bad{"[]:80", "expected [IPV6]:PORT"},
        Bad{"[::1:80", "expected [IPV6]:PORT"},
        Bad{"::1:80", "an IPv6 address needs brackets"}}) {
    Config c;
    const Status s = Parse({"--listen", b.value}, &c);
    ASSERT_FALSE(s.ok()) << b.value;
    EXPECT_TRUE(Contains(s.message(),
                         std::string("--listen \"") + b.value + "\": " + b.why))
        << s.message();
  }
}

// The tracing flags (issue 30): values kept as given for the OTLP settings
// (checked at start by otlp::ParseOtlpConfig, tests/daemon/otlp), the
// sampling and queue values checked here.
TEST(ConfigTest, ReadsTracingFlags) {
  const Config c = MustParse({"--otlp-endpoint",
                              "http://c:4318/v1/traces",
                              "--otlp-protocol",
                              "http/json",
                              "--otlp-headers",
                              "a=b",
                              "--otlp-compression",
                              "gzip",
                              "--otlp-timeout",
                              "2500",
                              "--otlp-certificate",
                              "/ca.pem",
                              "--otlp-client-certificate",
                              "/c.pem",
                              "--otlp-client-key",
                              "/k.pem",
                              "--otlp-queue-spans",
                              "1000",
                              "--trace-ratio",
                              "0.25",
                              "--trace-slower-than",
                              "1.5",
                              "--keep-requests",
                              "7"});
  EXPECT_EQ(c.otlp_traces.endpoint, "http://c:4318/v1/traces");
  EXPECT_EQ(c.otlp_traces.protocol, "http/json");
  EXPECT_EQ(c.otlp_traces.headers, "a=b");
  EXPECT_EQ(c.otlp_traces.compression, "gzip");
  EXPECT_EQ(c.otlp_traces.timeout_ms, "2500");
  EXPECT_EQ(c.otlp_traces.certificate, "/ca.pem");
  EXPECT_EQ(c.otlp_traces.client_certificate, "/c.pem");
  EXPECT_EQ(c.otlp_traces.client_key, "/k.pem");
  EXPECT_EQ(c.otlp_queue_spans, 1000u);
  EXPECT_EQ(c.trace_ratio, 0.25);
  EXPECT_EQ(c.trace_slower_than_ns, 1'500'000'000u);
  EXPECT_EQ(c.keep_requests, 7u);
  const Config m = MustParse({"--otlp-metrics-endpoint", "http://c:4318/v1/m",
                              "--otlp-metrics-interval", "2.5",
                              "--otlp-histograms", "explicit"});
  EXPECT_EQ(m.otlp_metrics_endpoint, "http://c:4318/v1/m");
  EXPECT_EQ(m.otlp_metrics_interval_ns, 2'500'000'000u);
  EXPECT_TRUE(m.otlp_histograms_explicit);
  EXPECT_FALSE(
      MustParse({"--otlp-histograms", "exponential"}).otlp_histograms_explicit);
  EXPECT_EQ(MustParse({"--keep-requests", "0"}).keep_requests, 0u);
  const Config d = MustParse({});
  EXPECT_EQ(d.keep_requests, 50u);
  EXPECT_FALSE(d.otlp_metrics_endpoint.has_value());
  EXPECT_FALSE(d.otlp_metrics_interval_ns.has_value());
  EXPECT_FALSE(d.otlp_histograms_explicit);
  EXPECT_FALSE(d.otlp_traces.endpoint.has_value());
  EXPECT_EQ(d.trace_ratio, 0.01);
  EXPECT_EQ(d.trace_slower_than_ns, 0u);
  EXPECT_EQ(d.otlp_queue_spans, 65536u);
}

TEST(ConfigTest, RejectsBadTracingValues) {
  struct Bad {
    std::vector<std::string> args;
    std::string flag;
  };
  for (const Bad& b :
       {Bad{{"--trace-ratio", "1.5"}, "--trace-ratio"},
        Bad{{"--trace-ratio", "-0.1"}, "--trace-ratio"},
        Bad{{"--trace-ratio", "nan"}, "--trace-ratio"},
        Bad{{"--trace-ratio", "x"}, "--trace-ratio"},
        Bad{{"--trace-slower-than", "-1"}, "--trace-slower-than"},
        Bad{{"--otlp-queue-spans", "0"}, "--otlp-queue-spans"},
        Bad{{"--otlp-queue-spans", "99999999"}, "--otlp-queue-spans"},
        Bad{{"--keep-requests", "1001"}, "--keep-requests"},
        Bad{{"--keep-requests", "-1"}, "--keep-requests"},
        Bad{{"--keep-requests", "many"}, "--keep-requests"},
        Bad{{"--otlp-metrics-interval", "0.5"}, "--otlp-metrics-interval"},
        Bad{{"--otlp-metrics-interval", "x"}, "--otlp-metrics-interval"},
        Bad{{"--otlp-histograms", "both"}, "--otlp-histograms"}}) {
    Config c;
    const Status s = Parse(b.args, &c);
    ASSERT_FALSE(s.ok()) << b.args[1];
    EXPECT_TRUE(Contains(s.message(), b.flag)) << s.message();
  }
  // A negative, a non-number and a positive value below 1 ns (0 once
  // rounded) are refused with the same words; 0 is off, the default (as a
  // configuration file may write it).
  for (const char* v : {"-1", "x", "1e-10"}) {
    Config c;
    const Status s = Parse({"--trace-slower-than", v}, &c);
    EXPECT_TRUE(
        Contains(s.message(), "is not a number of seconds >= 0 (0: off)"))
        << s.message();
  }
  Config off;
  off.trace_slower_than_ns = 7;
  ASSERT_TRUE(Parse({"--trace-slower-than", "0"}, &off).ok());
  EXPECT_EQ(off.trace_slower_than_ns, 0u);
}

TEST(ConfigTest, RejectsUnknownFlag) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--bogus"},
        std::vector<std::string>{"--bogus", "1"},
        std::vector<std::string>{"--bogus=1"},
        std::vector<std::string>{"--max-requests", "5", "--bogus"}}) {
    Config config;
    const Status s = Parse(args, &config);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(Contains(s.message(), "--bogus")) << s.message();
  }
}

TEST(ConfigTest, RejectsPositionalArgument) {
  Config config;
  const Status s = Parse({"stray"}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "stray")) << s.message();
}

TEST(ConfigTest, RejectsMissingValue) {
  for (const char* flag : {"--max-requests", "--ingest", "--config"}) {
    Config config;
    const Status s = Parse({flag}, &config);
    EXPECT_FALSE(s.ok()) << flag;
    EXPECT_TRUE(Contains(s.message(), flag)) << s.message();
    EXPECT_TRUE(Contains(s.message(), "value")) << s.message();
  }
}

TEST(ConfigTest, AllowListOf256IdsAndNoMore) {
  std::string ids = "0";
  for (int i = 1; i < 256; ++i) ids += "," + std::to_string(i);
  EXPECT_EQ(MustParse({"--allow-gids", ids}).ingest.allow_gids.size(), 256u);
  Config config;
  EXPECT_FALSE(Parse({"--allow-gids", ids + ",256"}, &config).ok());
}

TEST(ConfigTest, ReadsConfigFile) {
  const TempConfigFile file(
      "# tokenmeterd configuration\n"
      "   # an indented comment\n"
      "\n"
      "max-requests = 123\n"
      "finished-grace=0.25\n"
      "\tnamespace   =   from_file   \n"
      "listen = 127.0.0.1:10063\r\n"
      "ready-fd = 7\n"
      "buckets.time_to_first_token_seconds = 0.1, 0.5, 1\n"
      "buckets.request_params_n = 1 2 4\n"
      "buckets.kv_transfer_latency_ms = 3, 7\n");
  const Config c = MustParse({"--config", file.path()});
  EXPECT_EQ(c.config_file, file.path());
  EXPECT_EQ(c.tracker.max_requests, 123u);
  EXPECT_EQ(c.tracker.grace_ns, kSecond / 4);
  EXPECT_EQ(c.ingest.namespace_override, "from_file");
  EXPECT_EQ(c.listen, "127.0.0.1:10063");
  EXPECT_EQ(c.ready_fd, 7);
  EXPECT_EQ(c.registry.buckets.at("time_to_first_token_seconds"),
            (std::vector<double>{0.1, 0.5, 1}));
  EXPECT_EQ(c.registry.buckets.at("request_params_n"),
            (std::vector<double>{1, 2, 4}));
  // A profile's own name (SGLang's, in ms).
  EXPECT_EQ(c.registry.buckets.at("kv_transfer_latency_ms"),
            (std::vector<double>{3, 7}));
  // The registry accepts what the file gave.
  std::unique_ptr<Registry> reg;
  const Status s = Registry::Create(c.registry, &reg);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(ConfigTest, FlagsOverrideTheFileWhateverTheirOrder) {
  const TempConfigFile file("max-requests = 123\nmax-model-len = 100\n");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--max-requests", "5", "--config",
                                 file.path()},
        std::vector<std::string>{"--config=" + file.path(),
                                 "--max-requests=5"}}) {
    const Config c = MustParse(args);
    EXPECT_EQ(c.tracker.max_requests, 5u);
    EXPECT_EQ(c.registry.max_model_len, 100u);  // from the file
  }
}

struct BadFileCase {
  const char* name;
  std::string contents;
  int line;
  std::string message_part;
};

TEST(ConfigTest, FileErrorsNameFileAndLine) {
  const BadFileCase cases[] = {
      {"unknown key", "# c\nmax-requests = 1\nbogus = 1\n", 3, "bogus"},
      {"config key", "config = /etc/other\n", 1, "config"},
      {"no equals sign", "\nmax-requests 5\n", 2, "="},
      {"bad value", "max-requests = 0\n", 1, "max-requests"},
      {"bad bucket bound", "buckets.time_to_first_token_seconds = 0.1, x\n", 1,
       "x"},
      {"unknown histogram", "max-requests = 2\nbuckets.no_such = 1, 2\n", 2,
       "no_such"},
      {"decreasing buckets", "buckets.time_to_first_token_seconds = 0.5, 0.1\n",
       1, "time_to_first_token_seconds"},
      {"a name with its namespace",
       "buckets.sglang:kv_transfer_latency_ms = 3, 7\n", 1,
       "sglang:kv_transfer_latency_ms"},
  };
  for (const BadFileCase& c : cases) {
    SCOPED_TRACE(c.name);
    const TempConfigFile file(c.contents);
    Config config;
    const Status s = Parse({"--config", file.path()}, &config);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(
        Contains(s.message(), file.path() + ":" + std::to_string(c.line) + ":"))
        << s.message();
    EXPECT_TRUE(Contains(s.message(), c.message_part)) << s.message();
  }
}

TEST(ConfigTest, MissingFileIsAnErrorNamingIt) {
  Config config;
  const Status s =
      Parse({"--config", "/nonexistent/tokenmeterd.conf"}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "/nonexistent/tokenmeterd.conf"))
      << s.message();
}

// --ready-fd: a descriptor that is not open, or open only for reading, is
// refused before anything is bound; the write end of a pipe is accepted,
// gets exactly the one line and is closed.
TEST(ConfigTest, ReadyFdMustBeOpenForWriting) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int r = fds[0], w = fds[1];
  EXPECT_TRUE(CheckReadyFd(w).ok());
  const Status read_only = CheckReadyFd(r);
  EXPECT_FALSE(read_only.ok());
  EXPECT_TRUE(Contains(read_only.message(), "--ready-fd"))
      << read_only.message();
  EXPECT_TRUE(Contains(read_only.message(), "writing")) << read_only.message();

  const Status written = WriteReadyLine(w, "127.0.0.1:43210", "/tmp/t/i.sock");
  EXPECT_TRUE(written.ok()) << written.message();
  char buf[256];
  std::string got;
  ssize_t n;
  while ((n = read(r, buf, sizeof(buf))) > 0) got.append(buf, size_t(n));
  EXPECT_EQ(n, 0);  // end of file: WriteReadyLine closed the write end
  EXPECT_EQ(got, "ready http=127.0.0.1:43210 ingest=/tmp/t/i.sock\n");
  close(r);

  // Both ends are closed now.
  for (const int fd : {r, w}) {
    const Status closed = CheckReadyFd(fd);
    EXPECT_FALSE(closed.ok());
    EXPECT_TRUE(Contains(closed.message(), "--ready-fd: " + std::to_string(fd)))
        << closed.message();
    EXPECT_TRUE(Contains(closed.message(), "not an open file descriptor"))
        << closed.message();
  }
}

TEST(ConfigTest, ReadyLineToAClosedReaderIsAnError) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  // SIGPIPE is ignored in tokenmeterd (main.cpp); here too, for EPIPE.
  struct sigaction ignore = {}, old = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &old), 0);
  const Status s = WriteReadyLine(fds[1], ":1", "/x");
  sigaction(SIGPIPE, &old, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "--ready-fd")) << s.message();
  EXPECT_FALSE(CheckReadyFd(fds[1]).ok());  // closed even so
}

TEST(ConfigTest, HelloTimeoutAndPerUidCapFromTheFile) {
  TempConfigFile f("hello-timeout = 3\nmax-connections-per-uid = 17\n");
  const Config c = MustParse({"--config", f.path()});
  EXPECT_EQ(c.ingest.hello_timeout_ns, 3 * kSecond);
  EXPECT_EQ(c.ingest.max_connections_per_uid, 17u);
}

// The connection caps against the descriptor limit: each connection takes
// one descriptor, the daemon keeps what is open at start plus
// kDaemonFdHeadroom.
TEST(ConfigTest, CapsThatFitTheFdLimitAreLeftAlone) {
  Config c;  // 1024 + 256
  std::string clamped = "not cleared";
  const Status s =
      FitConnectionCaps(1024 + 256 + 10 + kDaemonFdHeadroom, 10, &c, &clamped);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(clamped, "");
  EXPECT_EQ(c.ingest.max_connections, 1024u);
  EXPECT_EQ(c.http_max_connections, 256u);
}

TEST(ConfigTest, CapsOverTheFdLimitShrinkInProportion) {
  Config c;  // 1024 + 256: systemd's default soft limit of 1024 is too low
  std::string clamped;
  const Status s = FitConnectionCaps(1024, 8, &c, &clamped);
  ASSERT_TRUE(s.ok()) << s.message();
  const uint64_t available = 1024 - 8 - kDaemonFdHeadroom;  // 984
  EXPECT_EQ(c.ingest.max_connections + c.http_max_connections, available);
  EXPECT_EQ(c.http_max_connections, 256 * available / 1280);  // 196
  EXPECT_EQ(c.ingest.max_connections, available - 196);
  EXPECT_TRUE(Contains(clamped, "RLIMIT_NOFILE) of 1024")) << clamped;
  EXPECT_TRUE(Contains(clamped, "--max-connections 1024 lowered to 788"))
      << clamped;
  EXPECT_TRUE(Contains(clamped, "--max-http-connections 256 lowered to 196"))
      << clamped;
}

TEST(ConfigTest, CapsShrinkToOneEachAtTheSmallestLimit) {
  Config c;
  c.ingest.max_connections = 1'000'000;
  c.http_max_connections = 1;
  std::string clamped;
  Status s = FitConnectionCaps(5 + kDaemonFdHeadroom + 2, 5, &c, &clamped);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(c.ingest.max_connections, 1u);
  EXPECT_EQ(c.http_max_connections, 1u);
  EXPECT_FALSE(clamped.empty());
}

TEST(ConfigTest, AnFdLimitWithNoRoomForConnectionsIsAnError) {
  Config c;
  std::string clamped;
  const Status s =
      FitConnectionCaps(5 + kDaemonFdHeadroom + 1, 5, &c, &clamped);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "RLIMIT_NOFILE")) << s.message();
  EXPECT_TRUE(
      Contains(s.message(), "is " + std::to_string(5 + kDaemonFdHeadroom + 1)))
      << s.message();
  EXPECT_EQ(c.ingest.max_connections, 1024u);  // unchanged
}

// ---- 1.1: naming profiles and per-request labels
// ----------------------------------------------

TEST(ConfigTest, ProfileValues) {
  EXPECT_FALSE(MustParse({}).ingest.profile.has_value());  // auto
  EXPECT_FALSE(MustParse({"--profile", "auto"}).ingest.profile.has_value());
  EXPECT_EQ(MustParse({"--profile", "vllm"}).ingest.profile, Profile::kVllm);
  EXPECT_EQ(MustParse({"--profile=sglang"}).ingest.profile, Profile::kSglang);
  EXPECT_EQ(MustParse({"--profile", "lmdeploy"}).ingest.profile,
            Profile::kLmdeploy);
  // The last one given wins, auto included.
  EXPECT_FALSE(MustParse({"--profile", "sglang", "--profile", "auto"})
                   .ingest.profile.has_value());
  for (const char* bad : {"", "VLLM", "trtllm", "vllm,sglang", " sglang"}) {
    SCOPED_TRACE(bad);
    Config config;
    const Status s = Parse({"--profile", bad}, &config);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "--profile: \"" + std::string(bad) +
                               "\" is not auto, vllm, sglang or lmdeploy");
  }
  const TempConfigFile file("profile = lmdeploy\n");
  EXPECT_EQ(MustParse({"--config", file.path()}).ingest.profile,
            Profile::kLmdeploy);
  EXPECT_EQ(
      MustParse({"--config", file.path(), "--profile", "vllm"}).ingest.profile,
      Profile::kVllm);
}

TEST(ConfigTest, MoeExpertSeriesIsASwitch) {
  EXPECT_FALSE(MustParse({}).registry.moe_expert_series);
  EXPECT_TRUE(MustParse({"--moe-expert-series"}).registry.moe_expert_series);
  EXPECT_FALSE(
      MustParse({"--moe-expert-series=false"}).registry.moe_expert_series);
  Config config;
  const Status s = Parse({"--moe-expert-series=maybe"}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "--moe-expert-series")) << s.message();
}

TEST(ConfigTest, NativeHistogramSchemaFromFlagAndFile) {
  EXPECT_EQ(MustParse({}).registry.native_histogram_schema, 3);
  for (int schema = -4; schema <= 8; ++schema) {
    EXPECT_EQ(MustParse({"--native-histogram-schema", std::to_string(schema)})
                  .registry.native_histogram_schema,
              schema);
  }
  EXPECT_EQ(MustParse({"--native-histogram-schema=-4"})
                .registry.native_histogram_schema,
            -4);
  // The configuration file takes the flag's name and metrics-v1.md's
  // spelling with underscores; the command line overrides both.
  const TempConfigFile dashes("native-histogram-schema = 5\n");
  EXPECT_EQ(
      MustParse({"--config", dashes.path()}).registry.native_histogram_schema,
      5);
  const TempConfigFile underscores("native_histogram_schema = -2\n");
  EXPECT_EQ(MustParse({"--config", underscores.path()})
                .registry.native_histogram_schema,
            -2);
  EXPECT_EQ(MustParse({"--config", underscores.path(),
                       "--native-histogram-schema", "0"})
                .registry.native_histogram_schema,
            0);
  for (const char* bad :
       {"-5", "9", "3.5", "", "+3", "x", "3 ", "--1", "2147483648", "0x3"}) {
    Config config;
    const Status st = Parse({"--native-histogram-schema", bad}, &config);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_TRUE(Contains(st.message(), "--native-histogram-schema: \"" +
                                           std::string(bad) + "\""))
        << st.message();
    EXPECT_TRUE(Contains(st.message(), "-4 to 8")) << st.message();
  }
  const TempConfigFile bad_file("native_histogram_schema = 12\n");
  Config config;
  const Status st = Parse({"--config", bad_file.path()}, &config);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), ":1: --native-histogram-schema"))
      << st.message();
  EXPECT_TRUE(Contains(std::string(UsageText()), "--native-histogram-schema"));
}

TEST(ConfigTest, FileKeysTakeUnderscoresForDashes) {
  const TempConfigFile file("max_requests = 7\nlog_interval = 0\n");
  const Config c = MustParse({"--config", file.path()});
  EXPECT_EQ(c.tracker.max_requests, 7u);
  EXPECT_EQ(c.log_interval_ns, 0u);
  // Unknown keys are still named as written.
  const TempConfigFile bogus("no_such_key = 1\n");
  Config config;
  const Status st = Parse({"--config", bogus.path()}, &config);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "unknown key \"no_such_key\""))
      << st.message();
}

TEST(ConfigTest, LegacyNamesIsASwitch) {
  EXPECT_FALSE(MustParse({}).registry.legacy_names);
  EXPECT_TRUE(MustParse({"--legacy-names"}).registry.legacy_names);
  EXPECT_TRUE(MustParse({"--legacy-names=true"}).registry.legacy_names);
  EXPECT_FALSE(MustParse({"--legacy-names=false"}).registry.legacy_names);
  // A switch takes no value: the next argument is a flag of its own.
  const Config c = MustParse({"--legacy-names", "--max-requests", "5"});
  EXPECT_TRUE(c.registry.legacy_names);
  EXPECT_EQ(c.tracker.max_requests, 5u);
  Config config;
  Status s = Parse({"--legacy-names", "true"}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "\"true\"")) << s.message();
  s = Parse({"--legacy-names=maybe"}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "--legacy-names")) << s.message();
  EXPECT_TRUE(Contains(std::string(UsageText()), "--legacy-names"));
  EXPECT_TRUE(Contains(std::string(UsageText()), "--profile"));
  EXPECT_TRUE(Contains(std::string(UsageText()), "--request-label "));
  EXPECT_TRUE(Contains(std::string(UsageText()), "--request-label-values"));
}

TEST(ConfigTest, LegacyNamesInTheFileTakesTrueOrFalse) {
  for (const auto& [line, want] :
       {std::pair<std::string, bool>{"legacy-names = true\n", true},
        {"legacy-names=false\n", false},
        {"legacy-names = yes\n", true},
        {"legacy-names = 0\n", false}}) {
    SCOPED_TRACE(line);
    const TempConfigFile file(line);
    EXPECT_EQ(MustParse({"--config", file.path()}).registry.legacy_names, want);
  }
  const TempConfigFile on("legacy-names = true\n");
  EXPECT_FALSE(MustParse({"--config", on.path(), "--legacy-names=false"})
                   .registry.legacy_names);
  const TempConfigFile bad("\nlegacy-names = on please\n");
  Config config;
  const Status s = Parse({"--config", bad.path()}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), bad.path() + ":2:")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "--legacy-names")) << s.message();
}

TEST(ConfigTest, RequestLabelIsRepeatable) {
  const Config none = MustParse({});
  EXPECT_TRUE(none.registry.request_labels.empty());
  EXPECT_EQ(none.registry.request_label_values, 100u);
  const Config c =
      MustParse({"--request-label", "tenant", "--request-label=tier",
                 "--request-label", "_app", "--request-label", "Region2"});
  EXPECT_EQ(c.registry.request_labels,
            (std::vector<std::string>{"tenant", "tier", "_app", "Region2"}));
  std::unique_ptr<Registry> reg;
  EXPECT_TRUE(Registry::Create(c.registry, &reg).ok());
}

TEST(ConfigTest, EveryBadRequestLabelNamesTheFlag) {
  const std::vector<std::vector<std::string>> cases = {
      {"--request-label", ""},
      {"--request-label", "1tenant"},
      {"--request-label", "ten-ant"},
      {"--request-label", "ten ant"},
      {"--request-label", "t\xc3\xa9nant"},
      {"--request-label", "model_name"},       // reserved
      {"--request-label", "finished_reason"},  // reserved
      {"--request-label", "max_lora"},         // reserved (1.1)
      {"--request-label", "__tenant"},         // reserved prefix
      {"--request-label", "tenant", "--request-label", "tenant"},
      {"--request-label", "a", "--request-label", "b", "--request-label", "c",
       "--request-label", "d", "--request-label", "e"},
  };
  for (const std::vector<std::string>& args : cases) {
    SCOPED_TRACE(::testing::PrintToString(args));
    Config config;
    const Status s = Parse(args, &config);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(Contains(s.message(), "--request-label:")) << s.message();
  }
  Config config;
  EXPECT_TRUE(Contains(
      Parse({"--request-label", "tenant", "--request-label", "tenant"}, &config)
          .message(),
      "twice"));
  EXPECT_TRUE(Contains(
      Parse({"--request-label=a", "--request-label=b", "--request-label=c",
             "--request-label=d", "--request-label=e"},
            &config)
          .message(),
      "at most 4"));
}

TEST(ConfigTest, CommandLineRequestLabelsReplaceTheFiles) {
  const TempConfigFile file(
      "request-label = tenant\nrequest-label = tier\nrequest-label-values = "
      "7\n");
  const Config from_file = MustParse({"--config", file.path()});
  EXPECT_EQ(from_file.registry.request_labels,
            (std::vector<std::string>{"tenant", "tier"}));
  EXPECT_EQ(from_file.registry.request_label_values, 7u);
  // Whatever the order of --config: the command line's list, whole.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--request-label", "app", "--config",
                                 file.path(), "--request-label", "tier"},
        std::vector<std::string>{"--config=" + file.path(),
                                 "--request-label=app",
                                 "--request-label=tier"}}) {
    const Config c = MustParse(args);
    EXPECT_EQ(c.registry.request_labels,
              (std::vector<std::string>{"app", "tier"}));
    EXPECT_EQ(c.registry.request_label_values, 7u);
  }
  // A file with five is refused at its fifth line.
  const TempConfigFile five(
      "request-label = a\nrequest-label = b\nrequest-label = c\n"
      "request-label = d\nrequest-label = e\n");
  Config config;
  const Status s = Parse({"--config", five.path()}, &config);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), five.path() + ":5:")) << s.message();
  // The file is read whole before the command line's list replaces it.
  EXPECT_FALSE(
      Parse({"--config", five.path(), "--request-label", "x"}, &config).ok());
}

TEST(ConfigTest, RequestLabelValuesBounds) {
  EXPECT_EQ(
      MustParse({"--request-label-values", "1"}).registry.request_label_values,
      1u);
  EXPECT_EQ(
      MustParse({"--request-label-values=65533"}).registry.request_label_values,
      65533u);
  for (const char* bad : {"0", "65534", "-1", "x", "", "1.5", "100k"}) {
    SCOPED_TRACE(bad);
    Config config;
    const Status s = Parse({"--request-label-values", bad}, &config);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(Contains(s.message(), "--request-label-values")) << s.message();
  }
}

}  // namespace
}  // namespace tokenmeter::daemon
