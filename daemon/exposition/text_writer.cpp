#include "daemon/exposition/text_writer.h"

#include "daemon/base/text_format.h"

namespace tokenmeter::daemon {

// "# HELP name text\n# TYPE name type\n". Counters are named with _total in
// text 0.0.4 metadata and without it in OpenMetrics.
void TextWriter::BeginFamily(std::string_view prefix, std::string_view name,
                             MetricType type, std::string_view help) {
  prefix_ = prefix;
  name_ = name;
  type_ = type;
  const bool total =
      type == MetricType::kCounter && format_ == ExpositionFormat::kText004;
  out_ += "# HELP ";
  out_ += prefix;
  out_ += name;
  if (total) out_ += "_total";
  out_ += ' ';
  AppendHelpEscaped(out_, help);
  out_ += "\n# TYPE ";
  out_ += prefix;
  out_ += name;
  if (total) out_ += "_total";
  out_ += ' ';
  out_ += MetricTypeName(type);
  out_ += '\n';
}

void TextWriter::AppendName(std::string_view suffix,
                            const SampleLabels& labels) {
  out_ += prefix_;
  out_ += name_;
  out_ += suffix;
  if (!labels.text.empty() || !labels.own_name.empty()) {
    out_ += '{';
    out_ += labels.text;
    if (!labels.own_name.empty()) {
      if (!labels.text.empty()) out_ += ',';
      out_ += labels.own_name;
      out_ += "=\"";
      out_ += labels.own_value;
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
}

void TextWriter::Sample(const SampleLabels& labels, uint64_t value) {
  AppendName(type_ == MetricType::kCounter ? "_total" : "", labels);
  AppendUint(out_, value);
  out_ += '\n';
}

void TextWriter::Sample(const SampleLabels& labels, double value) {
  AppendName(type_ == MetricType::kCounter ? "_total" : "", labels);
  AppendDouble(out_, value);
  out_ += '\n';
}

void TextWriter::HistogramSample(const SampleLabels& labels,
                                 const Histogram& h) {
  const auto& le = h.layout().le_text();
  const auto& counts = h.counts();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    AppendName("_bucket", labels.WithOwn("le", le[i]));
    AppendUint(out_, cumulative);
    out_ += '\n';
  }
  AppendName("_sum", labels);
  AppendDouble(out_, h.sum());
  out_ += '\n';
  AppendName("_count", labels);
  AppendUint(out_, h.count());
  out_ += '\n';
}

void TextWriter::Finish() {
  if (format_ == ExpositionFormat::kOpenMetrics100) out_ += "# EOF\n";
}

}  // namespace tokenmeter::daemon
