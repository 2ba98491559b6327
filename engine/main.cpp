// tokenmeter-engine: runs a synthetic workload through the reference engine
// and prints one summary line; --report writes the figures as JSON.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/kv_channel.h"
#include "engine/options.h"
#include "engine/report.h"

namespace {

using tokenmeter::engine::Engine;
using tokenmeter::engine::EngineOptions;
using tokenmeter::engine::EngineRole;
using tokenmeter::engine::KvChannel;
using tokenmeter::engine::Report;
using tokenmeter::engine::Status;

Status WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status::Error("cannot write --report " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return Status::Error("cannot write --report " + path);
  }
  return Status::Ok();
}

void PrintSummary(const Report& r, const char* role) {
  const double hit =
      r.prefix_cache_queries > 0
          ? 100.0 * double(r.prefix_cache_hits) / double(r.prefix_cache_queries)
          : 0.0;
  std::printf(
      "tokenmeter-engine%s: %llu requests (%llu stop, %llu length) in %.3f s "
      "on %s: %llu prompt + %llu generation tokens, %.1f output tokens/s, "
      "TTFT p50 %.4f s p99 %.4f s, ITL p50 %.4f s p99 %.4f s, %llu steps, "
      "%llu preemptions, prefix cache hit rate %.1f%%, metrics %s "
      "(%llu events dropped)",
      role, (unsigned long long)r.requests, (unsigned long long)r.finished_stop,
      (unsigned long long)r.finished_length, r.duration_s, r.backend.c_str(),
      (unsigned long long)r.prompt_tokens,
      (unsigned long long)r.generation_tokens, r.output_tokens_per_s,
      r.ttft.p50, r.ttft.p99, r.itl.p50, r.itl.p99, (unsigned long long)r.steps,
      (unsigned long long)r.preemptions, hit, r.metrics ? "on" : "off",
      (unsigned long long)r.client_dropped_events);
  if (r.finished_error > 0) {
    std::printf(", %llu errors", (unsigned long long)r.finished_error);
  }
  uint64_t rejected = 0;
  for (const auto& [reason, n] : r.admission_rejections) rejected += n;
  if (rejected > 0) {
    std::printf(", %llu rejected at admission", (unsigned long long)rejected);
  }
  const tokenmeter::engine::KvTransferFigures& kv =
      r.role == "prefill" ? r.kv_send : r.kv_recv;
  if (kv.count > 0) {
    uint64_t failed = 0;
    for (const auto& [reason, n] : kv.failures) failed += n;
    std::printf(", %llu KV transfers (%llu failed, %.1f MiB)",
                (unsigned long long)kv.count, (unsigned long long)failed,
                double(kv.bytes) / double(1 << 20));
  }
  if (r.sleep.transitions > 0) {
    std::printf(", asleep %.3f s", r.sleep.asleep_s);
  }
  if (!r.lora_adapters.empty()) {
    std::printf(", %zu LoRA adapters: %llu loads, %llu evictions",
                r.lora_adapters.size(), (unsigned long long)r.lora_loads,
                (unsigned long long)r.lora_evictions);
  }
  if (r.moe_experts > 0) {
    // The worst layer over the whole run: max / mean tokens per expert.
    double worst = 0;
    size_t worst_layer = 0;
    for (size_t l = 0; l < r.moe_expert_tokens.size(); ++l) {
      const std::vector<uint64_t>& e = r.moe_expert_tokens[l];
      uint64_t mx = 0;
      for (uint64_t v : e) mx = v > mx ? v : mx;
      const double mean = double(r.moe_routed_tokens[l]) / double(e.size());
      if (mean > 0 && double(mx) / mean > worst) {
        worst = double(mx) / mean;
        worst_layer = l;
      }
    }
    std::printf(
        ", MoE %u experts top-%u: worst layer imbalance %.2f (layer "
        "%zu)",
        r.moe_experts, r.moe_top_k, worst, worst_layer);
  }
  std::printf("\n");
}

// The decode process of --disaggregate (the child): runs, prints its
// summary line, and sends its report to the prefill process.
int RunDecode(const EngineOptions& options, int fd) {
  KvChannel channel(fd);
  std::unique_ptr<Engine> engine;
  Status s = Engine::Create(options, EngineRole::kDecode, &channel, &engine);
  if (s.ok()) s = engine->Run();
  if (s.ok()) {
    const Report report = engine->BuildReport();
    if (!options.quiet) PrintSummary(report, "[decode]");
    channel.SendReport(tokenmeter::engine::ReportJson(report));
    s = channel.Flush();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeter-engine[decode]: %s\n",
                 s.message().c_str());
    return 1;
  }
  return 0;
}

// --disaggregate: this process becomes the prefill process and forks the
// decode process; a socket pair is their KV channel. The merged report
// holds both processes' reports.
int RunDisaggregated(const EngineOptions& options) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    std::fprintf(stderr, "tokenmeter-engine: socketpair: %s\n",
                 std::strerror(errno));
    return 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "tokenmeter-engine: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    close(fds[0]);
    // Never outlive the prefill process.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int rc = RunDecode(options, fds[1]);
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  close(fds[1]);
  Status s = Status::Ok();
  std::string decode_json;
  Report report;
  {
    KvChannel channel(fds[0]);
    std::unique_ptr<Engine> engine;
    s = Engine::Create(options, EngineRole::kPrefill, &channel, &engine);
    if (s.ok()) s = engine->Run();
    if (s.ok()) {
      report = engine->BuildReport();
      s = engine->ReceivePeerReport(&decode_json);
    }
  }  // closes the channel: a decode process still running sees it go
  int wstatus = 0;
  while (waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeter-engine[prefill]: %s\n",
                 s.message().c_str());
    return 1;
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    std::fprintf(stderr, "tokenmeter-engine: the decode process failed\n");
    return 1;
  }
  if (!options.quiet) PrintSummary(report, "[prefill]");
  if (!options.report_path.empty()) {
    const std::string merged = "{\"disaggregated\": true,\n\"prefill\": " +
                               tokenmeter::engine::ReportJson(report) +
                               ",\n\"decode\": " + decode_json + "}\n";
    s = WriteFile(options.report_path, merged);
    if (!s.ok()) {
      std::fprintf(stderr, "tokenmeter-engine: %s\n", s.message().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  EngineOptions options;
  Status s = tokenmeter::engine::ParseOptions(argc, argv, &options);
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeter-engine: %s (see --help)\n",
                 s.message().c_str());
    return 2;
  }
  if (options.show_help) {
    const auto usage = tokenmeter::engine::UsageText();
    std::fwrite(usage.data(), 1, usage.size(), stdout);
    return 0;
  }
  if (options.show_version) {
    std::printf("tokenmeter-engine %s (libtokenmeter %s)\n", TOKENMETER_VERSION,
                tm_version());
    return 0;
  }
  if (options.disaggregate) return RunDisaggregated(options);
  std::unique_ptr<Engine> engine;
  s = Engine::Create(options, &engine);
  if (s.ok()) s = engine->Run();
  if (!s.ok()) {
    std::fprintf(stderr, "tokenmeter-engine: %s\n", s.message().c_str());
    return 1;
  }
  const Report report = engine->BuildReport();
  if (!options.quiet) PrintSummary(report, "");
  if (!options.report_path.empty()) {
    s = WriteFile(options.report_path, tokenmeter::engine::ReportJson(report));
    if (!s.ok()) {
      std::fprintf(stderr, "tokenmeter-engine: %s\n", s.message().c_str());
      return 1;
    }
  }
  return 0;
}
