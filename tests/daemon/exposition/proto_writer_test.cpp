// The protobuf exposition (ProtoWriter) read back with the code protoc
// generates from Prometheus' metrics.proto: the same bytes as
// LibraryProtoWriter (libprotobuf's own encoder), the same samples as the
// text 0.0.4 exposition, and the native buckets at each schema. Built only
// where the protobuf reference is (tests/testutil/protobuf/meson.build).
#include "daemon/exposition/proto_writer.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "daemon/base/text_format.h"
#include "daemon/exposition/exposition.h"
#include "daemon/store/catalog.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"
#include "metrics.pb.h"
#include "tests/daemon/exposition/exposition_fixture.h"
#include "testutil/library_proto_writer.h"

namespace tokenmeter::daemon::exposition_test {
namespace {

namespace pb = ::io::prometheus::client;

std::string RenderProtobuf(const Registry& reg) {
  std::string out;
  ProtoWriter w(out);
  daemon::Render(reg, w);
  return out;
}

// Every length-delimited MetricFamily; a failure unless the bytes end
// cleanly after the last.
std::vector<pb::MetricFamily> ParseProtobuf(const std::string& bytes) {
  google::protobuf::io::ArrayInputStream in(bytes.data(), int(bytes.size()));
  std::vector<pb::MetricFamily> out;
  while (true) {
    pb::MetricFamily f;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&f, &in,
                                                                  &clean_eof)) {
      EXPECT_TRUE(clean_eof)
          << "bad or truncated message after " << out.size() << " families";
      break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

const char* TypeName(pb::MetricType t) {
  switch (t) {
    case pb::COUNTER:
      return "counter";
    case pb::GAUGE:
      return "gauge";
    case pb::HISTOGRAM:
      return "histogram";
    default:
      return "other";
  }
}

// A protobuf family as the text 0.0.4 samples it stands for: a histogram's
// buckets with le (the +Inf one from the count), _sum and _count.
Family AsText(const pb::MetricFamily& f) {
  Family out{f.name(), TypeName(f.type()), true, {}};
  for (const pb::Metric& m : f.metric()) {
    Sample base;
    for (const pb::LabelPair& l : m.label()) {
      base.labels.emplace_back(l.name(), l.value());
    }
    auto add = [&](std::string name, double v, const char* le = nullptr,
                   double bound = 0) {
      Sample s = base;
      s.name = std::move(name);
      s.value = v;
      if (le != nullptr) {
        std::string text = le;
        if (text.empty()) AppendDouble(text, bound);
        s.labels.emplace_back("le", text);
      }
      out.samples.push_back(std::move(s));
    };
    switch (f.type()) {
      case pb::COUNTER:
        add(f.name(), m.counter().value());
        break;
      case pb::GAUGE:
        add(f.name(), m.gauge().value());
        break;
      case pb::HISTOGRAM:
        for (const pb::Bucket& b : m.histogram().bucket()) {
          add(f.name() + "_bucket", double(b.cumulative_count()), "",
              b.upper_bound());
        }
        add(f.name() + "_bucket", double(m.histogram().sample_count()), "+Inf");
        add(f.name() + "_sum", m.histogram().sample_sum());
        add(f.name() + "_count", double(m.histogram().sample_count()));
        break;
      default:
        ADD_FAILURE() << f.name() << ": unexpected type";
    }
  }
  return out;
}

// The HELP text of every family in a text 0.0.4 exposition, unescaped.
std::map<std::string, std::string> HelpTexts(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("# HELP ")) continue;
    const std::string rest = line.substr(7);
    const size_t space = rest.find(' ');
    std::string help;
    for (size_t i = space + 1; i < rest.size(); ++i) {
      if (rest[i] == '\\' && i + 1 < rest.size()) {
        help += rest[i + 1] == 'n' ? '\n' : rest[i + 1];
        ++i;
      } else {
        help += rest[i];
      }
    }
    out[rest.substr(0, space)] = help;
  }
  return out;
}

// The protobuf exposition holds exactly the text 0.0.4 exposition's
// families that have samples, in its order, with its names (counters with
// _total), types, help texts, labels (in order) and values (bit for bit);
// the process_* values, which move between two renders, by name only.
void ExpectProtobufEqualsText(const Registry& reg) {
  const std::string text = Render(reg, ExpositionFormat::kText004);
  const std::vector<Family> want = Parse(text, ExpositionFormat::kText004);
  const std::map<std::string, std::string> help = HelpTexts(text);
  const std::vector<pb::MetricFamily> got = ParseProtobuf(RenderProtobuf(reg));
  size_t g = 0;
  size_t samples = 0;
  for (const Family& w : want) {
    if (w.samples.empty()) continue;  // left out of protobuf
    SCOPED_TRACE(w.name);
    ASSERT_LT(g, got.size()) << "family missing";
    const Family f = AsText(got[g]);
    EXPECT_EQ(f.name, w.name);
    EXPECT_EQ(f.type, w.type);
    EXPECT_EQ(got[g].help(), help.at(w.name));
    ++g;
    if (w.name.starts_with("process_")) continue;
    ASSERT_EQ(f.samples.size(), w.samples.size());
    for (size_t i = 0; i < w.samples.size(); ++i) {
      EXPECT_EQ(f.samples[i].name, w.samples[i].name);
      EXPECT_EQ(f.samples[i].labels, w.samples[i].labels) << w.samples[i].name;
      EXPECT_EQ(std::bit_cast<uint64_t>(f.samples[i].value),
                std::bit_cast<uint64_t>(w.samples[i].value))
          << w.samples[i].name << " " << w.samples[i].value_text;
    }
    samples += w.samples.size();
  }
  EXPECT_EQ(g, got.size()) << "extra families";
  EXPECT_GT(samples, 300u);
}

// ProtoWriter (the daemon's hand-written encoder) against LibraryProtoWriter
// (protoc's classes and libprotobuf), on registries without process_*
// (whose values move between two renders): the same bytes.
void ExpectBothEncodersAgree(const Registry& reg) {
  std::string hand, library;
  ProtoWriter h(hand);
  daemon::Render(reg, h);
  LibraryProtoWriter l(library);
  daemon::Render(reg, l);
  EXPECT_GT(hand.size(), 100u);
  EXPECT_TRUE(hand == library)
      << hand.size() << " vs " << library.size() << " bytes";
}

TEST(ProtoWriterTest, ProtobufEncoderAgreesWithTheGeneratedCode) {
  for (int schema : {3, -4, 8}) {
    RegistryOptions options;
    options.native_histogram_schema = schema;
    options.request_labels = {"tenant"};
    std::unique_ptr<Registry> reg;
    ASSERT_TRUE(Registry::Create(options, &reg).ok());
    EngineSeries* a =
        reg->GetOrCreate({"vllm", "m", "0", {{"tier", kOddLabel}}});
    EngineSeries* b =
        reg->GetOrCreate({"sglang", "q", "1", {}, Profile::kSglang});
    Fill(*a, 1, true, true);
    Fill(*b, 2, true, true);
    // Wide spreads: many native buckets, gaps, reduced schemas, the zero
    // bucket, NaN and +Inf.
    Histogram& h = a->hist(kE2eRequestLatency);
    for (int i = 0; i < 5000; ++i)
      h.Observe(std::exp(double(i % 97) / 3) * 1e3);
    h.Observe(0);
    h.Observe(std::nan(""));
    h.Observe(HUGE_VAL);
    b->hist(kTimeToFirstToken).Observe(1e6);
    b->hist(kTimeToFirstToken).Observe(1e9);
    ExpectBothEncodersAgree(*reg);
  }
  std::unique_ptr<Registry> empty;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &empty).ok());
  empty->GetOrCreate({"vllm", "m", "0", {}});
  ExpectBothEncodersAgree(*empty);
}

TEST(ProtoWriterTest, ProtobufCarriesEverySampleOfTheText) {
  const auto reg = PopulatedRegistry();
  ExpectProtobufEqualsText(*reg);
}

TEST(ProtoWriterTest, ProtobufCarriesEverySampleOfTheTextInEachProfile) {
  const auto reg = ProfilesRegistry();
  ExpectProtobufEqualsText(*reg);
  RegistryOptions legacy;
  legacy.legacy_names = true;
  legacy.moe_expert_series = true;
  auto with_moe = MakeExposed(legacy);
  EngineSeries* s = with_moe->GetOrCreate({"vllm", "m", "0", {}});
  Fill(*s, 1, true, true);
  const uint64_t load[] = {6, 2, 0, 1};
  ASSERT_TRUE(
      s->part<MoePart>().Add(3, std::span<const uint64_t>(load, 4), true));
  ExpectProtobufEqualsText(*with_moe);
}

// The native buckets of one histogram as (index, count), from its spans
// and deltas.
std::vector<std::pair<int32_t, uint64_t>> NativeBuckets(
    const pb::Histogram& h) {
  std::vector<std::pair<int32_t, uint64_t>> out;
  int32_t index = 0;
  int64_t count = 0;
  int d = 0;
  for (const pb::BucketSpan& span : h.positive_span()) {
    index += span.offset();
    for (uint32_t i = 0; i < span.length(); ++i) {
      EXPECT_LT(d, h.positive_delta_size());
      if (d >= h.positive_delta_size()) return out;
      count += h.positive_delta(d++);
      EXPECT_GT(count, 0) << "an empty bucket at " << index;
      out.emplace_back(index, uint64_t(count));
      ++index;
    }
  }
  EXPECT_EQ(d, h.positive_delta_size()) << "deltas without a span";
  return out;
}

const pb::Histogram* FindHistogram(const std::vector<pb::MetricFamily>& fs,
                                   const std::string& name) {
  for (const pb::MetricFamily& f : fs) {
    if (f.name() == name && f.metric_size() == 1) {
      return &f.metric(0).histogram();
    }
  }
  ADD_FAILURE() << name << " not found once";
  return nullptr;
}

TEST(ProtoWriterTest, ProtobufNativeBucketsAtEachSchema) {
  // Values well inside their buckets at every schema tried: bucket i of
  // schema s holds (2^((i-1) 2^-s), 2^(i 2^-s)], so the index of v is
  // ceil(log2(v) 2^s), computed here without the daemon's tables.
  const double values[] = {0.0071, 0.0071, 0.093, 0.41, 1.7, 1.7, 1.7, 3.3};
  for (int schema : {3, 0, -2, 8}) {
    SCOPED_TRACE("schema " + std::to_string(schema));
    RegistryOptions options;
    options.native_histogram_schema = schema;
    auto reg = MakeExposed(options);
    EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
    for (double v : values) s->hist(kTimeToFirstToken).Observe(v * 1e9);
    s->hist(kTimeToFirstToken).Observe(0);  // the zero bucket
    const std::vector<pb::MetricFamily> fs =
        ParseProtobuf(RenderProtobuf(*reg));
    const pb::Histogram* h =
        FindHistogram(fs, "vllm:time_to_first_token_seconds");
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->schema(), schema);
    EXPECT_EQ(h->zero_threshold(), 0x1p-128);
    EXPECT_EQ(h->zero_count(), 1u);
    EXPECT_EQ(h->sample_count(), std::size(values) + 1);
    EXPECT_EQ(h->negative_span_size(), 0);
    std::map<int32_t, uint64_t> want;
    for (double v : values) {
      ++want[int32_t(std::ceil(std::log2(v) * std::ldexp(1.0, schema)))];
    }
    using Buckets = std::vector<std::pair<int32_t, uint64_t>>;
    EXPECT_EQ(Buckets(want.begin(), want.end()), NativeBuckets(*h));
    // The classic buckets ride along unchanged.
    EXPECT_EQ(h->bucket_size(),
              int(s->hist(kTimeToFirstToken).layout().bounds().size()));
  }
}

TEST(ProtoWriterTest, ProtobufEmptyHistogramIsStillNative) {
  auto reg = MakeExposed(RegistryOptions{});
  reg->GetOrCreate({"vllm", "m", "0", {}});
  const std::vector<pb::MetricFamily> fs = ParseProtobuf(RenderProtobuf(*reg));
  const pb::Histogram* h =
      FindHistogram(fs, "vllm:time_to_first_token_seconds");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->sample_count(), 0u);
  EXPECT_EQ(h->schema(), 3);
  EXPECT_EQ(h->zero_threshold(), 0x1p-128);
  ASSERT_EQ(h->positive_span_size(), 1);
  EXPECT_EQ(h->positive_span(0).offset(), 0);
  EXPECT_EQ(h->positive_span(0).length(), 0u);
  EXPECT_EQ(h->positive_delta_size(), 0);
}

TEST(ProtoWriterTest, ProtobufSchemaOutOfRangeIsRejected) {
  for (int schema : {-5, 9}) {
    RegistryOptions options;
    options.native_histogram_schema = schema;
    std::unique_ptr<Registry> reg;
    const Status st = Registry::Create(options, &reg);
    EXPECT_FALSE(st.ok()) << schema;
    EXPECT_NE(st.message().find("native-histogram-schema"), std::string::npos);
  }
}

}  // namespace
}  // namespace tokenmeter::daemon::exposition_test
