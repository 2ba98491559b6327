#include "daemon/http/negotiation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>

namespace tokenmeter::daemon::http {
namespace {

struct FormatCase {
  std::string_view name;
  std::string_view accept;
  Format want;
};

constexpr Format kText = Format::kText004;
constexpr Format kOm = Format::kOpenMetrics100;
constexpr Format kPb = Format::kProtobufDelimited;

const FormatCase kFormatCases[] = {
    // Real scrapers.
    {"Prometheus3Default",
     "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
     "application/openmetrics-text;version=0.0.1;q=0.5,"
     "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
     kOm},
    {"Prometheus2Late",
     "application/openmetrics-text;version=1.0.0;q=0.5,"
     "application/openmetrics-text;version=0.0.1;q=0.4,"
     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
     kOm},
    {"Prometheus2Mid",
     "application/openmetrics-text;version=1.0.0,"
     "application/openmetrics-text;version=0.0.1;q=0.75,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
     kOm},
    {"Prometheus2EarlyOnlyOpenMetrics001",
     "application/openmetrics-text; version=0.0.1,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
     kText},
    {"PrometheusTextOnlyProtocol", "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
     kText},
    // Prometheus 2.42 with --enable-feature=native-histograms
    // (scrapeAcceptHeaderWithProtobuf).
    {"Prometheus2NativeHistograms",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
     "application/openmetrics-text;version=0.0.1;q=0.75,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
     kPb},
    // Prometheus 3 with scrape_protocols: [PrometheusProto, ...].
    {"Prometheus3ProtoFirst",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0;"
     "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
     kPb},
    {"ProtobufSpacesAndCase",
     "Application/Vnd.Google.Protobuf ; proto=io.prometheus.client.MetricFamily"
     " ; ENCODING=delimited",
     kPb},
    {"ProtobufQuotedParams",
     "application/vnd.google.protobuf;proto=\"io.prometheus.client."
     "MetricFamily\";encoding=\"delimited\"",
     kPb},
    {"ProtobufLowerThanText",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0.2,text/plain;q=0.5",
     kText},
    {"ProtobufTiesOpenMetrics",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited,application/openmetrics-text",
     kOm},
    {"ProtobufWithoutProto",
     "application/vnd.google.protobuf;encoding=delimited", kText},
    {"ProtobufOtherMessage",
     "application/vnd.google.protobuf;proto=io.prometheus.client.Metric;"
     "encoding=delimited",
     kText},
    {"ProtobufTextEncoding",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=text",
     kText},
    {"ProtobufCompactText",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=compact-text",
     kText},
    {"ProtobufWithoutEncoding",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily",
     kText},
    {"ProtobufRefused",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0",
     kText},
    {"ProtobufBadQ",
     "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=2",
     kText},
    {"ProtobufNotByWildcard", "application/*,*/*;q=0.5", kOm},
    {"TextPreferred",
     "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5",
     kText},
    {"Curl", "*/*", kText},
    {"Empty", "", kText},
    {"BrowserLike",
     "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", kText},
    // Plain OpenMetrics requests.
    {"OpenMetricsNoVersion", "application/openmetrics-text", kOm},
    {"OpenMetricsVersion100", "application/openmetrics-text; version=1.0.0",
     kOm},
    {"OpenMetricsQuotedVersion",
     "application/openmetrics-text;version=\"1.0.0\"", kOm},
    {"CaseInsensitive", "APPLICATION/OpenMetrics-Text; VERSION=1.0.0", kOm},
    {"OpenMetricsUtf8Charset", "application/openmetrics-text;charset=UTF-8",
     kOm},
    {"OpenMetricsOtherCharset", "application/openmetrics-text;charset=latin1",
     kText},
    {"OpenMetricsOldVersionOnly", "application/openmetrics-text;version=0.0.1",
     kText},
    {"OpenMetricsFutureVersionOnly",
     "application/openmetrics-text;version=2.0.0", kText},
    {"ApplicationWildcard", "application/*", kOm},
    {"TextWildcard", "text/*", kText},
    {"OpenMetricsOverWildcard", "application/openmetrics-text, */*;q=0.5", kOm},
    {"TextRefusedRestAccepted", "text/plain;q=0, */*", kOm},
    {"TinyPreference", "application/openmetrics-text;q=0.001, text/plain;q=0",
     kOm},
    {"MoreSpecificRangeWins",
     "text/plain;q=1, text/plain;version=0.0.4;q=0.1, "
     "application/openmetrics-text;q=0.5",
     kOm},
    {"CommaInsideQuotes",
     "text/plain;foo=\"a,b;q=1\";q=0.1, application/openmetrics-text", kOm},
    {"TrailingSemicolon", "application/openmetrics-text;", kOm},
    {"WhitespaceAround", "  application/openmetrics-text ; q=0.9 ,  ", kOm},
    // Ties go to text.
    {"Tie", "application/openmetrics-text;q=0.5,text/plain;q=0.5", kText},
    {"TieAtOne", "application/openmetrics-text, text/plain", kText},
    // Malformed q: the range is ignored.
    {"QAboveOne", "application/openmetrics-text;q=1.5", kText},
    {"QOneWithFraction", "application/openmetrics-text;q=1.001", kText},
    {"QFourDecimals", "application/openmetrics-text;q=0.1234", kText},
    {"QEmpty", "application/openmetrics-text;q=", kText},
    {"QNegative", "application/openmetrics-text;q=-1", kText},
    {"QLeadingDot", "application/openmetrics-text;q=.5", kText},
    {"QQuoted", "application/openmetrics-text;q=\"0.5\"", kText},
    {"QZero", "application/openmetrics-text;q=0", kText},
    {"QOneThreeZeros", "application/openmetrics-text;q=1.000", kOm},
    // Garbage.
    {"NoSubtype", "application", kText},
    {"SlashOnly", "/", kText},
    {"ParamsOnly", ";q=1", kText},
    {"WildcardTypeConcreteSubtype", "*/openmetrics-text", kText},
    {"UnterminatedQuote", "application/openmetrics-text;version=\"1.0.0",
     kText},
    {"Commas", ",,,,", kText},
    {"ControlBytes", std::string_view("\0\x01\xff/\x7f", 5), kText},
    {"GarbageThenGood", "\x80\x81;;==,application/openmetrics-text", kOm},
};

TEST(NegotiationTest, ChoosesFormatFromAcceptTable) {
  for (const FormatCase& c : kFormatCases) {
    EXPECT_EQ(ChooseFormat(c.accept), c.want)
        << c.name << ": Accept: " << c.accept;
  }
}

struct GzipCase {
  std::string_view name;
  std::string_view accept_encoding;
  bool want;
};

const GzipCase kGzipCases[] = {
    {"Gzip", "gzip", true},
    {"DeflateThenGzip", "deflate, gzip;q=0.5", true},
    {"GzipRefused", "gzip;q=0", false},
    {"GzipRefusedThreeZeros", "gzip;q=0.000", false},
    {"GzipTinyQ", "gzip;q=0.001", true},
    {"Identity", "identity", false},
    {"Star", "*", true},
    {"StarRefused", "*;q=0", false},
    {"Upper", "GZIP", true},
    {"XGzip", "x-gzip", true},
    {"Empty", "", false},
    {"GzipRefusedDespiteStar", "gzip;q=0, *", false},
    {"StarRefusedButGzipNamed", "*;q=0, gzip", true},
    {"OthersOnly", "br, deflate, zstd", false},
    {"BadQIgnored", "gzip;q=2", false},
    {"SpacesAroundParams", "gzip ; q=0.5", true},
    {"GoHttpClient", "gzip", true},
    {"Browser", "gzip, deflate, br", true},
    {"Garbage", std::string_view("\xff\0gzip", 6), false},
    {"SemicolonsOnly", ";;;", false},
};

TEST(NegotiationTest, DecidesGzipFromAcceptEncodingTable) {
  for (const GzipCase& c : kGzipCases) {
    EXPECT_EQ(AcceptsGzip(c.accept_encoding), c.want)
        << c.name << ": Accept-Encoding: " << c.accept_encoding;
  }
}

TEST(NegotiationTest, ContentTypesAreExact) {
  EXPECT_EQ(ContentType(Format::kText004),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(ContentType(Format::kOpenMetrics100),
            "application/openmetrics-text; version=1.0.0; charset=utf-8");
  EXPECT_EQ(ContentType(Format::kProtobufDelimited),
            "application/vnd.google.protobuf; "
            "proto=io.prometheus.client.MetricFamily; encoding=delimited");
}

// Not a fuzzer, but it walks the parsers over many odd inputs, with
// sanitizers in the ASan build, so that out-of-bounds reads show up here.
TEST(NegotiationTest, SurvivesArbitraryBytes) {
  std::mt19937 rng(12345);
  const std::string_view alphabet = "ab/*;=,\"\\ q.01tx-\t\r\n\x80\xff";
  const std::string_view seeds[] = {
      "application/openmetrics-text;version=1.0.0;q=0.5",
      "text/plain;version=0.0.4;q=0.3,*/*;q=0.2", "gzip;q=0.5, *;q=0"};
  int openmetrics = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string input(seeds[i % 3]);
    int edits = static_cast<int>(rng() % 6);
    for (int e = 0; e < edits && !input.empty(); ++e) {
      size_t pos = rng() % input.size();
      switch (rng() % 3) {
        case 0:
          input[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          input.erase(pos, 1 + rng() % 4);
          break;
        default:
          input.insert(pos, 1, static_cast<char>(rng() % 256));
      }
    }
    // Exact-size heap copy so that ASan sees any read past the end.
    auto copy = std::make_unique<char[]>(input.size());
    std::copy(input.begin(), input.end(), copy.get());
    std::string_view view(copy.get(), input.size());
    openmetrics += ChooseFormat(view) == Format::kOpenMetrics100;
    (void)AcceptsGzip(view);
  }
  EXPECT_GT(openmetrics, 0);
}

}  // namespace
}  // namespace tokenmeter::daemon::http
