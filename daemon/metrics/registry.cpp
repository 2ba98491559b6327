#include "daemon/metrics/registry.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon/metrics/text_format.h"

namespace tokenmeter::daemon {
namespace {

struct ProcessStats {
  double cpu_seconds = 0;
  double rss_bytes = 0;
  double vsize_bytes = 0;
  double open_fds = 0;
  double max_fds = 0;
  double start_time_seconds = 0;
};

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const double ticks = double(sysconf(_SC_CLK_TCK));
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name, which may hold spaces: skip past ')'.
    const size_t close = line.rfind(')');
    std::istringstream in(line.substr(close + 2));
    std::string field;
    std::vector<std::string> f;
    while (in >> field) f.push_back(field);
    // f[0] is field 3 (state); utime is field 14, stime 15, starttime 22,
    // vsize 23, rss 24.
    if (f.size() > 21) {
      p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
      const double start_ticks = std::stod(f[19]);
      p.vsize_bytes = std::stod(f[20]);
      p.rss_bytes = std::stod(f[21]) * double(sysconf(_SC_PAGESIZE));
      std::ifstream boot("/proc/stat");
      std::string key;
      double btime = 0;
      while (boot >> key) {
        if (key == "btime") {
          boot >> btime;
          break;
        }
      }
      p.start_time_seconds = btime + start_ticks / ticks;
    }
  }
  std::error_code ec;
  size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  p.open_fds = double(fds);
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) p.max_fds = double(rl.rlim_cur);
  return p;
}

// "# HELP name text\n# TYPE name type\n". Counters are named with _total in
// text 0.0.4 metadata and without it in OpenMetrics.
void AppendMeta(std::string& out, ExpositionFormat format,
                std::string_view prefix, std::string_view name, MetricType type,
                std::string_view help) {
  const bool total =
      type == MetricType::kCounter && format == ExpositionFormat::kText004;
  out += "# HELP ";
  out += prefix;
  out += name;
  if (total) out += "_total";
  out += ' ';
  AppendHelpEscaped(out, help);
  out += "\n# TYPE ";
  out += prefix;
  out += name;
  if (total) out += "_total";
  out += ' ';
  out += MetricTypeName(type);
  out += '\n';
}

// name{labels[,extra]} value\n
void AppendSample(std::string& out, std::string_view prefix,
                  std::string_view name, std::string_view suffix,
                  std::string_view labels, std::string_view extra_name,
                  std::string_view extra_value, bool escape_extra) {
  out += prefix;
  out += name;
  out += suffix;
  if (!labels.empty() || !extra_name.empty()) {
    out += '{';
    out += labels;
    if (!extra_name.empty()) {
      if (!labels.empty()) out += ',';
      out += extra_name;
      out += "=\"";
      if (escape_extra) {
        AppendEscaped(out, extra_value);
      } else {
        out += extra_value;
      }
      out += '"';
    }
    out += '}';
  }
  out += ' ';
}

void AppendHistogram(std::string& out, std::string_view prefix,
                     std::string_view name, std::string_view labels,
                     const Histogram& h) {
  const auto& le = h.layout().le_text();
  const auto& counts = h.counts();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    AppendSample(out, prefix, name, "_bucket", labels, "le", le[i], false);
    AppendUint(out, cumulative);
    out += '\n';
  }
  AppendSample(out, prefix, name, "_sum", labels, "", "", false);
  AppendDouble(out, h.sum());
  out += '\n';
  AppendSample(out, prefix, name, "_count", labels, "", "", false);
  AppendUint(out, h.count());
  out += '\n';
}

void AppendValue(std::string& out, std::string_view prefix,
                 std::string_view name, std::string_view suffix,
                 std::string_view labels, double v) {
  AppendSample(out, prefix, name, suffix, labels, "", "", false);
  AppendDouble(out, v);
  out += '\n';
}

void AppendCount(std::string& out, std::string_view prefix,
                 std::string_view name, std::string_view labels, uint64_t v) {
  AppendSample(out, prefix, name, "_total", labels, "", "", false);
  AppendUint(out, v);
  out += '\n';
}

}  // namespace

std::string SanitizeNamespace(std::string_view engine) {
  std::string ns(engine);
  for (char& c : ns) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_';
    if (!ok) c = '_';
  }
  return ns;
}

EngineSeries::EngineSeries(const SeriesIdentity& id,
                           const std::vector<HistogramLayout>& layouts)
    : identity(id) {
  label_text += "model_name=\"";
  AppendEscaped(label_text, id.model);
  label_text += "\",engine=\"";
  AppendEscaped(label_text, id.instance);
  label_text += '"';
  for (const auto& [name, value] : id.labels) {
    label_text += ',';
    label_text += name;
    label_text += "=\"";
    AppendEscaped(label_text, value);
    label_text += '"';
  }
  hists.reserve(layouts.size());
  for (const HistogramLayout& layout : layouts) hists.emplace_back(&layout);
}

Status Registry::Create(const RegistryOptions& options,
                        std::unique_ptr<Registry>* out) {
  if (options.max_model_len < 1) {
    return Status::Error("max-model-len must be at least 1");
  }
  for (const auto& [suffix, bounds] : options.buckets) {
    bool known = false;
    for (const EngineMetricDef& def : kEngineMetrics) {
      if (def.type == MetricType::kHistogram && def.suffix == suffix) {
        known = true;
      }
    }
    if (!known) {
      return Status::Error("buckets: no histogram named \"" + suffix + "\"");
    }
    if (bounds.empty()) {
      return Status::Error("buckets." + suffix + ": no bounds given");
    }
    for (size_t i = 0; i < bounds.size(); ++i) {
      if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
        return Status::Error("buckets." + suffix +
                             ": bounds must be finite and increasing");
      }
    }
  }
  std::vector<HistogramLayout> layouts;
  layouts.reserve(kNumHistograms);
  for (int i = 0; i < kNumHistograms; ++i) {
    const EngineMetricDef& def = kEngineMetrics[kFirstHistogram + i];
    auto it = options.buckets.find(def.suffix);
    std::vector<double> bounds =
        it != options.buckets.end()
            ? it->second
            : DefaultBuckets(def.buckets, options.max_model_len);
    layouts.emplace_back(std::move(bounds), def.seconds ? 1e9 : 1.0);
  }
  out->reset(new Registry(options, std::move(layouts)));
  return Status::Ok();
}

Registry::Registry(const RegistryOptions& options,
                   std::vector<HistogramLayout> layouts)
    : options_(options), layouts_(std::move(layouts)) {}

EngineSeries* Registry::GetOrCreate(const SeriesIdentity& id) {
  auto it = series_.find(id);
  if (it != series_.end()) return it->second.get();
  if (series_.size() >= options_.max_engine_series) {
    ++counters_.series_rejected;
    return nullptr;
  }
  auto s = std::make_unique<EngineSeries>(id, layouts_);
  EngineSeries* raw = s.get();
  series_.emplace(id, std::move(s));
  return raw;
}

void Registry::SetClientDropped(const std::string& family,
                                const std::string& model,
                                const std::string& instance, int64_t client,
                                uint64_t dropped_total) {
  client_dropped_[{family, model, instance}][client] = dropped_total;
}

void Registry::Render(ExpositionFormat format, std::string& out) const {
  RenderEngine(format, out);
  RenderDaemon(format, out);
  if (format == ExpositionFormat::kOpenMetrics100) out += "# EOF\n";
}

void Registry::RenderEngine(ExpositionFormat format, std::string& out) const {
  // series_ is ordered by identity, so each namespace's series are
  // contiguous: render one namespace's families at a time.
  auto begin = series_.begin();
  while (begin != series_.end()) {
    auto end = begin;
    while (end != series_.end() && end->first.ns == begin->first.ns) ++end;
    const std::string prefix = begin->first.ns + ":";
    for (const EngineMetricDef& def : kEngineMetrics) {
      if (def.id == kSpecDecodeNumAcceptedTokensPerPos) {
        bool any = false;
        for (auto it = begin; it != end; ++it) {
          any = any || !it->second->spec_accepted_per_pos.empty();
        }
        if (!any) continue;
      }
      AppendMeta(out, format, prefix, def.suffix, def.type, def.help);
      for (auto it = begin; it != end; ++it) {
        const EngineSeries& s = *it->second;
        const std::string& l = s.label_text;
        switch (def.id) {
          case kNumRequestsRunning:
            AppendValue(out, prefix, def.suffix, "", l,
                        s.has_step_running
                            ? double(s.step_running)
                            : double(std::max<int64_t>(0, s.derived_running)));
            break;
          case kNumRequestsWaiting:
            AppendValue(out, prefix, def.suffix, "", l,
                        s.has_step_waiting
                            ? double(s.step_waiting)
                            : double(std::max<int64_t>(0, s.derived_waiting)));
            break;
          case kKvCacheUsagePerc:
            AppendValue(out, prefix, def.suffix, "", l, s.kv_usage);
            break;
          case kPrefixCacheQueries:
            AppendCount(out, prefix, def.suffix, l, s.prefix_queries);
            break;
          case kPrefixCacheHits:
            AppendCount(out, prefix, def.suffix, l, s.prefix_hits);
            break;
          case kNumPreemptions:
            AppendCount(out, prefix, def.suffix, l, s.preemptions);
            break;
          case kPromptTokens:
            AppendCount(out, prefix, def.suffix, l, s.prompt_tokens);
            break;
          case kGenerationTokens:
            AppendCount(out, prefix, def.suffix, l, s.generation_tokens);
            break;
          case kRequestSuccess:
            for (int r = 0; r < kNumFinishReasons; ++r) {
              AppendSample(out, prefix, def.suffix, "_total", l,
                           "finished_reason", FinishReasonName(FinishReason(r)),
                           false);
              AppendUint(out, s.success[r]);
              out += '\n';
            }
            break;
          case kSpecDecodeNumDrafts:
            AppendCount(out, prefix, def.suffix, l, s.spec_drafts);
            break;
          case kSpecDecodeNumDraftTokens:
            AppendCount(out, prefix, def.suffix, l, s.spec_draft_tokens);
            break;
          case kSpecDecodeNumAcceptedTokens:
            AppendCount(out, prefix, def.suffix, l, s.spec_accepted_tokens);
            break;
          case kSpecDecodeNumAcceptedTokensPerPos:
            for (size_t p = 0; p < s.spec_accepted_per_pos.size(); ++p) {
              std::string pos;
              AppendUint(pos, p);
              AppendSample(out, prefix, def.suffix, "_total", l, "position",
                           pos, false);
              AppendUint(out, s.spec_accepted_per_pos[p]);
              out += '\n';
            }
            break;
          default:
            AppendHistogram(out, prefix, def.suffix, l, s.hist(def.id));
            break;
        }
      }
    }
    begin = end;
  }
}

void Registry::RenderDaemon(ExpositionFormat format, std::string& out) const {
  const DaemonCounters& c = counters_;
  const ProcessStats p = ReadProcessStats();
  for (const DaemonMetricDef& def : kDaemonMetrics) {
    AppendMeta(out, format, "", def.name, def.type, def.help);
    const std::string_view n = def.name;
    switch (def.id) {
      case kBuildInfo:
        AppendSample(out, "", n, "", "", "version", TOKENMETER_VERSION, true);
        out += "1\n";
        break;
      case kIngestConnections:
        AppendValue(out, "", n, "", "", double(c.ingest_connections));
        break;
      case kIngestFrames:
        AppendCount(out, "", n, "", c.ingest_frames);
        break;
      case kIngestEvents:
        for (int k = 0; k < kNumEventKinds; ++k) {
          AppendSample(out, "", n, "_total", "", "kind",
                       EventKindName(EventKind(k + 1)), false);
          AppendUint(out, c.ingest_events[k]);
          out += '\n';
        }
        break;
      case kIngestErrors:
        for (size_t r = 0; r < size_t(IngestError::kCount); ++r) {
          AppendSample(out, "", n, "_total", "", "reason",
                       IngestErrorName(IngestError(r)), false);
          AppendUint(out, c.ingest_errors[r]);
          out += '\n';
        }
        break;
      case kClientDroppedEvents:
        for (const auto& [key, clients] : client_dropped_) {
          uint64_t total = 0;
          for (const auto& [client, v] : clients) total += v;
          std::string labels = "engine_family=\"";
          AppendEscaped(labels, std::get<0>(key));
          labels += "\",model_name=\"";
          AppendEscaped(labels, std::get<1>(key));
          labels += "\",engine=\"";
          AppendEscaped(labels, std::get<2>(key));
          labels += '"';
          AppendCount(out, "", n, labels, total);
        }
        break;
      case kTrackedRequests:
        AppendValue(out, "", n, "", "", double(c.tracked_requests));
        break;
      case kEvictedRequests:
        AppendCount(out, "", n, "", c.evicted_requests);
        break;
      case kIncompleteIntervals:
      case kNegativeIntervals:
        for (size_t i = 0; i < size_t(Interval::kCount); ++i) {
          AppendSample(out, "", n, "_total", "", "interval",
                       IntervalName(Interval(i)), false);
          AppendUint(out, def.id == kIncompleteIntervals ? c.incomplete[i]
                                                         : c.negative[i]);
          out += '\n';
        }
        break;
      case kScrapeDuration:
        AppendValue(out, "", n, "", "", c.scrape_duration_seconds);
        break;
      case kHttpResponses:
        for (const auto& [code, count] : c.http_responses) {
          AppendSample(out, "", n, "_total", "", "code", code, false);
          AppendUint(out, count);
          out += '\n';
        }
        break;
      case kHttpConnectionsRejected:
        AppendCount(out, "", n, "", c.http_connections_rejected);
        break;
      case kProcessCpuSeconds:
        AppendValue(out, "", n, "_total", "", p.cpu_seconds);
        break;
      case kProcessResidentMemory:
        AppendValue(out, "", n, "", "", p.rss_bytes);
        break;
      case kProcessVirtualMemory:
        AppendValue(out, "", n, "", "", p.vsize_bytes);
        break;
      case kProcessOpenFds:
        AppendValue(out, "", n, "", "", p.open_fds);
        break;
      case kProcessMaxFds:
        AppendValue(out, "", n, "", "", p.max_fds);
        break;
      case kProcessStartTime:
        AppendValue(out, "", n, "", "", p.start_time_seconds);
        break;
      case kNumDaemonMetrics:
        break;
    }
  }
}

}  // namespace tokenmeter::daemon
