#include "daemon/live/live_json.h"

#include "daemon/base/json_write.h"
#include "daemon/base/text_format.h"

namespace tokenmeter::daemon::live {
namespace {

void AppendSize(std::string& out, size_t v) { out += std::to_string(v); }

}  // namespace

void RenderJson(const Registry& registry, const History& history,
                std::string& out) {
  out += "{\"series\":[";
  bool first = true;
  registry.ForEachSeries([&](const EngineSeries& s) {
    if (!first) out += ',';
    first = false;
    const SeriesIdentity& id = s.identity();
    out += "{\"engine_family\":";
    json_write::JsonString(&out, id.ns);
    out += ",\"model_name\":";
    json_write::JsonString(&out, id.model);
    out += ",\"engine\":";
    json_write::JsonString(&out, id.instance);
    out += ",\"labels\":{";
    for (size_t i = 0; i < id.labels.size(); ++i) {
      if (i > 0) out += ',';
      json_write::JsonString(&out, id.labels[i].first);
      out += ':';
      json_write::JsonString(&out, id.labels[i].second);
    }
    const History::Series* h = history.Find(s);
    const bool has_point = h != nullptr && h->t.size() > 0;
    out += "},\"now\":{\"t\":";
    out += has_point ? h->t.Last() : "null";
    for (int k = 0; k < kNumLiveKeys; ++k) {
      out += ",\"";
      out += kLiveKeyNames[k];
      out += "\":";
      out += has_point ? h->values[k].Last() : "null";
    }
    out += "},\"history\":{\"t\":[";
    if (h != nullptr) out += h->t.Joined();
    out += ']';
    for (int k = 0; k < kNumLiveKeys; ++k) {
      out += ",\"";
      out += kLiveKeyNames[k];
      out += "\":[";
      if (h != nullptr) out += h->values[k].Joined();
      out += ']';
    }
    out += "}}";
  });
  out += "],\"points_max\":";
  AppendSize(out, kPoints);
  out += ",\"series_max\":";
  AppendSize(out, kMaxSeries);
  out += ",\"series_unfollowed\":";
  AppendSize(out, history.unfollowed());
  out += "}\n";
}

void AddRoutes(http::Server& server, const Registry& registry,
               const History& history) {
  server.AddRoute("/", [](const http::Request&, http::Response& resp) {
    resp.content_type = std::string(kPageContentType);
    resp.headers.emplace_back("Content-Security-Policy", kPagePolicy);
    resp.compressible = true;
    resp.body = PageHtml();
  });
  server.AddRoute("/api/v1/live", [&registry, &history](const http::Request&,
                                                        http::Response& resp) {
    resp.content_type = std::string(kJsonContentType);
    resp.headers.emplace_back("Cache-Control", "no-store");
    RenderJson(registry, history, resp.body);
  });
}

}  // namespace tokenmeter::daemon::live
