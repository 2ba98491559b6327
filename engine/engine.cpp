#include "engine/engine.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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
  switch (f) {
    case Finish::kStop:
      return tokenmeter::FinishReason::kStop;
    case Finish::kError:
      return tokenmeter::FinishReason::kError;
    default:
      return tokenmeter::FinishReason::kLength;
  }
}

// The KV channel's connector name in KV_TRANSFER (a Unix socket).
constexpr const char* kConnector = "uds";
// The reasons of a failed transfer.
constexpr const char* kChecksumReason = "checksum";
constexpr const char* kBadSizeReason = "bad_size";

// A W3C traceparent, version 00, sampled: random 128-bit trace id and
// 64-bit parent (span) id, neither all zeros.
std::string MakeTraceparent(Rng& rng) {
  static const char kHex[] = "0123456789abcdef";
  uint64_t ids[3];
  do {
    ids[0] = rng.NextU64();
    ids[1] = rng.NextU64();
  } while ((ids[0] | ids[1]) == 0);
  do {
    ids[2] = rng.NextU64();
  } while (ids[2] == 0);
  std::string s = "00-";
  for (int w = 0; w < 3; ++w) {
    if (w == 2) s += '-';
    for (int shift = 60; shift >= 0; shift -= 4) {
      s += kHex[(ids[w] >> shift) & 0xf];
    }
  }
  s += "-01";
  return s;
}

uint64_t RandomSeed() {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != ssize_t(sizeof seed)) {
    seed = NowNs() ^ (uint64_t(getpid()) << 32);
  }
  return seed;
}

}  // namespace

const char* RoleName(EngineRole role) {
  switch (role) {
    case EngineRole::kPrefill:
      return "prefill";
    case EngineRole::kDecode:
      return "decode";
    default:
      return "monolithic";
  }
}

Engine::Engine(const EngineOptions& o, EngineRole role, KvChannel* channel)
    : options_(o),
      role_(role),
      channel_(channel),
      recorder_(o.workload.requests, o.workload.lora_adapters,
                o.workload.tenants) {}

Engine::~Engine() = default;

Status Engine::Create(const EngineOptions& o, std::unique_ptr<Engine>* out) {
  return Create(o, EngineRole::kMonolithic, nullptr, out);
}

Status Engine::Create(const EngineOptions& o, EngineRole role,
                      KvChannel* channel, std::unique_ptr<Engine>* out) {
  if ((role == EngineRole::kMonolithic) != (channel == nullptr)) std::abort();
  std::unique_ptr<Engine> e(new Engine(o, role, channel));
  if (o.workload.priority_levels > 0) e->recorder_.EnablePriorities();

  if (role == EngineRole::kDecode) {
    // Requests come from the prefill process: at most the workload's.
    e->requests_.reserve(o.workload.requests);
    e->index_of_.assign(o.workload.requests, -1);
  } else {
    std::vector<WorkloadRequest> work = GenerateWorkload(o.workload);
    e->trace_rng_ = Rng(RandomSeed());
    e->requests_.reserve(work.size());
    e->arrival_offset_ns_.reserve(work.size());
    for (WorkloadRequest& w : work) {
      e->arrival_offset_ns_.push_back(w.arrival_offset_ns);
      Request& r = e->requests_.emplace_back(
          w.id, std::move(w.prompt), w.max_tokens,
          Mix64(o.workload.seed ^ (w.id * 0x9e37ULL)));
      r.lora = w.lora;
      r.tenant = w.tenant;
      r.priority = w.priority;
      r.has_priority = w.has_priority;
      if (o.trace_context) r.traceparent = MakeTraceparent(e->trace_rng_);
    }
    if (role == EngineRole::kPrefill) e->held_.assign(work.size(), nullptr);
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
  e->block_floats_ = KvBlockBytes(o.model, layout) / sizeof(float);
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

  e->instance_ = o.instance;
  if (role != EngineRole::kMonolithic) {
    const char* part = RoleName(role);
    e->instance_ = o.instance.empty() ? part : o.instance + "-" + part;
    // vLLM's kv_transfer_config names the two sides so (kv_role).
    e->labels_ = {{"kv_role", role == EngineRole::kPrefill ? "kv_producer"
                                                           : "kv_consumer"}};
  }
  if (o.metrics) {
    tokenmeter::Options co;
    co.socket_path = o.metrics_socket;
    co.engine = o.engine_name;
    co.model = o.model_name;
    co.instance = e->instance_;
    co.scope = o.scope;
    co.labels = e->labels_;
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
    int rc = tokenmeter::Client::Create(co, &e->meter_);
    if (rc != TM_OK) {
      return Status::Error(
          std::string("metrics client (check --metrics-socket, "
                      "--engine-name, --model, --instance, --scope): ") +
          tm_strerror(rc));
    }
    rc = e->meter_->RegisterValue("queue_full", &e->queue_full_id_);
    if (rc == TM_OK) {
      rc = e->meter_->RegisterValue(kConnector, &e->connector_id_);
    }
    if (rc != TM_OK) {
      return Status::Error(std::string("metrics client: registering values: ") +
                           tm_strerror(rc));
    }
  }
  *out = std::move(e);
  return Status::Ok();
}

std::vector<int32_t> Engine::OutputById(uint64_t id) const {
  if (id == 0 || id > options_.workload.requests) return {};
  if (role_ != EngineRole::kDecode) return Output(Index(id));
  const int32_t at = index_of_[Index(id)];
  return at < 0 ? std::vector<int32_t>{} : Output(size_t(at));
}

void Engine::SendArrived(const Request& r, uint64_t arrived_ns,
                         uint64_t queued_ns, uint32_t max_tokens) {
  if (r.tenant >= 0 || r.lora >= 0 || r.has_priority ||
      !r.traceparent.empty()) {
    // ARRIVED params: the adapter and the tenant label (1.1), the priority
    // and the trace context (1.2).
    tokenmeter::RequestParams p;
    p.max_tokens = max_tokens;
    p.n = 1;
    tokenmeter::RequestLabel tenant;
    if (r.tenant >= 0) {
      tenant = {"tenant", tenant_names_[size_t(r.tenant)]};
      p.labels = &tenant;
      p.n_labels = 1;
    }
    if (r.lora >= 0) p.lora = lora_names_[size_t(r.lora)];
    if (r.has_priority) p.priority = r.priority;
    p.traceparent = r.traceparent;
    meter_->Arrived(r.id, r.prompt_len, p, arrived_ns);
  } else {
    meter_->Arrived(r.id, r.prompt_len, max_tokens, 1, arrived_ns);
  }
  meter_->Queued(r.id, queued_ns);
}

void Engine::Admit(uint64_t now_ns) {
  const size_t n = requests_.size();
  while (next_ < n && start_ns_ + arrival_offset_ns_[next_] <= now_ns) {
    Request& r = requests_[next_];
    const uint64_t arrived_ns = start_ns_ + arrival_offset_ns_[next_];
    ++next_;
    if (options_.max_queued > 0 &&
        scheduler_->num_waiting() >= options_.max_queued) {
      // Refused at the front door: never a tracked request.
      recorder_.Rejected("queue_full");
      if (meter_) {
        meter_->AdmissionRejected(r.id, queue_full_id_, arrived_ns);
      }
      r.state = RequestState::kFinished;
      ++resolved_;
      continue;
    }
    const size_t idx = Index(r.id);
    recorder_.Arrived(idx, arrived_ns, r.prompt_len);
    recorder_.Groups(idx, r.lora, r.tenant);
    recorder_.Priority(idx, r.priority);
    recorder_.Queued(idx, now_ns);
    if (!r.traceparent.empty()) recorder_.Traced();
    // The prefill process is asked for the first token only (vLLM's
    // disaggregated proxy sends it max_tokens 1).
    if (meter_) {
      SendArrived(r, arrived_ns, now_ns,
                  role_ == EngineRole::kPrefill ? 1 : r.max_tokens);
    }
    scheduler_->Add(&r);
  }
}

Status Engine::Run() {
  // The loop thread's event buffer, allocated before the first step.
  if (meter_) meter_->AttachThread();
  const uint64_t loop_cpu0 = CpuNs(CLOCK_THREAD_CPUTIME_ID);
  const uint64_t process_cpu0 = CpuNs(CLOCK_PROCESS_CPUTIME_ID);
  start_ns_ = NowNs();
  // The prefill process never sleeps: it holds the K/V its peer pulls.
  if (options_.sleep_after_s >= 0 && role_ != EngineRole::kPrefill) {
    sleep_ = SleepCycle(start_ns_, uint64_t(options_.sleep_after_s * 1e9),
                        uint64_t(options_.wake_after_s * 1e9));
  }
  Status status = Status::Ok();
  for (;;) {
    if (role_ != EngineRole::kDecode) Admit(NowNs());
    if (channel_ != nullptr) {
      status = ServeChannel();
      if (!status.ok()) break;
    }
    status = DriveSleep(NowNs());
    if (!status.ok()) break;
    if (role_ == EngineRole::kPrefill && !end_sent_ &&
        resolved_ == requests_.size()) {
      channel_->SendEnd();  // no more hand-overs
      end_sent_ = true;
    }
    if (Done()) break;
    bool acted = false;
    if (!sleep_.asleep() &&
        scheduler_->num_running() + scheduler_->num_waiting() > 0) {
      status = Step(&acted);
      if (!status.ok()) break;
    }
    if (!acted) {
      status = Idle();
      if (!status.ok()) break;
    }
  }
  // The last partial counts, before the client closes.
  if (status.ok() && counts_experts() && steps_since_expert_load_ > 0) {
    status = SendExpertLoad(NowNs());
  }
  // What is still queued for the peer (END, the last ACKs).
  if (status.ok() && channel_ != nullptr) status = channel_->Flush();
  if (meter_) {
    client_stats_ = meter_->Close();
    client_dropped_ = client_stats_.events_dropped;
  }
  loop_cpu_s_ = double(CpuNs(CLOCK_THREAD_CPUTIME_ID) - loop_cpu0) / 1e9;
  process_cpu_s_ = double(CpuNs(CLOCK_PROCESS_CPUTIME_ID) - process_cpu0) / 1e9;
  return status;
}

bool Engine::Done() const {
  switch (role_) {
    case EngineRole::kPrefill:
      return resolved_ == requests_.size() && num_held_ == 0;
    case EngineRole::kDecode:
      return end_received_ && finished_ == requests_.size();
    default:
      return resolved_ == requests_.size();
  }
}

Status Engine::Idle() {
  uint64_t deadline = sleep_.next_deadline_ns();
  if (role_ != EngineRole::kDecode && next_ < requests_.size()) {
    const uint64_t arrival = start_ns_ + arrival_offset_ns_[next_];
    if (deadline == 0 || arrival < deadline) deadline = arrival;
  }
  if (channel_ != nullptr) return channel_->Wait(deadline);
  // Alone, an idle engine with work and no deadline would never move: every
  // request fits the cache alone, so a step with work always acts.
  if (deadline == 0) std::abort();
  SleepUntil(deadline);
  return Status::Ok();
}

Status Engine::DriveSleep(uint64_t now_ns) {
  switch (sleep_.Poll(now_ns, scheduler_->num_deferred() > 0)) {
    case SleepCycle::Action::kSleep: {
      // Pause: every running request loses its K/V (PREEMPTED) and waits;
      // the cache's memory goes back; the prefix cache is forgotten.
      scheduler_->PreemptAll(&sleep_out_);
      Status s = model_->ReleaseKvCache();
      if (!s.ok()) return s;
      kv_->Reset();
      const uint64_t t = NowNs();
      sleep_.AsleepSince(t);
      for (Request* r : sleep_out_.preempted) {
        recorder_.Preempted(Index(r->id));
        if (meter_) meter_->Preempted(r->id, t);
      }
      recorder_.Sleep(t, "paused", "resident", "released",
                      sleep_out_.preempted.size());
      if (meter_) {
        meter_->SleepState(tokenmeter::SchedulerState::kPaused,
                           tokenmeter::WeightsState::kResident,
                           tokenmeter::KvCacheState::kReleased, t);
      }
      // The iteration that preempted: nothing runs now.
      SendStep(t, 0, 0, 0, 0, 0);
      return Status::Ok();
    }
    case SleepCycle::Action::kWake: {
      Status s = model_->RestoreKvCache();
      if (!s.ok()) return s;
      const uint64_t t = NowNs();
      recorder_.Sleep(t, "running", "resident", "resident", 0);
      if (meter_) {
        meter_->SleepState(tokenmeter::SchedulerState::kRunning,
                           tokenmeter::WeightsState::kResident,
                           tokenmeter::KvCacheState::kResident, t);
      }
      return Status::Ok();
    }
    default:
      return Status::Ok();
  }
}

void Engine::SendStep(uint64_t t_ns, uint64_t prompt_tokens, uint64_t generated,
                      uint64_t lora_skips, uint64_t prefix_queries,
                      uint64_t prefix_hits) {
  const uint64_t running = scheduler_->num_running();
  const uint64_t waiting =
      scheduler_->num_waiting() + scheduler_->num_deferred();
  // Waiting for something other than capacity: a KV transfer in flight, or
  // an adapter slot (the requests passed over for theirs this step).
  const uint64_t deferred = scheduler_->num_deferred() + lora_skips;
  const double usage = kv_->Usage();
  recorder_.Step(prefix_queries, prefix_hits, lora_skips);
  recorder_.LastStep(running, waiting, deferred, usage);
  if (!meter_) return;
  tokenmeter::StepStats st;
  st.Running(running)
      .Waiting(waiting)
      .WaitingDeferred(deferred)
      .KvUsage(usage)
      .PromptTokens(prompt_tokens)
      .GenerationTokens(generated)
      .PrefixQueries(prefix_queries)
      .PrefixHits(prefix_hits);
  meter_->Step(st, t_ns);
}

void Engine::SendStepIfIdle(uint64_t t_ns) {
  if (scheduler_->num_running() + scheduler_->num_waiting() +
          scheduler_->num_deferred() ==
      0) {
    SendStep(t_ns, 0, 0, 0, 0, 0);
  }
}

Status Engine::Step(bool* acted) {
  scheduler_->set_admitting(!sleep_.paused());
  scheduler_->Schedule(&plan_);
  *acted = plan_.acted();
  if (!*acted) {
    // Alone, every request fits the cache, so a step with work acts; with
    // a peer, blocks held for a pull or K/V in flight may block it.
    if (channel_ == nullptr && !sleep_.paused()) std::abort();
    return Status::Ok();
  }

  const uint64_t sched_ns = NowNs();
  for (Request* r : plan_.preempted) {
    recorder_.Preempted(Index(r->id));
    if (meter_) meter_->Preempted(r->id, sched_ns);
  }
  for (Request* r : plan_.first_scheduled) {
    recorder_.Scheduled(Index(r->id), sched_ns, r->cached_tokens,
                        r->external_tokens);
    if (meter_) {
      meter_->Scheduled(r->id, {r->cached_tokens, r->external_tokens},
                        sched_ns);
    }
    // A hand-over whose every pulled position the local prefix cache holds
    // (or a one-token prompt) pulls nothing: an ACK of attempt 0 tells the
    // prefill side to free the blocks it holds for it.
    if (r->remote_kv && r->external_tokens == 0) {
      channel_->SendAck({r->id, 0, true, false, {}});
    }
  }
  for (Request* r : plan_.kv_pulls) {
    r->kv_attempts = 1;
    r->kv_start_ns = sched_ns;
    SendPull(r);
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
  if (!chunks_.empty()) {
    Status s = model_->Forward(chunks_, logits_.data());
    if (!s.ok()) return s;
  }

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
    const size_t idx = Index(r->id);
    ++generated;
    recorder_.Tokens(idx, t_ns, 1);
    if (meter_) meter_->Tokens(r->id, 1, t_ns);
    // The prefill process computes the first token only.
    const bool prefill = role_ == EngineRole::kPrefill;
    const Finish f = CheckFinish(r->tokens.back(), r->num_output(),
                                 prefill ? 1 : r->max_tokens);
    if (f == Finish::kNone) continue;
    recorder_.Finished(idx, t_ns, f);
    if (meter_) meter_->Finished(r->id, ToClient(f), t_ns);
    if (prefill && f == Finish::kLength && r->max_tokens > 1) {
      HandOver(r);  // the decode process goes on with it
    } else {
      scheduler_->Finish(r);
    }
    if (role_ == EngineRole::kDecode) {
      ++finished_;
    } else {
      ++resolved_;
    }
  }
  SendStep(t_ns, prompt_tokens, generated, plan_.lora_skips,
           plan_.prefix_queries, plan_.prefix_hits);
  if (counts_experts() &&
      ++steps_since_expert_load_ >= options_.expert_load_every) {
    return SendExpertLoad(t_ns);
  }
  return Status::Ok();
}

void Engine::HandOver(Request* r) {
  scheduler_->FinishHold(r);  // its blocks wait for the pull
  held_[Index(r->id)] = r;
  ++num_held_;
  recorder_.Handoff();
  KvHandoff h;
  h.rid = r->id;
  h.max_tokens = r->max_tokens;
  h.priority = r->priority;
  h.has_priority = r->has_priority;
  h.lora = r->lora;
  h.tenant = r->tenant;
  h.sampling_seed = r->sampling_seed;
  h.traceparent = r->traceparent;
  h.prompt.assign(r->tokens.begin(), r->tokens.begin() + r->prompt_len);
  channel_->SendHandoff(h);
}

void Engine::SendPull(Request* r) {
  channel_->SendPull(
      {r->id, r->kv_attempts, r->kv_first_block, r->kv_num_blocks});
}

void Engine::SendKvTransfer(const Request& r, bool recv, uint64_t t_ns,
                            uint64_t bytes, bool ok,
                            const std::string& reason) {
  recorder_.KvTransfer(Index(r.id), recv, r.kv_start_ns, t_ns, bytes,
                       r.kv_num_blocks, ok, reason);
  if (!meter_) return;
  tokenmeter::KvTransferInfo info;
  info.role = recv ? tokenmeter::KvRole::kRecv : tokenmeter::KvRole::kSend;
  info.start_ns = r.kv_start_ns;
  info.bytes = bytes;
  info.blocks = r.kv_num_blocks;
  info.ok = ok;
  if (!ok) info.reason = reason;
  info.connector_id = connector_id_;
  meter_->KvTransfer(r.id, info, t_ns);
}

Status Engine::ServeChannel() {
  Status s = channel_->Pump();
  if (!s.ok()) return s;
  for (;;) {
    bool got = false;
    s = channel_->Next(&msg_, &got);
    if (!s.ok()) return s;
    if (!got) break;
    const bool prefill = role_ == EngineRole::kPrefill;
    switch (msg_.type) {
      case KvMsgType::kPull:
        s = prefill ? ServePull(msg_.pull)
                    : Status::Error("KV channel: PULL sent to decode");
        break;
      case KvMsgType::kAck:
        s = prefill ? OnAck(msg_.ack)
                    : Status::Error("KV channel: ACK sent to decode");
        break;
      case KvMsgType::kReport:
        if (!prefill) return Status::Error("KV channel: REPORT to decode");
        peer_report_ = std::move(msg_.text);
        has_peer_report_ = true;
        break;
      case KvMsgType::kHandoff:
        s = !prefill ? OnHandoff(msg_.handoff)
                     : Status::Error("KV channel: HANDOFF sent to prefill");
        break;
      case KvMsgType::kKv:
        s = !prefill ? OnKv(msg_.kv)
                     : Status::Error("KV channel: KV sent to prefill");
        break;
      case KvMsgType::kEnd:
        if (prefill) return Status::Error("KV channel: END sent to prefill");
        end_received_ = true;
        break;
    }
    if (!s.ok()) return s;
  }
  // Send what the messages asked for at once (reading more would leave
  // messages unhandled until the next traffic).
  s = channel_->Pump(false);
  if (!s.ok()) return s;
  if (channel_->closed() && !Done()) {
    return Status::Error(
        std::string("KV channel: the ") +
        (role_ == EngineRole::kPrefill ? "decode" : "prefill") +
        " process closed it before the end");
  }
  return Status::Ok();
}

Status Engine::ServePull(const KvPull& p) {
  Request* r =
      p.rid >= 1 && p.rid <= held_.size() ? held_[Index(p.rid)] : nullptr;
  if (r == nullptr || p.num_blocks == 0 ||
      uint64_t(p.first_block) + p.num_blocks > r->kv.blocks.size()) {
    return Status::Error("KV channel: a PULL for nothing held (request " +
                         std::to_string(p.rid) + ")");
  }
  r->kv_start_ns = NowNs();
  r->kv_attempts = p.attempt;
  r->kv_first_block = p.first_block;
  r->kv_num_blocks = p.num_blocks;
  const size_t floats = size_t(p.num_blocks) * block_floats_;
  kv_scratch_.resize(floats);
  Status s = model_->ReadKvBlocks(r->kv.blocks.data() + p.first_block,
                                  p.num_blocks, kv_scratch_.data());
  if (!s.ok()) return s;
  const uint64_t checksum =
      KvChecksum(kv_scratch_.data(), floats * sizeof(float));
  // --kv-fail-every: this transfer arrives damaged (one bit flipped after
  // the checksum was taken), which the receiver's check catches.
  ++kv_sends_;
  if (options_.kv_fail_every > 0 && kv_sends_ % options_.kv_fail_every == 0) {
    uint32_t bits;
    std::memcpy(&bits, &kv_scratch_[floats / 2], sizeof bits);
    bits ^= 1u;
    std::memcpy(&kv_scratch_[floats / 2], &bits, sizeof bits);
  }
  channel_->SendKv(p, kv_scratch_.data(), floats, checksum);
  return Status::Ok();
}

Status Engine::OnAck(const KvAck& a) {
  Request* r =
      a.rid >= 1 && a.rid <= held_.size() ? held_[Index(a.rid)] : nullptr;
  // Attempt 0: the decode side pulls nothing (never a PULL: kv_attempts 0)
  // and only frees the blocks; no transfer, no KV_TRANSFER.
  if (r == nullptr || a.attempt != r->kv_attempts ||
      (a.attempt == 0 && (!a.ok || a.retry))) {
    return Status::Error("KV channel: an ACK for no transfer (request " +
                         std::to_string(a.rid) + ")");
  }
  const uint64_t t = NowNs();
  if (a.attempt != 0) {
    // The send ends when the receiver has checked what arrived.
    SendKvTransfer(*r, false, t,
                   uint64_t(r->kv_num_blocks) * block_floats_ * sizeof(float),
                   a.ok, a.reason);
  }
  if (a.ok || !a.retry) {
    scheduler_->ReleaseHeld(r);
    held_[Index(a.rid)] = nullptr;
    --num_held_;
    SendStepIfIdle(t);  // the blocks went back to the cache
  }
  return Status::Ok();
}

Status Engine::OnHandoff(KvHandoff& h) {
  const uint64_t now = NowNs();
  const WorkloadOptions& w = options_.workload;
  if (h.rid < 1 || h.rid > w.requests || index_of_[Index(h.rid)] >= 0 ||
      h.prompt.empty() || h.prompt.size() > options_.model.max_context ||
      h.lora >= int32_t(w.lora_adapters) || h.tenant >= int32_t(w.tenants) ||
      h.max_tokens < 1) {
    return Status::Error("KV channel: a bad hand-over (request " +
                         std::to_string(h.rid) + ")");
  }
  for (int32_t t : h.prompt) {
    if (t < 0 || uint32_t(t) >= options_.model.vocab) {
      return Status::Error("KV channel: a bad prompt token");
    }
  }
  index_of_[Index(h.rid)] = int32_t(requests_.size());
  Request& r = requests_.emplace_back(h.rid, std::move(h.prompt), h.max_tokens,
                                      h.sampling_seed);
  r.lora = h.lora;
  r.tenant = h.tenant;
  r.priority = h.priority;
  r.has_priority = h.has_priority;
  r.traceparent = h.traceparent;
  r.remote_kv = true;
  const size_t idx = Index(r.id);
  // The decode instance's front door: the hand-over's arrival.
  recorder_.Arrived(idx, now, r.prompt_len);
  recorder_.Groups(idx, r.lora, r.tenant);
  recorder_.Priority(idx, r.priority);
  recorder_.Queued(idx, now);
  recorder_.Handoff();
  if (!r.traceparent.empty()) recorder_.Traced();
  if (meter_) SendArrived(r, now, now, r.max_tokens);
  scheduler_->Add(&r);
  return Status::Ok();
}

Status Engine::OnKv(const KvData& k) {
  const int32_t at =
      k.rid >= 1 && k.rid <= index_of_.size() ? index_of_[Index(k.rid)] : -1;
  Request* r = at >= 0 ? &requests_[size_t(at)] : nullptr;
  if (r == nullptr || r->state != RequestState::kDeferred ||
      k.attempt != r->kv_attempts) {
    return Status::Error("KV channel: KV for no pull (request " +
                         std::to_string(k.rid) + ")");
  }
  const uint64_t t = NowNs();
  const uint64_t bytes = uint64_t(k.data.size()) * sizeof(float);
  std::string reason;
  if (k.first_block != r->kv_first_block || k.num_blocks != r->kv_num_blocks ||
      k.data.size() != size_t(r->kv_num_blocks) * block_floats_) {
    reason = kBadSizeReason;
  } else if (KvChecksum(k.data.data(), bytes) != k.checksum) {
    reason = kChecksumReason;
  }
  const bool ok = reason.empty();
  if (ok) {
    Status s = model_->WriteKvBlocks(r->kv.blocks.data() + r->kv_first_block,
                                     r->kv_num_blocks, k.data.data());
    if (!s.ok()) return s;
  }
  SendKvTransfer(*r, true, t, bytes, ok, reason);
  if (ok) {
    channel_->SendAck({r->id, k.attempt, true, false, {}});
    scheduler_->LandKv(r);
    return Status::Ok();
  }
  if (r->kv_attempts <= options_.kv_retries) {
    channel_->SendAck({r->id, k.attempt, false, true, reason});
    ++r->kv_attempts;
    r->kv_start_ns = t;
    SendPull(r);
    return Status::Ok();
  }
  // Given up: the request ends with an error, as a server would answer.
  channel_->SendAck({r->id, k.attempt, false, false, reason});
  scheduler_->AbortDeferred(r);
  recorder_.Finished(Index(r->id), t, Finish::kError);
  if (meter_) meter_->Finished(r->id, tokenmeter::FinishReason::kError, t);
  ++finished_;
  SendStepIfIdle(t);  // it left the deferred queue, its blocks the cache
  return Status::Ok();
}

Status Engine::ReceivePeerReport(std::string* json) {
  while (!has_peer_report_) {
    Status s = channel_->Receive(&msg_);
    if (!s.ok()) return s;
    if (msg_.type == KvMsgType::kReport) {
      peer_report_ = std::move(msg_.text);
      has_peer_report_ = true;
    }
  }
  *json = peer_report_;
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
  r.role = RoleName(role_);
  r.engine_name = options_.engine_name;
  r.model_name = options_.model_name;
  // The `engine` label the daemon gives this connection's series.
  r.instance = instance_.empty() ? "0" : instance_;
  r.labels = labels_;
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
