#include "daemon/exposition/proto_writer.h"

#include <cstring>

namespace tokenmeter::daemon {
namespace {

// metrics.proto's field numbers, as (number << 3) | wire type.
constexpr uint32_t Key(uint32_t field, uint32_t wire) {
  return (field << 3) | wire;
}
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kBytes = 2;

// MetricFamily
constexpr uint32_t kFamilyName = Key(1, kBytes);
constexpr uint32_t kFamilyHelp = Key(2, kBytes);
constexpr uint32_t kFamilyType = Key(3, kVarint);
constexpr uint32_t kFamilyMetric = Key(4, kBytes);
// MetricType
constexpr uint64_t kCounterType = 0;
constexpr uint64_t kGaugeType = 1;
constexpr uint64_t kHistogramType = 4;
// Metric
constexpr uint32_t kMetricLabel = Key(1, kBytes);
constexpr uint32_t kMetricGauge = Key(2, kBytes);
constexpr uint32_t kMetricCounter = Key(3, kBytes);
constexpr uint32_t kMetricHistogram = Key(7, kBytes);
// LabelPair
constexpr uint32_t kLabelName = Key(1, kBytes);
constexpr uint32_t kLabelValue = Key(2, kBytes);
// Gauge, Counter
constexpr uint32_t kValue = Key(1, kFixed64);
// Histogram
constexpr uint32_t kSampleCount = Key(1, kVarint);
constexpr uint32_t kSampleSum = Key(2, kFixed64);
constexpr uint32_t kBucket = Key(3, kBytes);
constexpr uint32_t kSchema = Key(5, kVarint);  // sint32
constexpr uint32_t kZeroThreshold = Key(6, kFixed64);
constexpr uint32_t kZeroCount = Key(7, kVarint);
constexpr uint32_t kNegativeSpan = Key(9, kBytes);
constexpr uint32_t kNegativeDelta = Key(10, kVarint);  // sint64
constexpr uint32_t kPositiveSpan = Key(12, kBytes);
constexpr uint32_t kPositiveDelta = Key(13, kVarint);  // sint64
// Field() and Fixed64() write each key as one byte.
static_assert(kPositiveDelta < 0x80 && kMetricHistogram < 0x80);
// Bucket
constexpr uint32_t kCumulativeCount = Key(1, kVarint);
constexpr uint32_t kUpperBound = Key(2, kFixed64);
// BucketSpan
constexpr uint32_t kSpanOffset = Key(1, kVarint);  // sint32
constexpr uint32_t kSpanLength = Key(2, kVarint);

using Bytes = ProtoWriterBytes;

// A varint at p (room for 10 bytes); the byte after it.
inline char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = char(v | 0x80);
    v >>= 7;
  }
  *p++ = char(v);
  return p;
}

inline void Varint(Bytes& out, uint64_t v) {
  char* p = out.Room(10);
  out.len += size_t(PutVarint(p, v) - p);
}

inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint64_t ZigZag(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
// sint32: the 32-bit zigzag, as a varint of at most 5 bytes.
uint64_t ZigZag32(int32_t v) {
  return uint32_t((uint32_t(v) << 1) ^ uint32_t(v >> 31));
}

inline void Fixed64(Bytes& out, uint32_t key, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  char* p = out.Room(9);
  p[0] = char(key);  // every fixed64 key here is one byte
  for (int i = 0; i < 8; ++i) p[1 + i] = char(bits >> (8 * i));
  out.len += 9;
}

// A key and a varint (every key here is one byte: field numbers < 16).
inline void Field(Bytes& out, uint32_t key, uint64_t v) {
  char* p = out.Room(11);
  p[0] = char(key);
  out.len += size_t(PutVarint(p + 1, v) - p);
}

inline void Append(Bytes& out, std::string_view bytes) {
  std::memcpy(out.Room(bytes.size()), bytes.data(), bytes.size());
  out.len += bytes.size();
}

void Field(Bytes& out, uint32_t key, std::string_view bytes) {
  Varint(out, key);
  Varint(out, bytes.size());
  Append(out, bytes);
}

// The native buckets of one sign as BucketSpan fields and delta fields: a
// span per run of consecutive populated indexes, each span's offset the gap
// to the previous span's end (the first's: its starting index), each delta
// the count minus the previous bucket's.
void NativeBuckets(Bytes& out, const NativeHistogram& n, bool positive,
                   uint32_t span_key, uint32_t delta_key, Bytes& deltas) {
  deltas.len = 0;
  bool open = false;
  int32_t start = 0;
  int32_t next = 0;  // the index after the current span's last
  int32_t end = 0;   // the end of the span before the current one
  int64_t previous = 0;
  auto close_span = [&] {
    const uint64_t off = ZigZag32(start - end);
    const uint32_t length = uint32_t(next - start);
    Varint(out, span_key);
    Varint(out, 2 + VarintSize(off) + VarintSize(length));
    Field(out, kSpanOffset, off);
    Field(out, kSpanLength, length);
  };
  n.ForEachBucket(positive, [&](int32_t index, uint64_t count) {
    if (!open || index != next) {
      if (open) {
        close_span();
        end = next;
      }
      open = true;
      start = index;
    }
    next = index + 1;
    Field(deltas, delta_key, ZigZag(int64_t(count) - previous));
    previous = int64_t(count);
  });
  if (open) close_span();
  Append(out, deltas.view());
}

}  // namespace

void ProtoWriter::BeginFamily(std::string_view prefix, std::string_view name,
                              MetricType type, std::string_view help) {
  Flush();
  type_ = type;
  const bool total = type == MetricType::kCounter;
  header_.len = 0;
  Varint(header_, kFamilyName);
  Varint(header_, prefix.size() + name.size() + (total ? 6 : 0));
  Append(header_, prefix);
  Append(header_, name);
  if (total) Append(header_, "_total");
  Field(header_, kFamilyHelp, help);
  Field(header_, kFamilyType,
        type == MetricType::kCounter ? kCounterType
        : type == MetricType::kGauge ? kGaugeType
                                     : kHistogramType);
}

void ProtoWriter::MetricLabels(const SampleLabels& labels) {
  metric_.len = 0;
  auto pair = [this](std::string_view name, std::string_view value) {
    Varint(metric_, kMetricLabel);
    Varint(metric_, 2 + VarintSize(name.size()) + name.size() +
                        VarintSize(value.size()) + value.size());
    Field(metric_, kLabelName, name);
    Field(metric_, kLabelValue, value);
  };
  for (const auto& [name, value] : labels.pairs) pair(name, value);
  if (!labels.own_name.empty()) pair(labels.own_name, labels.own_value);
}

void ProtoWriter::AddMetric(uint32_t tag, std::string_view inner) {
  const size_t size =
      metric_.len + VarintSize(tag) + VarintSize(inner.size()) + inner.size();
  Varint(body_, kFamilyMetric);
  Varint(body_, size);
  Append(body_, metric_.view());
  Field(body_, tag, inner);
}

void ProtoWriter::Sample(const SampleLabels& labels, uint64_t value) {
  Sample(labels, double(value));
}

void ProtoWriter::Sample(const SampleLabels& labels, double value) {
  MetricLabels(labels);
  inner_.len = 0;
  Fixed64(inner_, kValue, value);
  AddMetric(type_ == MetricType::kCounter ? kMetricCounter : kMetricGauge,
            inner_.view());
}

void ProtoWriter::HistogramSample(const SampleLabels& labels,
                                  const Histogram& h) {
  MetricLabels(labels);
  Bytes& out = inner_;
  out.len = 0;
  Field(out, kSampleCount, h.count());
  Fixed64(out, kSampleSum, h.sum());
  const std::vector<double>& bounds = h.layout().bounds();
  const std::vector<uint64_t>& counts = h.counts();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    Varint(out, kBucket);
    Varint(out, 1 + VarintSize(cumulative) + 9);
    Field(out, kCumulativeCount, cumulative);
    Fixed64(out, kUpperBound, bounds[i]);
  }
  const NativeHistogram& n = h.native();
  Field(out, kSchema, ZigZag32(n.schema()));
  Fixed64(out, kZeroThreshold, NativeHistogram::kZeroThreshold);
  Field(out, kZeroCount, n.zero_count());
  const size_t before = out.len;
  NativeBuckets(out, n, false, kNegativeSpan, kNegativeDelta, deltas_);
  const bool no_negative = out.len == before;
  const size_t before_positive = out.len;
  NativeBuckets(out, n, true, kPositiveSpan, kPositiveDelta, deltas_);
  if (no_negative && out.len == before_positive) {
    // One empty span at offset 0 (client_golang's mark of a native
    // histogram without buckets).
    Varint(out, kPositiveSpan);
    Varint(out, 4);
    Field(out, kSpanOffset, 0);
    Field(out, kSpanLength, 0);
  }
  AddMetric(kMetricHistogram, out.view());
}

void ProtoWriter::Flush() {
  if (body_.len > 0) {
    char size[10];
    size_t n = 0;
    for (uint64_t v = header_.len + body_.len;; v >>= 7) {
      if (v < 0x80) {
        size[n++] = char(v);
        break;
      }
      size[n++] = char(v | 0x80);
    }
    out_.reserve(out_.size() + n + header_.len + body_.len);
    out_.append(size, n);
    out_.append(header_.view());
    out_.append(body_.view());
    body_.len = 0;
  }
}

void ProtoWriter::Finish() { Flush(); }

}  // namespace tokenmeter::daemon
