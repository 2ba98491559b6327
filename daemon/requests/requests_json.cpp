#include "daemon/requests/requests_json.h"

#include <time.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/base/json_write.h"
#include "daemon/base/text_format.h"
#include "daemon/trace/ids.h"
#include "daemon/trace/span.h"
#include "daemon/trace/span_builder.h"
#include "daemon/trace/trace_context.h"

namespace tokenmeter::daemon::requests {
namespace {

// `t` as ns after `start`, or null when not seen (0).
void AppendAfter(std::string& out, uint64_t t, uint64_t start) {
  if (t == 0) {
    out += "null";
  } else {
    json_write::JsonInt(&out, int64_t(t - start));
  }
}

// `v` when `has`, else null.
void AppendUintOrNull(std::string& out, bool has, uint64_t v) {
  if (has) {
    AppendUint(out, v);
  } else {
    out += "null";
  }
}

void AppendKey(std::string& out, std::string_view key) {
  out += '"';
  out += key;
  out += "\":";
}

void AppendStringOrNull(std::string& out, std::string_view s) {
  if (s.empty()) {
    out += "null";
  } else {
    json_write::JsonString(&out, s);
  }
}

void AppendPairs(std::string& out,
                 const std::vector<std::pair<std::string, std::string>>& kv) {
  out += '{';
  for (size_t i = 0; i < kv.size(); ++i) {
    if (i > 0) out += ',';
    json_write::JsonString(&out, kv[i].first);
    out += ':';
    json_write::JsonString(&out, kv[i].second);
  }
  out += '}';
}

// `ns` as µs with three decimals: what the trace-event format reads.
void AppendMicros(std::string& out, uint64_t ns) {
  AppendUint(out, ns / 1000);
  const uint64_t frac = ns % 1000;
  if (frac == 0) return;
  out += '.';
  out += char('0' + frac / 100);
  out += char('0' + frac / 10 % 10);
  out += char('0' + frac % 10);
}

// ns from `base` to `t`, 0 for a time before it.
uint64_t Since(uint64_t t, uint64_t base) { return t > base ? t - base : 0; }

void AppendSeconds(std::string& out, uint64_t ns) {
  AppendDouble(out, double(ns) / 1e9);
}

// The request's spans with CLOCK_MONOTONIC times (offset 0); the ids are
// never shown.
size_t SpansOf(const trace::RequestTimeline& t, trace::SpanBatch* batch) {
  trace::CountingIdSource ids(1, 0);
  batch->Clear();
  return trace::BuildSpans(t, trace::SpanOptions{}, ids, batch);
}

void AppendRequest(std::string& out, const KeptRequest& k,
                   const RenderOptions& o, trace::SpanBatch* batch) {
  const trace::RequestTimeline& t = *k.timeline;
  const uint64_t s = k.start_ns;
  out += "{\"request_id\":";
  json_write::JsonString(&out, t.request_id);
  out += ",\"kept\":";
  out += k.failed ? "\"failed\"" : "\"slow\"";
  out += ",\"finish_reason\":";
  AppendStringOrNull(out, t.finish_reason);
  out += ",\"e2e_seconds\":";
  AppendSeconds(out, k.e2e_ns);
  out += ",\"start_unix_ns\":";
  AppendUint(out, trace::ToUnixNs(s, o.unix_minus_monotonic_ns));
  out += ",\"start_monotonic_ns\":";
  AppendUint(out, s);
  const std::pair<std::string_view, uint64_t> points[] = {
      {"arrived_ns", t.arrived_ns},       {"queued_ns", t.queued_ns},
      {"scheduled_ns", t.scheduled_ns},   {"first_token_ns", t.first_token_ns},
      {"last_token_ns", t.last_token_ns}, {"finished_ns", t.finished_ns},
  };
  for (const auto& [key, v] : points) {
    out += ',';
    AppendKey(out, key);
    AppendAfter(out, v, s);
  }
  out += ",\"prompt_tokens\":";
  AppendUint(out, t.prompt_tokens);
  out += ",\"generation_tokens\":";
  AppendUint(out, t.generation_tokens);
  out += ",\"max_tokens\":";
  AppendUintOrNull(out, t.max_tokens != 0, t.max_tokens);
  out += ",\"n\":";
  AppendUintOrNull(out, t.n != 0, t.n);
  out += ",\"cached_tokens\":";
  AppendUintOrNull(out, t.has_info, t.cached_tokens);
  out += ",\"external_tokens\":";
  AppendUintOrNull(out, t.has_info, t.external_tokens);
  out += ",\"priority\":";
  if (t.has_priority) {
    json_write::JsonInt(&out, t.priority);
  } else {
    out += "null";
  }
  out += ",\"lora\":";
  AppendStringOrNull(out, t.lora);
  out += ",\"labels\":";
  AppendPairs(out, t.request_labels);

  out += ",\"phases\":[";
  SpansOf(t, batch);
  bool first = true;
  for (size_t i = 1; i < batch->spans.size(); ++i) {  // [0]: the request
    const trace::Span& sp = batch->spans[i];
    if (!first) out += ',';
    first = false;
    out += "{\"name\":";
    json_write::JsonString(&out, sp.name);
    out += ",\"start_ns\":";
    json_write::JsonInt(&out, int64_t(sp.start_unix_ns - s));
    out += ",\"end_ns\":";
    json_write::JsonInt(&out, int64_t(sp.end_unix_ns - s));
    out += ",\"error\":";
    out += sp.status_code == trace::StatusCode::kError ? "true" : "false";
    out += '}';
  }
  out += "],\"preemptions\":[";
  for (size_t i = 0; i < t.preemptions.size(); ++i) {
    if (i > 0) out += ',';
    out += "{\"preempted_ns\":";
    AppendAfter(out, t.preemptions[i].preempted_ns, s);
    out += ",\"resumed_ns\":";
    AppendAfter(out, t.preemptions[i].resumed_ns, s);
    out += '}';
  }
  out += "],\"kv_transfers\":[";
  for (size_t i = 0; i < t.kv_transfers.size(); ++i) {
    const trace::KvTransfer& kv = t.kv_transfers[i];
    if (i > 0) out += ',';
    out += "{\"role\":";
    out += kv.recv ? "\"recv\"" : "\"send\"";
    out += ",\"start_ns\":";
    AppendAfter(out, kv.start_ns, s);
    out += ",\"end_ns\":";
    AppendAfter(out, kv.end_ns, s);
    out += ",\"ok\":";
    out += kv.ok ? "true" : "false";
    out += ",\"bytes\":";
    AppendUintOrNull(out, kv.bytes != UINT64_MAX, kv.bytes);
    out += ",\"blocks\":";
    AppendUintOrNull(out, kv.blocks != UINT64_MAX, kv.blocks);
    out += ",\"reason\":";
    AppendStringOrNull(out, kv.reason);
    out += ",\"connector\":";
    AppendStringOrNull(out, kv.connector);
    out += '}';
  }
  out += "],\"tokens\":[";
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    if (i > 0) out += ',';
    out += '[';
    json_write::JsonInt(&out, int64_t(t.tokens[i].t_ns - s));
    out += ',';
    AppendUint(out, t.tokens[i].n);
    out += ']';
  }
  out += "],\"tokens_not_shown\":";
  AppendUint(out, t.tokens_not_shown);
  out += ",\"traceparent\":";
  AppendStringOrNull(out, t.traceparent);
  out += ",\"tracestate\":";
  AppendStringOrNull(out, t.tracestate);
  out += ",\"trace_id\":";
  AppendStringOrNull(out, t.shown_trace_id());
  out += '}';
}

void AppendAttributeValue(std::string& out, const trace::Attribute& a) {
  using Type = trace::Attribute::Type;
  switch (a.type) {
    case Type::kString:
    case Type::kStringArray1:
      json_write::JsonString(&out, a.str);
      break;
    case Type::kBool:
      out += a.bool_value ? "true" : "false";
      break;
    case Type::kInt:
      json_write::JsonInt(&out, a.int_value);
      break;
    case Type::kDouble:
      AppendDouble(out, a.double_value);
      break;
  }
}

// The thread (lane) of each of a request's spans in a Chrome trace, and
// how many lanes it takes. Perfetto and chrome://tracing need the X events
// of one thread properly nested: each span goes to the first lane in which
// every span it overlaps contains it. The request's span ([0]) and what
// lies in it nested (queue, prefill, decode, preemptions) take lane 0; a
// span that crosses a bound there (a KV transfer from prefill into decode,
// or one before the request's start) goes to lane 1 or past it.
uint32_t AssignLanes(const std::vector<trace::Span>& spans,
                     std::vector<uint32_t>* lanes) {
  std::vector<size_t> order(spans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const trace::Span& x = spans[a];
    const trace::Span& y = spans[b];
    if (x.start_unix_ns != y.start_unix_ns) {
      return x.start_unix_ns < y.start_unix_ns;
    }
    if (x.end_unix_ns != y.end_unix_ns) return x.end_unix_ns > y.end_unix_ns;
    return a < b;
  });
  // Per lane, the ends of the spans open at the current start (a stack).
  std::vector<std::vector<uint64_t>> open;
  lanes->assign(spans.size(), 0);
  const trace::Span& root = spans.front();
  for (const size_t i : order) {
    const trace::Span& sp = spans[i];
    const bool in_root = i == 0 || (sp.start_unix_ns >= root.start_unix_ns &&
                                    sp.end_unix_ns <= root.end_unix_ns);
    uint32_t lane = in_root ? 0 : 1;
    for (;; ++lane) {
      if (lane >= open.size()) open.resize(lane + 1);
      std::vector<uint64_t>& ends = open[lane];
      while (!ends.empty() && ends.back() <= sp.start_unix_ns) ends.pop_back();
      if (ends.empty() || ends.back() >= sp.end_unix_ns) break;
    }
    open[lane].push_back(sp.end_unix_ns);
    (*lanes)[i] = lane;
  }
  return std::max<uint32_t>(1, uint32_t(open.size()));
}

// One trace-event: `ph` with its common fields, args to follow.
void BeginEvent(std::string& out, bool& first, std::string_view ph,
                std::string_view name, size_t pid, size_t tid) {
  if (!first) out += ',';
  first = false;
  out += "\n{\"ph\":\"";
  out += ph;
  out += "\",\"name\":";
  json_write::JsonString(&out, name);
  out += ",\"pid\":";
  AppendUint(out, pid);
  out += ",\"tid\":";
  AppendUint(out, tid);
}

}  // namespace

void RenderRequestsJson(const std::vector<SeriesRequests>& series,
                        const RenderOptions& o, std::string& out) {
  trace::SpanBatch batch;
  out += "{\"window_seconds\":";
  AppendUint(out, o.window_ns / 1'000'000'000);
  out += ",\"keep_requests\":";
  AppendUint(out, o.keep);
  out += ",\"now_unix_ns\":";
  AppendUint(out, o.now_unix_ns);
  out += ",\"unix_minus_monotonic_ns\":";
  json_write::JsonInt(&out, o.unix_minus_monotonic_ns);
  out += ",\"series\":[";
  for (size_t i = 0; i < series.size(); ++i) {
    const SeriesRequests& sr = series[i];
    if (i > 0) out += ',';
    out += "\n{\"engine_family\":";
    json_write::JsonString(&out, sr.first->engine_family);
    out += ",\"profile\":";
    json_write::JsonString(&out, sr.first->profile);
    out += ",\"labels\":";
    AppendPairs(out, sr.first->engine_labels);
    out += ",\"requests\":[";
    for (size_t j = 0; j < sr.requests.size(); ++j) {
      if (j > 0) out += ',';
      out += '\n';
      AppendRequest(out, *sr.requests[j], o, &batch);
    }
    out += "]}";
  }
  out += "]}\n";
}

void RenderChromeTrace(const std::vector<SeriesRequests>& series,
                       const RenderOptions& o, std::string& out) {
  uint64_t base = UINT64_MAX;
  for (const SeriesRequests& sr : series) {
    for (const KeptRequest* k : sr.requests) {
      base = std::min(base, k->start_ns);
      for (const trace::KvTransfer& kv : k->timeline->kv_transfers) {
        if (kv.start_ns != 0) base = std::min(base, kv.start_ns);
      }
    }
  }
  if (base == UINT64_MAX) base = 0;
  trace::SpanBatch batch;
  std::vector<uint32_t> lanes;
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"start_unix_ns\":";
  AppendUint(out, trace::ToUnixNs(base, o.unix_minus_monotonic_ns));
  out += ",\"start_monotonic_ns\":";
  AppendUint(out, base);
  out += "},\"traceEvents\":[";
  bool first = true;
  for (size_t i = 0; i < series.size(); ++i) {
    const SeriesRequests& sr = series[i];
    const size_t pid = i + 1;
    // The engine family (the metric namespace) where it is not the
    // profile's name, then the profile and the labels.
    std::string process;
    if (sr.first->engine_family != sr.first->profile) {
      process = sr.first->engine_family + " ";
    }
    process += sr.first->profile;
    for (const auto& [name, value] : sr.first->engine_labels) {
      process += ' ';
      process += name;
      process += '=';
      process += value;
    }
    BeginEvent(out, first, "M", "process_name", pid, 0);
    out += ",\"args\":{\"name\":";
    json_write::JsonString(&out, process);
    out += "}}";
    size_t next_tid = 1;
    for (size_t j = 0; j < sr.requests.size(); ++j) {
      const KeptRequest& k = *sr.requests[j];
      const trace::RequestTimeline& t = *k.timeline;
      SpansOf(t, &batch);
      const uint32_t lane_count = AssignLanes(batch.spans, &lanes);
      // The request's threads: its own, then one per extra lane.
      const size_t tid = next_tid;
      next_tid += lane_count;
      std::string thread = "request " + t.request_id;
      if (!t.finish_reason.empty()) thread += " (" + t.finish_reason + ")";
      for (uint32_t lane = 0; lane < lane_count; ++lane) {
        BeginEvent(out, first, "M", "thread_name", pid, tid + lane);
        out += ",\"args\":{\"name\":";
        json_write::JsonString(
            &out, lane == 0 ? thread
                            : thread + " [" + std::to_string(lane + 1) + "]");
        out += "}}";
        BeginEvent(out, first, "M", "thread_sort_index", pid, tid + lane);
        out += ",\"args\":{\"sort_index\":";
        AppendUint(out, tid + lane);
        out += "}}";
      }
      for (size_t si = 0; si < batch.spans.size(); ++si) {
        const trace::Span& sp = batch.spans[si];
        BeginEvent(out, first, "X", sp.name, pid, tid + lanes[si]);
        out += ",\"cat\":\"request\",\"ts\":";
        AppendMicros(out, Since(sp.start_unix_ns, base));
        out += ",\"dur\":";
        AppendMicros(out, sp.end_unix_ns - sp.start_unix_ns);
        out += ",\"args\":{";
        bool first_arg = true;
        if (&sp == &batch.spans.front() && !t.shown_trace_id().empty()) {
          out += "\"trace_id\":";
          json_write::JsonString(&out, t.shown_trace_id());
          first_arg = false;
        }
        for (const trace::Attribute& a : batch.AttributesOf(sp)) {
          if (!first_arg) out += ',';
          first_arg = false;
          json_write::JsonString(&out, a.key_prefix, a.key);
          out += ':';
          AppendAttributeValue(out, a);
        }
        out += "}}";
      }
      for (const trace::TokenTick& tick : t.tokens) {
        BeginEvent(out, first, "i", "tokens", pid, tid);
        out += ",\"cat\":\"tokens\",\"s\":\"t\",\"ts\":";
        AppendMicros(out, Since(tick.t_ns, base));
        out += ",\"args\":{\"n\":";
        AppendUint(out, tick.n);
        out += "}}";
      }
    }
  }
  out += "]}\n";
}

void AddRoutes(http::Server& server, RequestKeeper& keeper,
               const Clock& clock) {
  server.AddRoute("/api/v1/requests", [&keeper, &clock](
                                          const http::Request& req,
                                          http::Response& resp) {
    bool chrome = false;
    std::string_view q = req.query;
    while (!q.empty()) {
      const size_t amp = q.find('&');
      const std::string_view param = q.substr(0, amp);
      q = amp == std::string_view::npos ? std::string_view()
                                        : q.substr(amp + 1);
      if (param.empty()) continue;
      if (param == "format=json") {
        chrome = false;
      } else if (param == "format=chrome-trace") {
        chrome = true;
      } else {
        resp.status = 400;
        resp.body = "bad query parameter '";
        resp.body += param.substr(0, 64);
        resp.body +=
            "': /api/v1/requests takes format=json or format=chrome-trace\n";
        return;
      }
    }
    timespec real{};
    clock_gettime(CLOCK_REALTIME, &real);
    const uint64_t mono = clock.NowNs();
    const uint64_t unix_ns =
        uint64_t(real.tv_sec) * 1'000'000'000 + uint64_t(real.tv_nsec);
    RenderOptions o;
    o.keep = keeper.options().keep;
    o.window_ns = keeper.options().window_ns;
    o.now_unix_ns = unix_ns;
    o.unix_minus_monotonic_ns = trace::UnixMinusMonotonicNs(unix_ns, mono);
    const std::vector<SeriesRequests> shown = keeper.Select(mono);
    resp.content_type = "application/json; charset=utf-8";
    resp.headers.emplace_back("Cache-Control", "no-store");
    resp.compressible = true;
    if (chrome) {
      RenderChromeTrace(shown, o, resp.body);
    } else {
      RenderRequestsJson(shown, o, resp.body);
    }
  });
}

}  // namespace tokenmeter::daemon::requests
