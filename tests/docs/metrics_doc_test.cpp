// docs/metrics.md must list exactly the series of the catalog table
// (daemon/metrics/catalog.cpp). The two tables between the GENERATED
// markers are compared with what the catalog says; run with
// TOKENMETER_UPDATE_DOCS=1 to rewrite them after changing the catalog.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/metrics/catalog.h"
#include "daemon/metrics/text_format.h"

namespace tokenmeter::daemon {
namespace {

std::string BucketText(BucketSet set) {
  switch (set) {
    case BucketSet::kNone:
      return "";
    case BucketSet::kTokens:
      return "1-2-5 up to --max-model-len";
    default: {
      std::string out;
      for (double b : DefaultBuckets(set, 32768)) {
        if (!out.empty()) out += ' ';
        AppendDouble(out, b);
      }
      return out;
    }
  }
}

std::string EngineTable() {
  std::string t =
      "| name | type | labels | buckets | help |\n|---|---|---|---|---|\n";
  for (const EngineMetricDef& d : kEngineMetrics) {
    t += "| `<ns>:" + std::string(d.suffix) +
         (d.type == MetricType::kCounter ? "_total" : "") + "` | " +
         std::string(MetricTypeName(d.type)) + " | model_name, engine" +
         (d.own_label.empty() ? "" : ", " + std::string(d.own_label)) + " | " +
         BucketText(d.buckets) + " | " + std::string(d.help) + " |\n";
  }
  return t;
}

std::string DaemonTable() {
  std::string t = "| name | type | labels | help |\n|---|---|---|---|\n";
  for (const DaemonMetricDef& d : kDaemonMetrics) {
    std::string labels(d.labels);
    for (size_t p = labels.find(','); p != std::string::npos;
         p = labels.find(',', p + 2)) {
      labels.replace(p, 1, ", ");
    }
    t += "| `" + std::string(d.name) +
         (d.type == MetricType::kCounter ? "_total" : "") + "` | " +
         std::string(MetricTypeName(d.type)) + " | " + labels + " | " +
         std::string(d.help) + " |\n";
  }
  return t;
}

// Replaces (update) or returns the text between the named markers.
std::string Section(std::string& doc, const std::string& name,
                    const std::string* replacement) {
  const std::string begin = "<!-- BEGIN GENERATED: " + name + " -->\n";
  const std::string end = "<!-- END GENERATED: " + name + " -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "";
  const size_t start = b + begin.size();
  if (replacement != nullptr) doc.replace(start, e - start, *replacement);
  return doc.substr(start, e - start);
}

TEST(MetricsDocTest, TablesMatchTheCatalog) {
  const char* path = std::getenv("METRICS_DOC");
  ASSERT_NE(path, nullptr) << "METRICS_DOC is not set";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  const std::string engine = EngineTable(), daemon = DaemonTable();
  if (std::getenv("TOKENMETER_UPDATE_DOCS") != nullptr) {
    Section(doc, "engine series", &engine);
    Section(doc, "daemon series", &daemon);
    std::ofstream(path) << doc;
  }
  EXPECT_EQ(Section(doc, "engine series", nullptr), engine)
      << "docs/metrics.md is out of date: rerun with TOKENMETER_UPDATE_DOCS=1";
  EXPECT_EQ(Section(doc, "daemon series", nullptr), daemon)
      << "docs/metrics.md is out of date: rerun with TOKENMETER_UPDATE_DOCS=1";
}

}  // namespace
}  // namespace tokenmeter::daemon
