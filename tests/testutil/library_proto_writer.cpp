#include "testutil/library_proto_writer.h"

#include <cstdint>

#include "metrics.pb.h"

namespace tokenmeter::daemon {

namespace pb = ::io::prometheus::client;

namespace {

void SetString(std::string* field, std::string_view v) {
  field->assign(v.data(), v.size());
}

// The native buckets of one sign as spans and deltas (metrics.proto): a
// span per run of consecutive populated indexes, each span's offset the gap
// to the previous span's end (the first's: its starting index), each delta
// the count minus the previous bucket's.
template <class AddSpan, class AddDelta>
void WriteNativeBuckets(const NativeHistogram& n, bool positive,
                        AddSpan add_span, AddDelta add_delta) {
  pb::BucketSpan* span = nullptr;
  int32_t next = 0;  // the index after the current span's last
  int64_t previous = 0;
  n.ForEachBucket(positive, [&](int32_t index, uint64_t count) {
    if (span == nullptr || index != next) {
      const int32_t offset = span == nullptr ? index : index - next;
      span = add_span();
      span->set_offset(offset);
      span->set_length(0);
    }
    span->set_length(span->length() + 1);
    next = index + 1;
    add_delta(int64_t(count) - previous);
    previous = int64_t(count);
  });
}

}  // namespace

LibraryProtoWriter::LibraryProtoWriter(std::string& out)
    : out_(out), family_(std::make_unique<pb::MetricFamily>()) {}

LibraryProtoWriter::~LibraryProtoWriter() = default;

void LibraryProtoWriter::BeginFamily(std::string_view prefix,
                                     std::string_view name, MetricType type,
                                     std::string_view help) {
  Flush();
  type_ = type;
  std::string* full = family_->mutable_name();
  full->assign(prefix.data(), prefix.size());
  full->append(name.data(), name.size());
  if (type == MetricType::kCounter) full->append("_total");
  SetString(family_->mutable_help(), help);
  switch (type) {
    case MetricType::kCounter:
      family_->set_type(pb::COUNTER);
      break;
    case MetricType::kGauge:
      family_->set_type(pb::GAUGE);
      break;
    case MetricType::kHistogram:
      family_->set_type(pb::HISTOGRAM);
      break;
  }
}

pb::Metric* LibraryProtoWriter::AddMetric(const SampleLabels& labels) {
  pb::Metric* m = family_->add_metric();
  for (const auto& [name, value] : labels.pairs) {
    pb::LabelPair* l = m->add_label();
    SetString(l->mutable_name(), name);
    SetString(l->mutable_value(), value);
  }
  if (!labels.own_name.empty()) {
    pb::LabelPair* l = m->add_label();
    SetString(l->mutable_name(), labels.own_name);
    SetString(l->mutable_value(), labels.own_value);
  }
  return m;
}

void LibraryProtoWriter::Sample(const SampleLabels& labels, uint64_t value) {
  Sample(labels, double(value));
}

void LibraryProtoWriter::Sample(const SampleLabels& labels, double value) {
  pb::Metric* m = AddMetric(labels);
  if (type_ == MetricType::kCounter) {
    m->mutable_counter()->set_value(value);
  } else {
    m->mutable_gauge()->set_value(value);
  }
}

void LibraryProtoWriter::HistogramSample(const SampleLabels& labels,
                                         const Histogram& h) {
  pb::Histogram* out = AddMetric(labels)->mutable_histogram();
  out->set_sample_count(h.count());
  out->set_sample_sum(h.sum());
  const std::vector<double>& bounds = h.layout().bounds();
  const std::vector<uint64_t>& counts = h.counts();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    pb::Bucket* b = out->add_bucket();
    b->set_cumulative_count(cumulative);
    b->set_upper_bound(bounds[i]);
  }
  const NativeHistogram& n = h.native();
  out->set_schema(n.schema());
  out->set_zero_threshold(NativeHistogram::kZeroThreshold);
  out->set_zero_count(n.zero_count());
  WriteNativeBuckets(
      n, true, [out] { return out->add_positive_span(); },
      [out](int64_t d) { out->add_positive_delta(d); });
  WriteNativeBuckets(
      n, false, [out] { return out->add_negative_span(); },
      [out](int64_t d) { out->add_negative_delta(d); });
  if (out->positive_span_size() == 0 && out->negative_span_size() == 0) {
    pb::BucketSpan* empty = out->add_positive_span();
    empty->set_offset(0);
    empty->set_length(0);
  }
}

void LibraryProtoWriter::Flush() {
  if (family_->metric_size() > 0) {
    const size_t size = family_->ByteSizeLong();
    // The varint length prefix (encoding=delimited).
    for (uint64_t v = size;; v >>= 7) {
      if (v < 0x80) {
        out_.push_back(char(v));
        break;
      }
      out_.push_back(char((v & 0x7f) | 0x80));
    }
    const size_t at = out_.size();
    out_.resize(at + size);
    family_->SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(out_.data() + at));
  }
  family_->Clear();
}

void LibraryProtoWriter::Finish() { Flush(); }

}  // namespace tokenmeter::daemon
