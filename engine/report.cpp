#include "engine/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "engine/workload.h"

namespace tokenmeter::engine {
namespace {

double Seconds(uint64_t ns) { return double(ns) / 1e9; }

// Nearest rank: the value at position ceil(p * n) (1-based).
double Percentile(const std::vector<double>& sorted, double p) {
  const size_t n = sorted.size();
  auto rank = size_t(std::ceil(p * double(n) - 1e-9));
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return sorted[rank - 1];
}

void AppendDouble(std::string& out, double v) {
  if (!std::isfinite(v)) v = 0;  // JSON has no inf/nan; never expected
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

void AppendUint(std::string& out, uint64_t v) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

void AppendSummaryValue(std::string& out, const Summary& s) {
  out += "{\"count\": ";
  AppendUint(out, s.count);
  out += ", \"sum\": ";
  AppendDouble(out, s.sum);
  out += ", \"p50\": ";
  AppendDouble(out, s.p50);
  out += ", \"p99\": ";
  AppendDouble(out, s.p99);
  out += "}";
}

void AppendSummary(std::string& out, const char* key, const Summary& s) {
  out += ",\n \"";
  out += key;
  out += "\": ";
  AppendSummaryValue(out, s);
}

void AppendString(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[(c >> 4) & 0xf];
      out += kHex[c & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
}

void AppendGroups(std::string& out, const char* key,
                  const std::vector<GroupCounts>& groups, bool loads) {
  out += ",\n \"";
  out += key;
  out += "\": {";
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupCounts& g = groups[i];
    out += i == 0 ? "\n  " : ",\n  ";
    AppendString(out, g.name);
    out += ": {\"requests\": ";
    AppendUint(out, g.requests);
    out += ", \"finished\": {\"stop\": ";
    AppendUint(out, g.finished_stop);
    out += ", \"length\": ";
    AppendUint(out, g.finished_length);
    out += ", \"error\": ";
    AppendUint(out, g.finished_error);
    out += "}, \"prompt_tokens\": ";
    AppendUint(out, g.prompt_tokens);
    out += ", \"generation_tokens\": ";
    AppendUint(out, g.generation_tokens);
    if (loads) {
      out += ", \"loads\": ";
      AppendUint(out, g.loads);
    }
    out += "}";
  }
  out += "}";
}

// {"a": 1, "b": 2} from (key, count) pairs.
void AppendCounts(std::string& out,
                  const std::vector<std::pair<std::string, uint64_t>>& counts) {
  out += "{";
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i > 0) out += ", ";
    AppendString(out, counts[i].first);
    out += ": ";
    AppendUint(out, counts[i].second);
  }
  out += "}";
}

void AppendTransfer(std::string& out, const char* role,
                    const KvTransferFigures& f) {
  out += "\"";
  out += role;
  out += "\": {\"count\": ";
  AppendUint(out, f.count);
  out += ", \"failures\": ";
  AppendCounts(out, f.failures);
  out += ", \"bytes\": ";
  AppendUint(out, f.bytes);
  out += ", \"blocks\": ";
  AppendUint(out, f.blocks);
  out += ", \"time_s\": ";
  AppendSummaryValue(out, f.time_s);
  out += "}";
}

// The protocol 1.2 figures (after the tenants).
void AppendProtocol12(std::string& o, const Report& r) {
  o += ",\n \"role\": ";
  AppendString(o, r.role);
  o += ", \"identity\": {\"engine\": ";
  AppendString(o, r.engine_name);
  o += ", \"model\": ";
  AppendString(o, r.model_name);
  o += ", \"instance\": ";
  AppendString(o, r.instance);
  o += ", \"labels\": {";
  for (size_t i = 0; i < r.labels.size(); ++i) {
    if (i > 0) o += ", ";
    AppendString(o, r.labels[i].first);
    o += ": ";
    AppendString(o, r.labels[i].second);
  }
  o += "}}";
  o += ",\n \"admission_rejections\": ";
  AppendCounts(o, r.admission_rejections);
  o += ",\n \"prompt_tokens_by_source\": {\"local_compute\": ";
  AppendUint(o, r.prompt_local_compute);
  o += ", \"local_cache_hit\": ";
  AppendUint(o, r.prompt_local_cache_hit);
  o += ", \"external_kv_transfer\": ";
  AppendUint(o, r.prompt_external_kv);
  o += "}, \"prompt_tokens_cached\": ";
  AppendUint(o, r.prompt_local_cache_hit + r.prompt_external_kv);
  AppendSummary(o, "request_prefill_kv_computed_tokens",
                r.prefill_kv_computed_tokens);
  AppendSummary(o, "request_num_preemptions", r.num_preemptions_per_request);
  o += ",\n \"kv_transfer\": {";
  AppendTransfer(o, "send", r.kv_send);
  o += ",\n  ";
  AppendTransfer(o, "recv", r.kv_recv);
  o += "}";
  AppendSummary(o, "kv_wait_s", r.kv_wait);
  o += ",\n \"kv_handoffs\": ";
  AppendUint(o, r.kv_handoffs);
  o += ",\n \"sleep\": {\"transitions\": ";
  AppendUint(o, r.sleep.transitions);
  o += ", \"scheduler\": ";
  AppendString(o, r.sleep.scheduler);
  o += ", \"weights\": ";
  AppendString(o, r.sleep.weights);
  o += ", \"kv_cache\": ";
  AppendString(o, r.sleep.kv_cache);
  o += ", \"asleep_s\": ";
  AppendDouble(o, r.sleep.asleep_s);
  o += ", \"preempted\": ";
  AppendUint(o, r.sleep.preempted);
  o += "},\n \"last_step\": {\"running\": ";
  AppendUint(o, r.last_step.running);
  o += ", \"waiting\": ";
  AppendUint(o, r.last_step.waiting);
  o += ", \"waiting_deferred\": ";
  AppendUint(o, r.last_step.waiting_deferred);
  o += ", \"kv_usage\": ";
  AppendDouble(o, r.last_step.kv_usage);
  o += "}";
  AppendGroups(o, "priorities", r.priorities, false);
  o += ",\n \"traceparents\": ";
  AppendUint(o, r.traceparents);
}

}  // namespace

Summary Summarize(std::vector<double>& values) {
  Summary s;
  s.count = values.size();
  if (values.empty()) return s;
  for (double v : values) s.sum += v;
  std::sort(values.begin(), values.end());
  s.p50 = Percentile(values, 0.50);
  s.p99 = Percentile(values, 0.99);
  return s;
}

std::string ReportJson(const Report& r) {
  std::string o = "{\"requests\": ";
  AppendUint(o, r.requests);
  o += ", \"finished\": {\"stop\": ";
  AppendUint(o, r.finished_stop);
  o += ", \"length\": ";
  AppendUint(o, r.finished_length);
  o += ", \"error\": ";
  AppendUint(o, r.finished_error);
  o += "},\n \"prompt_tokens\": ";
  AppendUint(o, r.prompt_tokens);
  o += ", \"generation_tokens\": ";
  AppendUint(o, r.generation_tokens);
  o += ",\n \"duration_s\": ";
  AppendDouble(o, r.duration_s);
  o += ", \"output_tokens_per_s\": ";
  AppendDouble(o, r.output_tokens_per_s);
  AppendSummary(o, "ttft_s", r.ttft);
  AppendSummary(o, "itl_s", r.itl);
  AppendSummary(o, "e2e_s", r.e2e);
  AppendSummary(o, "queue_s", r.queue);
  AppendSummary(o, "prefill_s", r.prefill);
  AppendSummary(o, "decode_s", r.decode);
  AppendSummary(o, "inference_s", r.inference);
  AppendSummary(o, "tpot_s", r.tpot);
  o += ",\n \"backend\": ";
  AppendString(o, r.backend);
  o += ", \"metrics\": ";
  o += r.metrics ? "true" : "false";
  o += ", \"client_dropped_events\": ";
  AppendUint(o, r.client_dropped_events);
  o += ",\n \"preemptions\": ";
  AppendUint(o, r.preemptions);
  o += ", \"prefix_cache_queries\": ";
  AppendUint(o, r.prefix_cache_queries);
  o += ", \"prefix_cache_hits\": ";
  AppendUint(o, r.prefix_cache_hits);
  o += ", \"steps\": ";
  AppendUint(o, r.steps);
  o += ",\n \"client_events_sent\": ";
  AppendUint(o, r.client_events_sent);
  o += ", \"client_reconnects\": ";
  AppendUint(o, r.client_reconnects);
  o += ", \"client_events_rejected\": ";
  AppendUint(o, r.client_events_rejected);
  o += ",\n \"loop_cpu_s\": ";
  AppendDouble(o, r.loop_cpu_s);
  o += ", \"process_cpu_s\": ";
  AppendDouble(o, r.process_cpu_s);
  o += ",\n \"lora_loads\": ";
  AppendUint(o, r.lora_loads);
  o += ", \"lora_evictions\": ";
  AppendUint(o, r.lora_evictions);
  o += ", \"lora_skips\": ";
  AppendUint(o, r.lora_skips);
  AppendGroups(o, "lora_adapters", r.lora_adapters, true);
  AppendGroups(o, "tenants", r.tenants, false);
  AppendProtocol12(o, r);
  if (r.moe_experts > 0) {
    o += ",\n \"moe_experts\": ";
    AppendUint(o, r.moe_experts);
    o += ", \"moe_top_k\": ";
    AppendUint(o, r.moe_top_k);
    o += ", \"moe_expert_load_events\": ";
    AppendUint(o, r.moe_expert_load_events);
    o += ",\n \"moe_routed_tokens\": [";
    for (size_t l = 0; l < r.moe_routed_tokens.size(); ++l) {
      if (l > 0) o += ", ";
      AppendUint(o, r.moe_routed_tokens[l]);
    }
    o += "],\n \"moe_expert_tokens\": [";
    for (size_t l = 0; l < r.moe_expert_tokens.size(); ++l) {
      o += l == 0 ? "\n  [" : ",\n  [";
      const std::vector<uint64_t>& row = r.moe_expert_tokens[l];
      for (size_t e = 0; e < row.size(); ++e) {
        if (e > 0) o += ", ";
        AppendUint(o, row[e]);
      }
      o += "]";
    }
    o += "]";
  }
  o += "}\n";
  return o;
}

Recorder::Recorder(size_t num_requests, uint32_t num_adapters,
                   uint32_t num_tenants)
    : times_(num_requests),
      lora_loads_(num_adapters),
      num_tenants_(num_tenants) {}

void Recorder::Groups(size_t i, int32_t lora, int32_t tenant) {
  if (lora >= int32_t(lora_loads_.size()) || tenant >= int32_t(num_tenants_)) {
    std::abort();
  }
  Times& t = times_.at(i);
  t.lora = lora;
  t.tenant = tenant;
}

void Recorder::LoraLoaded(int32_t adapter, bool evicted) {
  ++lora_loads_.at(size_t(adapter));
  if (evicted) ++lora_evictions_;
}

void Recorder::Arrived(size_t i, uint64_t t_ns, uint32_t prompt_tokens) {
  Times& t = times_.at(i);
  t.arrived = t_ns;
  t.has_arrived = true;
  t.prompt_tokens = prompt_tokens;
}

void Recorder::Queued(size_t i, uint64_t t_ns) {
  Times& t = times_.at(i);
  t.queued = t_ns;
  t.has_queued = true;
}

void Recorder::Scheduled(size_t i, uint64_t t_ns, uint32_t cached,
                         uint32_t external) {
  Times& t = times_.at(i);
  if (t.has_scheduled) return;
  t.scheduled = t_ns;
  t.has_scheduled = true;
  t.cached = cached;
  t.external = external;
}

void Recorder::Priority(size_t i, int32_t priority) {
  times_.at(i).priority = priority;
}

void Recorder::Count(std::vector<std::pair<std::string, uint64_t>>& counts,
                     const std::string& key) {
  auto it = std::lower_bound(counts.begin(), counts.end(), key,
                             [](const std::pair<std::string, uint64_t>& c,
                                const std::string& k) { return c.first < k; });
  if (it == counts.end() || it->first != key) it = counts.insert(it, {key, 0});
  ++it->second;
}

void Recorder::Rejected(const std::string& reason) {
  Count(rejections_, reason);
}

void Recorder::KvTransfer(size_t i, bool recv, uint64_t start_ns, uint64_t t_ns,
                          uint64_t bytes, uint64_t blocks, bool ok,
                          const std::string& reason) {
  Transfer& x = recv ? recv_ : send_;
  x.bytes += bytes;
  x.blocks += blocks;
  x.time_s.push_back(Seconds(t_ns - start_ns));
  // The daemon's default reason for a failure without one.
  if (!ok) Count(x.failures, reason.empty() ? "error" : reason);
  Times& t = times_.at(i);
  if (recv && ok && !t.has_kv_ready) {
    t.kv_ready = t_ns;
    t.has_kv_ready = true;
  }
}

void Recorder::Sleep(uint64_t t_ns, const char* scheduler, const char* weights,
                     const char* kv_cache, uint64_t preempted) {
  const bool was_awake =
      sleep_.kv_cache == "resident" && sleep_.scheduler == "running";
  ++sleep_.transitions;
  sleep_.scheduler = scheduler;
  sleep_.weights = weights;
  sleep_.kv_cache = kv_cache;
  sleep_.preempted += preempted;
  const bool awake =
      sleep_.kv_cache == "resident" && sleep_.scheduler == "running";
  if (was_awake && !awake) asleep_since_ = t_ns;
  if (!was_awake && awake) sleep_.asleep_s += Seconds(t_ns - asleep_since_);
}

KvTransferFigures Recorder::Figures(const Transfer& t) {
  KvTransferFigures f;
  std::vector<double> times = t.time_s;
  f.time_s = Summarize(times);
  f.count = f.time_s.count;
  f.failures = t.failures;
  f.bytes = t.bytes;
  f.blocks = t.blocks;
  return f;
}

void Recorder::Tokens(size_t i, uint64_t t_ns, uint32_t n) {
  Times& t = times_.at(i);
  if (!t.has_first_token) {
    t.first_token = t_ns;
    t.has_first_token = true;
  } else {
    itl_s_.push_back(Seconds(t_ns - t.last_token));
  }
  t.last_token = t_ns;
  t.generation_tokens += n;
}

void Recorder::Finished(size_t i, uint64_t t_ns, Finish reason) {
  Times& t = times_.at(i);
  t.finished = t_ns;
  t.has_finished = true;
  t.reason = reason;
}

Report Recorder::Build(const std::string& backend, bool metrics,
                       uint64_t client_dropped_events) const {
  Report r;
  r.lora_adapters.resize(lora_loads_.size());
  for (size_t a = 0; a < lora_loads_.size(); ++a) {
    r.lora_adapters[a].name = LoraName(int32_t(a));
    r.lora_adapters[a].loads = lora_loads_[a];
    r.lora_loads += lora_loads_[a];
  }
  r.tenants.resize(num_tenants_);
  for (uint32_t i = 0; i < num_tenants_; ++i) {
    r.tenants[i].name = TenantName(int32_t(i));
  }
  if (priorities_) {
    for (const char* b : kPriorityBuckets) r.priorities.push_back({b});
  }
  std::vector<double> ttft, e2e, queue, prefill, decode, inference, tpot;
  std::vector<double> computed, preempted, kv_wait;
  uint64_t first_arrival = UINT64_MAX, last_finish = 0;
  for (const Times& t : times_) {
    GroupCounts* groups[3] = {
        t.lora >= 0 ? &r.lora_adapters[size_t(t.lora)] : nullptr,
        t.tenant >= 0 ? &r.tenants[size_t(t.tenant)] : nullptr,
        priorities_ && t.has_arrived ? &r.priorities[PriorityBucket(t.priority)]
                                     : nullptr};
    for (GroupCounts* g : groups) {
      if (g == nullptr) continue;
      g->generation_tokens += t.generation_tokens;
      if (t.has_first_token) g->prompt_tokens += t.prompt_tokens;
      if (!t.has_finished) continue;
      ++g->requests;
      if (t.reason == Finish::kStop) ++g->finished_stop;
      if (t.reason == Finish::kLength) ++g->finished_length;
      if (t.reason == Finish::kError) ++g->finished_error;
    }
    if (t.has_arrived) first_arrival = std::min(first_arrival, t.arrived);
    r.generation_tokens += t.generation_tokens;
    // SCHEDULED's info never claims more than the prompt.
    const uint32_t cached = std::min(t.cached, t.prompt_tokens);
    const uint32_t external = std::min(t.external, t.prompt_tokens - cached);
    if (t.has_first_token) {
      r.prompt_tokens += t.prompt_tokens;
      r.prompt_local_cache_hit += cached;
      r.prompt_external_kv += external;
      r.prompt_local_compute += t.prompt_tokens - cached - external;
      if (t.has_arrived) ttft.push_back(Seconds(t.first_token - t.arrived));
      if (t.has_scheduled) {
        prefill.push_back(Seconds(t.first_token - t.scheduled));
      }
    }
    if (!t.has_finished) continue;
    ++r.requests;
    last_finish = std::max(last_finish, t.finished);
    if (t.reason == Finish::kStop) ++r.finished_stop;
    if (t.reason == Finish::kLength) ++r.finished_length;
    if (t.reason == Finish::kError) ++r.finished_error;
    if (t.has_arrived) e2e.push_back(Seconds(t.finished - t.arrived));
    computed.push_back(double(t.prompt_tokens - cached - external));
    preempted.push_back(double(t.preemptions));
    if (t.has_kv_ready && t.has_scheduled) {
      kv_wait.push_back(Seconds(t.kv_ready - t.scheduled));
    }
    const uint64_t queued = t.has_queued ? t.queued : t.arrived;
    if (t.has_scheduled && (t.has_queued || t.has_arrived)) {
      queue.push_back(Seconds(t.scheduled - queued));
    }
    if (t.has_first_token) {
      const uint64_t d = t.last_token - t.first_token;
      decode.push_back(Seconds(d));
      if (t.has_scheduled) {
        inference.push_back(Seconds(t.last_token - t.scheduled));
      }
      if (t.generation_tokens > 1) {
        tpot.push_back(double(d) / double(t.generation_tokens - 1) / 1e9);
      }
    }
  }
  std::vector<double> itl = itl_s_;
  r.ttft = Summarize(ttft);
  r.itl = Summarize(itl);
  r.e2e = Summarize(e2e);
  r.queue = Summarize(queue);
  r.prefill = Summarize(prefill);
  r.decode = Summarize(decode);
  r.inference = Summarize(inference);
  r.tpot = Summarize(tpot);
  r.prefill_kv_computed_tokens = Summarize(computed);
  r.num_preemptions_per_request = Summarize(preempted);
  r.kv_wait = Summarize(kv_wait);
  r.kv_send = Figures(send_);
  r.kv_recv = Figures(recv_);
  r.admission_rejections = rejections_;
  r.kv_handoffs = handoffs_;
  r.traceparents = traceparents_;
  r.sleep = sleep_;
  r.last_step = last_step_;
  if (r.requests > 0 && last_finish > first_arrival) {
    r.duration_s = Seconds(last_finish - first_arrival);
    r.output_tokens_per_s = double(r.generation_tokens) / r.duration_s;
  }
  r.backend = backend;
  r.metrics = metrics;
  r.client_dropped_events = client_dropped_events;
  r.preemptions = preemptions_;
  r.prefix_cache_queries = prefix_queries_;
  r.prefix_cache_hits = prefix_hits_;
  r.steps = steps_;
  r.lora_evictions = lora_evictions_;
  r.lora_skips = lora_skips_;
  return r;
}

}  // namespace tokenmeter::engine
