#include "engine/engine.h"

#include <time.h>

#include <cerrno>
#include <cstdlib>
#include <span>
#include <string_view>

#include "engine/sampler.h"
#include "engine/workload.h"

namespace tokenmeter::engine {
namespace {

// Sleeps until CLOCK_MONOTONIC reaches t_ns (the clock of tm_now_ns()).
void SleepUntil(uint64_t t_ns) {
  timespec ts{};
  ts.tv_sec = time_t(t_ns / 1'000'000'000);
  ts.tv_nsec = long(t_ns % 1'000'000'000);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) ==
         EINTR) {
  }
}

uint64_t CpuNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

tokenmeter::FinishReason ToClient(Finish f) {
  return f == Finish::kStop ? tokenmeter::FinishReason::kStop
                            : tokenmeter::FinishReason::kLength;
}

}  // namespace

Engine::Engine(const EngineOptions& o)
    : options_(o),
      recorder_(o.workload.requests, o.workload.lora_adapters,
                o.workload.tenants) {}

Engine::~Engine() = default;

Status Engine::Create(const EngineOptions& o, std::unique_ptr<Engine>* out) {
  std::unique_ptr<Engine> e(new Engine(o));

  std::vector<WorkloadRequest> work = GenerateWorkload(o.workload);
  e->requests_.reserve(work.size());
  e->arrival_offset_ns_.reserve(work.size());
  for (WorkloadRequest& w : work) {
    e->arrival_offset_ns_.push_back(w.arrival_offset_ns);
    Request& r =
        e->requests_.emplace_back(w.id, std::move(w.prompt), w.max_tokens,
                                  Mix64(o.workload.seed ^ (w.id * 0x9e37ULL)));
    r.lora = w.lora;
    r.tenant = w.tenant;
  }
  // The names ARRIVED carries, made once (no allocation per request).
  for (uint32_t i = 0; i < o.workload.lora_adapters; ++i) {
    e->lora_names_.push_back(LoraName(int32_t(i)));
  }
  for (uint32_t i = 0; i < o.workload.tenants; ++i) {
    e->tenant_names_.push_back(TenantName(int32_t(i)));
  }
  e->kv_ = std::make_unique<BlockManager>(o.kv);
  e->scheduler_ = std::make_unique<Scheduler>(o.scheduler, *e->kv_);

  const KvLayout layout{o.kv.num_blocks, o.kv.block_size};
  std::unique_ptr<Weights> weights = MakeWeights(o.model);
  LoraLayout lora;
  if (o.workload.lora_adapters > 0) {
    lora = {o.scheduler.max_lora, o.lora_rank};
    e->adapters_.reserve(o.workload.lora_adapters);
    for (uint32_t i = 0; i < o.workload.lora_adapters; ++i) {
      e->adapters_.push_back(MakeLoraAdapter(o.model, o.lora_rank, i));
    }
  }
  bool use_cuda = o.backend == Backend::kCuda;
  if (o.backend == Backend::kAuto) use_cuda = CudaDeviceAvailable(nullptr);
  if (use_cuda) {
    Status s = MakeCudaModel(*weights, layout, lora, &e->model_);
    if (!s.ok()) return Status::Error("--backend cuda: " + s.message());
  } else {
    e->model_ = MakeCpuModel(*weights, layout, lora);
  }
  e->logits_.resize(size_t(o.scheduler.max_batch) * o.model.vocab);
  if (o.model.moe_experts > 0) {
    e->model_->SetExpertCounting(e->counts_experts());
    e->expert_delta_.assign(size_t(o.model.n_layers) * o.model.moe_experts, 0);
    e->expert_total_ = e->expert_delta_;
  }

  if (o.metrics) {
    tokenmeter::Options co;
    co.socket_path = o.metrics_socket;
    co.engine = o.engine_name;
    co.model = o.model_name;
    co.instance = o.instance;
    co.scope = o.scope;
    co.profile = o.metrics_profile;
    co.ack = o.metrics_ack;
    // The KV cache's shape under the keys the chosen engine family uses.
    if (o.metrics_profile == "sglang") {
      co.cache_config = {{"page_size", int64_t(o.kv.block_size)},
                         {"num_pages", int64_t(o.kv.num_blocks)}};
    } else {
      co.cache_config = {{"block_size", int64_t(o.kv.block_size)},
                         {"num_gpu_blocks", int64_t(o.kv.num_blocks)},
                         {"enable_prefix_caching", o.kv.prefix_caching}};
    }
    if (o.workload.lora_adapters > 0) co.max_lora = o.scheduler.max_lora;
    const int rc = tokenmeter::Client::Create(co, &e->meter_);
    if (rc != TM_OK) {
      return Status::Error(
          std::string("metrics client (check --metrics-socket, "
                      "--engine-name, --model, --instance, --scope): ") +
          tm_strerror(rc));
    }
  }
  *out = std::move(e);
  return Status::Ok();
}

Status Engine::Run() {
  // The loop thread's event buffer, allocated before the first step.
  if (meter_) meter_->AttachThread();
  const uint64_t loop_cpu0 = CpuNs(CLOCK_THREAD_CPUTIME_ID);
  const uint64_t process_cpu0 = CpuNs(CLOCK_PROCESS_CPUTIME_ID);
  const size_t n = requests_.size();
  const uint64_t start_ns = NowNs();
  size_t next = 0;
  uint64_t finished = 0;
  Status status = Status::Ok();
  while (finished < n) {
    // Admit every request whose arrival instant has come.
    const uint64_t now_ns = NowNs();
    while (next < n && start_ns + arrival_offset_ns_[next] <= now_ns) {
      Request& r = requests_[next];
      const uint64_t arrived_ns = start_ns + arrival_offset_ns_[next];
      recorder_.Arrived(next, arrived_ns, r.prompt_len);
      recorder_.Groups(next, r.lora, r.tenant);
      recorder_.Queued(next, now_ns);
      if (meter_) {
        if (r.lora >= 0 || r.tenant >= 0) {
          // ARRIVED params (protocol 1.1): the adapter and the tenant label.
          // (string_view on both sides of ?:, else a temporary std::string.)
          const std::string_view none;
          const tokenmeter::RequestLabel tenant[] = {
              {"tenant", r.tenant >= 0
                             ? std::string_view(tenant_names_[size_t(r.tenant)])
                             : none}};
          const std::string_view lora =
              r.lora >= 0 ? std::string_view(lora_names_[size_t(r.lora)])
                          : none;
          meter_->Arrived(r.id, r.prompt_len, r.max_tokens, 1, lora,
                          std::span(tenant, r.tenant >= 0 ? 1 : 0), arrived_ns);
        } else {
          meter_->Arrived(r.id, r.prompt_len, r.max_tokens, 1, arrived_ns);
        }
        meter_->Queued(r.id, now_ns);
      }
      scheduler_->Add(&r);
      ++next;
    }
    if (scheduler_->num_running() == 0 && scheduler_->num_waiting() == 0) {
      SleepUntil(start_ns + arrival_offset_ns_[next]);  // idle
      continue;
    }
    status = Step(&finished);
    if (!status.ok()) break;
  }
  // The last partial counts, before the client closes.
  if (status.ok() && counts_experts() && steps_since_expert_load_ > 0) {
    status = SendExpertLoad(NowNs());
  }
  if (meter_) {
    client_stats_ = meter_->Close();
    client_dropped_ = client_stats_.events_dropped;
  }
  loop_cpu_s_ = double(CpuNs(CLOCK_THREAD_CPUTIME_ID) - loop_cpu0) / 1e9;
  process_cpu_s_ = double(CpuNs(CLOCK_PROCESS_CPUTIME_ID) - process_cpu0) / 1e9;
  return status;
}

Status Engine::Step(uint64_t* finished) {
  scheduler_->Schedule(&plan_);
  // Every request fits the cache alone (checked with the options), so a
  // step with work waiting always schedules something.
  if (plan_.empty()) std::abort();

  const uint64_t sched_ns = NowNs();
  for (Request* r : plan_.preempted) {
    recorder_.Preempted();
    if (meter_) meter_->Preempted(r->id, sched_ns);
  }
  for (Request* r : plan_.first_scheduled) {
    recorder_.Scheduled(size_t(r->id - 1), sched_ns);
    if (meter_) meter_->Scheduled(r->id, sched_ns);
  }

  chunks_.clear();
  uint64_t prompt_tokens = 0;
  for (const ScheduledChunk& c : plan_.chunks) {
    Request* r = c.request;
    SeqChunk ch;
    ch.tokens = r->tokens.data() + r->num_computed;
    ch.num_tokens = c.num_tokens;
    ch.start_pos = r->num_computed;
    ch.block_table = r->kv.blocks.data();
    ch.num_blocks = uint32_t(r->kv.blocks.size());
    ch.want_logits = r->num_computed + c.num_tokens == r->num_tokens();
    ch.lora_slot = r->lora_slot;
    const bool decode = c.num_tokens == 1 && r->num_output() > 0 &&
                        r->num_computed + 1 == r->num_tokens();
    prompt_tokens += decode ? 0 : c.num_tokens;
    chunks_.push_back(ch);
  }
  if (logits_.size() < chunks_.size() * size_t(options_.model.vocab)) {
    logits_.resize(chunks_.size() * size_t(options_.model.vocab));
  }
  // Adapters the step needs, uploaded into their slots before it runs (as
  // a real engine's model runner does, so it counts in the prefill time).
  for (const AdapterLoad& l : plan_.lora_loads) {
    Status s =
        model_->LoadLora(uint32_t(l.slot), adapters_.at(size_t(l.adapter)));
    if (!s.ok()) return s;
    recorder_.LoraLoaded(l.adapter, l.evicted >= 0);
  }
  Status s = model_->Forward(chunks_, logits_.data());
  if (!s.ok()) return s;

  // Sample every chunk that reached the end of its sequence.
  size_t row = 0;
  for (size_t i = 0; i < plan_.chunks.size(); ++i) {
    scheduler_->Advance(plan_.chunks[i]);
    if (!chunks_[i].want_logits) continue;
    Request* r = plan_.chunks[i].request;
    const float* l = &logits_[row++ * options_.model.vocab];
    r->tokens.push_back(
        SampleToken(l, options_.model.vocab, options_.temperature, r->rng));
  }

  // The step's one timestamp: every token of this step appeared now.
  const uint64_t t_ns = NowNs();
  uint64_t generated = 0;
  for (size_t i = 0; i < plan_.chunks.size(); ++i) {
    if (!chunks_[i].want_logits) continue;
    Request* r = plan_.chunks[i].request;
    const size_t idx = size_t(r->id - 1);
    ++generated;
    recorder_.Tokens(idx, t_ns, 1);
    if (meter_) meter_->Tokens(r->id, 1, t_ns);
    const Finish f =
        CheckFinish(r->tokens.back(), r->num_output(), r->max_tokens);
    if (f == Finish::kNone) continue;
    recorder_.Finished(idx, t_ns, f);
    if (meter_) meter_->Finished(r->id, ToClient(f), t_ns);
    scheduler_->Finish(r);
    ++*finished;
  }
  recorder_.Step(plan_.prefix_queries, plan_.prefix_hits, plan_.lora_skips);
  if (meter_) {
    tokenmeter::StepStats st;
    st.Running(scheduler_->num_running())
        .Waiting(scheduler_->num_waiting())
        .KvUsage(kv_->Usage())
        .PromptTokens(prompt_tokens)
        .GenerationTokens(generated)
        .PrefixQueries(plan_.prefix_queries)
        .PrefixHits(plan_.prefix_hits);
    meter_->Step(st, t_ns);
  }
  if (counts_experts() &&
      ++steps_since_expert_load_ >= options_.expert_load_every) {
    return SendExpertLoad(t_ns);
  }
  return Status::Ok();
}

Status Engine::SendExpertLoad(uint64_t t_ns) {
  steps_since_expert_load_ = 0;
  Status s = model_->TakeExpertCounts(expert_delta_.data());
  if (!s.ok()) return s;
  const size_t experts = options_.model.moe_experts;
  for (size_t i = 0; i < expert_delta_.size(); ++i) {
    expert_total_[i] += expert_delta_[i];
  }
  if (meter_) {
    for (uint32_t l = 0; l < options_.model.n_layers; ++l) {
      const std::span<const uint64_t> counts(&expert_delta_[l * experts],
                                             experts);
      if (meter_->ExpertLoad(l, counts, t_ns) == TM_OK) ++expert_load_events_;
    }
  }
  return Status::Ok();
}

Report Engine::BuildReport() const {
  Report r =
      recorder_.Build(model_->backend(), options_.metrics, client_dropped_);
  r.loop_cpu_s = loop_cpu_s_;
  r.process_cpu_s = process_cpu_s_;
  r.client_events_sent = client_stats_.events_sent;
  r.client_reconnects = client_stats_.reconnects;
  r.client_events_rejected = client_stats_.events_rejected;
  if (counts_experts()) {
    const size_t experts = options_.model.moe_experts;
    r.moe_experts = options_.model.moe_experts;
    r.moe_top_k = options_.model.moe_top_k;
    r.moe_expert_load_events = expert_load_events_;
    for (uint32_t l = 0; l < options_.model.n_layers; ++l) {
      const auto begin = expert_total_.begin() + ptrdiff_t(l * experts);
      r.moe_expert_tokens.emplace_back(begin, begin + ptrdiff_t(experts));
      uint64_t sum = 0;
      for (uint64_t v : r.moe_expert_tokens.back()) sum += v;
      r.moe_routed_tokens.push_back(sum);
    }
  }
  return r;
}

}  // namespace tokenmeter::engine
