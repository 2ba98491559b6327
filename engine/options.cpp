#include "engine/options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <type_traits>

#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::engine {
namespace {

constexpr std::string_view kUsage =
    R"(Usage: tokenmeter-engine [flags]

A reference LLM inference engine (continuous batching, paged KV cache with
a prefix cache, preemption by recompute) running a small transformer with
random weights on CUDA or the CPU, reporting to tokenmeterd.

Workload:
  --requests N              requests to run (default 200)
  --rate R                  requests/s, Poisson arrivals; 0 = all at once (0)
  --prompt-len N            mean prompt length in tokens (128)
  --output-len N            mean output limit (max_tokens) in tokens (64)
  --shared-prefix F         fraction of the mean prompt shared by all (0)
  --seed N                  seed of workload, weights and sampling (1)
Engine:
  --max-batch N             most running requests (32)
  --max-tokens-per-step N   token budget of one step; chunked prefill (512)
  --kv-blocks N             KV cache blocks (1024)
  --block-size N            tokens per KV block (16)
  --no-prefix-cache         do not share full prompt blocks
  --model-size S            tiny, small, medium, large (tiny)
  --temperature T           sampling temperature; 0 = greedy (1)
  --backend B               auto, cpu, cuda (auto: cuda when a device answers)
Mixture of experts:
  --moe-experts E           every layer's MLP becomes E experts, 1..1024
                            (0 = dense MLP, the default)
  --moe-top-k K             experts per token, 1..16 and at most E (2)
  --expert-load-every N     send the routed-token counts (EXPERT_LOAD) every
                            N steps and at the end; 0 = do not count (16)
Protocol 1.2 modes:
  --disaggregate            run as two processes, prefill and decode, that
                            hand each request's KV cache over a Unix socket
  --kv-fail-every N         corrupt every Nth KV transfer (0 = never; needs
                            --disaggregate)
  --kv-retries R            retries of a failed KV transfer before the
                            request ends with `error`, 0..16 (1; needs
                            --disaggregate)
  --max-queued N            reject an arrival that finds N requests waiting
                            (ADMISSION_REJECTED queue_full; 0 = no cap)
  --priority-levels K       each request gets a priority (lower runs first)
                            from K levels centred on 0 (0 = none)
  --priority [K]            a priority workload: --priority-levels 5 (-2..2,
                            vLLM's five buckets), or K (--priority=K too)
  --sleep-after S           sleep S seconds after the start: pause, preempt,
                            release the KV cache (with --wake-after)
  --wake-after S            wake S seconds after falling asleep
  --trace-context           send a W3C traceparent with every ARRIVED
                            (always with --disaggregate)
LoRA and tenants:
  --lora-adapters N         LoRA adapters lora-0..lora-N-1; each request uses
                            one, Zipf-skewed (0 = base model only)
  --max-lora M              adapters resident at once, 1..256 (4)
  --lora-rank R             adapter rank, 1..64 and at most d_model (8)
  --tenants T               tenants tenant-0..tenant-T-1, one per request,
                            sent as the `tenant` label (3; 0 = no label)
Metrics:
  --metrics-socket PATH     tokenmeterd's ingest socket
                            (default /run/tokenmeter/ingest.sock)
  --no-metrics              do not report to tokenmeterd
  --no-ack                  do not ask tokenmeterd for ACKs (a 1.0 daemon)
  --engine-name NAME        HELLO engine (tokenmeter-engine)
  --model NAME              HELLO model (tokenmeter-<size>)
  --instance ID             HELLO instance (the `engine` label)
  --scope NAME              HELLO scope (shared request-id space)
  --metrics-profile P       HELLO profile: vllm, sglang, lmdeploy (not sent)
Output:
  --report FILE.json        write the engine's own figures
  --quiet                   no summary line on stdout
  --help, --version
)";

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  if (s.empty()) return false;
  if constexpr (std::is_floating_point_v<T>) {
    // strtod is locale-dependent; from_chars is not.
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size() &&
           std::isfinite(*out);
  } else {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
  }
}

Status Bad(std::string_view flag, std::string_view value) {
  return Status::Error("invalid value for " + std::string(flag) + ": '" +
                       std::string(value) + "'");
}

Status ValidateLora(EngineOptions& o) {
  const uint32_t n = o.workload.lora_adapters;
  if (o.max_lora > kMaxLoraSlots) {
    return Status::Error("--max-lora must be 1.." +
                         std::to_string(kMaxLoraSlots));
  }
  if (n > 0 && o.max_lora < 1) {
    return Status::Error("--max-lora must be >= 1 with --lora-adapters " +
                         std::to_string(n));
  }
  if (o.lora_rank < 1 || o.lora_rank > kMaxLoraRank ||
      o.lora_rank > o.model.d_model) {
    return Status::Error("--lora-rank must be 1.." +
                         std::to_string(kMaxLoraRank) + " and at most the " +
                         o.model.size + " model's d_model of " +
                         std::to_string(o.model.d_model));
  }
  const uint64_t bytes =
      uint64_t(LoraAdapterFloats(o.model, o.lora_rank)) * sizeof(float);
  const uint64_t total = (uint64_t(n) + (n > 0 ? o.max_lora : 0)) * bytes;
  if (total > kMaxLoraBytes) {
    return Status::Error(
        "LoRA weights would take " + std::to_string(total >> 20) +
        " MiB (--lora-adapters " + std::to_string(n) + " + --max-lora " +
        std::to_string(o.max_lora) + " slots of " +
        std::to_string(bytes >> 10) + " KiB at --lora-rank " +
        std::to_string(o.lora_rank) + "), more than " +
        std::to_string(kMaxLoraBytes >> 20) + " MiB");
  }
  o.scheduler.max_lora = n > 0 ? o.max_lora : 0;
  return Status::Ok();
}

}  // namespace

std::string_view UsageText() { return kUsage; }

Status ParseOptions(int argc, const char* const* argv, EngineOptions* o) {
  o->metrics_socket = TM_DEFAULT_SOCKET_PATH;
  o->workload.tenants = 3;
  std::string model_size = "tiny";
  uint64_t seed = 1;
  uint32_t moe_experts = 0, moe_top_k = 2;
  bool top_k_set = false;
  bool priority_workload = false;      // --priority or --priority=K
  std::optional<uint32_t> priority_k;  // --priority=K
  bool levels_given = false;           // --priority-levels (wins)
  std::string_view kv_flag;            // a --kv-* flag given
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view flag = arg, value;
    bool has_value = false;
    if (const size_t eq = arg.find('=');
        arg.rfind("--", 0) == 0 && eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    // Flags without a value.
    if (flag == "--help" || flag == "-h") {
      o->show_help = true;
      continue;
    }
    if (flag == "--version") {
      o->show_version = true;
      continue;
    }
    if (flag == "--no-metrics") {
      o->metrics = false;
      continue;
    }
    if (flag == "--no-ack") {
      o->metrics_ack = false;
      continue;
    }
    if (flag == "--no-prefix-cache") {
      o->kv.prefix_caching = false;
      continue;
    }
    if (flag == "--quiet") {
      o->quiet = true;
      continue;
    }
    if (flag == "--disaggregate") {
      o->disaggregate = true;
      continue;
    }
    if (flag == "--trace-context") {
      o->trace_context = true;
      continue;
    }
    // --priority alone, or with its K as --priority=K or --priority K (the
    // next argument taken when it looks like a number, a negative or a too
    // large one included, so that the error names --priority: the engine
    // takes no operands, so nothing else could be meant).
    if (flag == "--priority" && !has_value) {
      const std::string_view next = i + 1 < argc ? argv[i + 1] : "";
      const auto digit = [](char c) { return c >= '0' && c <= '9'; };
      if (!next.empty() &&
          (digit(next[0]) ||
           (next.size() > 1 && next[0] == '-' && digit(next[1])))) {
        value = argv[++i];
        has_value = true;
      } else {
        priority_workload = true;
        continue;
      }
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return Status::Error("unknown flag or missing value: " +
                             std::string(arg));
      }
      value = argv[++i];
    }
    auto u32 = [&](uint32_t* dst) -> Status {
      return ParseNumber(value, dst) ? Status::Ok() : Bad(flag, value);
    };
    auto f64 = [&](double* dst) -> Status {
      return ParseNumber(value, dst) ? Status::Ok() : Bad(flag, value);
    };
    Status s = Status::Ok();
    if (flag == "--requests") {
      s = u32(&o->workload.requests);
    } else if (flag == "--rate") {
      s = f64(&o->workload.rate);
    } else if (flag == "--prompt-len") {
      s = u32(&o->workload.prompt_len);
    } else if (flag == "--output-len") {
      s = u32(&o->workload.output_len);
    } else if (flag == "--shared-prefix") {
      s = f64(&o->workload.shared_prefix);
    } else if (flag == "--seed") {
      if (!ParseNumber(value, &seed)) s = Bad(flag, value);
    } else if (flag == "--max-batch") {
      s = u32(&o->scheduler.max_batch);
    } else if (flag == "--max-tokens-per-step") {
      s = u32(&o->scheduler.max_tokens_per_step);
    } else if (flag == "--kv-blocks") {
      s = u32(&o->kv.num_blocks);
    } else if (flag == "--block-size") {
      s = u32(&o->kv.block_size);
    } else if (flag == "--model-size") {
      model_size = std::string(value);
    } else if (flag == "--temperature") {
      double t = 0;
      s = f64(&t);
      if (s.ok() && !(t >= 0 && t <= 100)) s = Bad(flag, value);
      o->temperature = float(t);
    } else if (flag == "--backend") {
      if (value == "auto") {
        o->backend = Backend::kAuto;
      } else if (value == "cpu") {
        o->backend = Backend::kCpu;
      } else if (value == "cuda") {
        o->backend = Backend::kCuda;
      } else {
        s = Bad(flag, value);
      }
    } else if (flag == "--metrics-socket") {
      o->metrics_socket = std::string(value);
    } else if (flag == "--engine-name") {
      o->engine_name = std::string(value);
    } else if (flag == "--model") {
      o->model_name = std::string(value);
    } else if (flag == "--instance") {
      o->instance = std::string(value);
    } else if (flag == "--scope") {
      o->scope = std::string(value);
    } else if (flag == "--lora-adapters") {
      s = u32(&o->workload.lora_adapters);
    } else if (flag == "--max-lora") {
      s = u32(&o->max_lora);
    } else if (flag == "--lora-rank") {
      s = u32(&o->lora_rank);
    } else if (flag == "--moe-experts") {
      s = u32(&moe_experts);
    } else if (flag == "--moe-top-k") {
      s = u32(&moe_top_k);
      top_k_set = true;
    } else if (flag == "--expert-load-every") {
      s = u32(&o->expert_load_every);
    } else if (flag == "--tenants") {
      s = u32(&o->workload.tenants);
    } else if (flag == "--kv-fail-every") {
      s = u32(&o->kv_fail_every);
      kv_flag = flag;
    } else if (flag == "--kv-retries") {
      s = u32(&o->kv_retries);
      kv_flag = flag;
    } else if (flag == "--max-queued") {
      s = u32(&o->max_queued);
    } else if (flag == "--priority") {
      priority_workload = true;
      priority_k.emplace(0);
      s = u32(&*priority_k);
    } else if (flag == "--priority-levels") {
      levels_given = true;
      s = u32(&o->workload.priority_levels);
    } else if (flag == "--sleep-after" || flag == "--wake-after") {
      double* dst =
          flag == "--sleep-after" ? &o->sleep_after_s : &o->wake_after_s;
      s = f64(dst);
      if (s.ok() && !(*dst >= 0 && *dst <= kMaxSleepSeconds)) {
        s = Bad(flag, value);
      }
    } else if (flag == "--metrics-profile") {
      if (value == "vllm" || value == "sglang" || value == "lmdeploy") {
        o->metrics_profile = std::string(value);
      } else {
        s = Bad(flag, value);
      }
    } else if (flag == "--report") {
      o->report_path = std::string(value);
    } else {
      s = Status::Error("unknown flag: " + std::string(flag));
    }
    if (!s.ok()) return s;
  }
  if (o->show_help || o->show_version) return Status::Ok();

  o->model.seed = seed;
  o->workload.seed = seed;
  if (!ModelConfigForSize(model_size, &o->model)) {
    return Status::Error("unknown --model-size '" + model_size + "' (one of " +
                         ModelSizeNames() + ")");
  }
  if (top_k_set && moe_experts == 0) {
    return Status::Error("--moe-top-k needs --moe-experts");
  }
  if (!kv_flag.empty() && !o->disaggregate) {
    return Status::Error(std::string(kv_flag) + " needs --disaggregate");
  }
  if (o->kv_retries > kMaxKvRetries) {
    return Status::Error("--kv-retries must be 0.." +
                         std::to_string(kMaxKvRetries));
  }
  if (o->disaggregate && !o->scope.empty()) {
    return Status::Error(
        "--scope cannot be used with --disaggregate (the prefill and the "
        "decode process keep request-id spaces of their own)");
  }
  if ((o->sleep_after_s >= 0) != (o->wake_after_s >= 0)) {
    return Status::Error(
        "--sleep-after and --wake-after must be given together");
  }
  // --priority alone: vLLM's five buckets, <-1 .. >1, each get requests;
  // --priority=K: K levels; --priority-levels, in either order, wins.
  if (priority_k.value_or(0) > kMaxPriorityLevels) {
    return Status::Error("--priority must be 0.." +
                         std::to_string(kMaxPriorityLevels));
  }
  if (priority_workload && !levels_given) {
    o->workload.priority_levels = priority_k.value_or(kPriorityWorkloadLevels);
  }
  o->scheduler.priority = o->workload.priority_levels > 0;
  if (o->disaggregate) o->trace_context = true;
  o->model.moe_experts = moe_experts;
  o->model.moe_top_k = moe_top_k;
  if (o->model_name.empty()) o->model_name = "tokenmeter-" + model_size;
  o->workload.vocab = o->model.vocab;

  Status s = ValidateWorkload(o->workload);
  if (!s.ok()) return s;
  KvLayout layout{o->kv.num_blocks, o->kv.block_size};
  s = ValidateModel(o->model, layout);
  if (!s.ok()) return s;
  if (o->scheduler.max_batch < 1 || o->scheduler.max_batch > 4096) {
    return Status::Error("--max-batch must be 1..4096");
  }
  if (o->scheduler.max_tokens_per_step < 1 ||
      o->scheduler.max_tokens_per_step > 65536) {
    return Status::Error("--max-tokens-per-step must be 1..65536");
  }
  s = ValidateLora(*o);
  if (!s.ok()) return s;
  const uint64_t longest =
      uint64_t(MaxPromptLen(o->workload)) + MaxOutputLen(o->workload);
  if (longest > o->model.max_context) {
    return Status::Error(
        "a request can reach " + std::to_string(longest) +
        " tokens (1.5 x --prompt-len + 1.5 x --output-len), more than the " +
        o->model.size + " model's context of " +
        std::to_string(o->model.max_context));
  }
  const uint64_t blocks = (longest + o->kv.block_size - 1) / o->kv.block_size;
  if (blocks > o->kv.num_blocks) {
    return Status::Error("a request can need " + std::to_string(blocks) +
                         " KV blocks, more than --kv-blocks " +
                         std::to_string(o->kv.num_blocks));
  }
  return Status::Ok();
}

}  // namespace tokenmeter::engine
