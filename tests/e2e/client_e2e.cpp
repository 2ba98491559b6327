// Sends a deterministic workload through libtokenmeter (C++ API) from two
// threads with caller-supplied timestamps, closes, and prints on stdout the
// figures the daemon must show, computed from the very timestamps sent:
//   {"requests": N, "ttft_sum_ns": ..., "itl_count": ..., ...}
// Usage: client_e2e SOCKET ENGINE_NAME
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "tokenmeter/client.hpp"

namespace {

struct Totals {
  uint64_t requests = 0, ttft_ns = 0, itl_count = 0, itl_ns = 0, e2e_ns = 0,
           prompt = 0, generation = 0, queue_ns = 0;
};

void Run(tokenmeter::Client& c, uint64_t base, int thread, Totals* t) {
  constexpr uint64_t kMs = 1000000;
  for (int i = 0; i < 100; ++i) {
    const uint64_t rid = uint64_t(thread) * 1000 + uint64_t(i);
    const uint64_t a = base + uint64_t(i) * kMs + uint64_t(thread);
    const uint32_t prompt = 10 + uint32_t(i % 7);
    c.Arrived(rid, prompt, 64, 1, a);
    c.Scheduled(rid, a + 2 * kMs + 17);
    uint64_t last = 0;
    const int steps = 1 + i % 5;
    for (int s = 0; s < steps; ++s) {
      const uint64_t ts = a + 5 * kMs + uint64_t(s) * 3 * kMs + uint64_t(s);
      c.Tokens(rid, 1 + uint32_t(s % 2), ts);
      t->generation += 1 + uint64_t(s % 2);
      if (s == 0) t->ttft_ns += ts - a;
      if (s > 0) {
        ++t->itl_count;
        t->itl_ns += ts - last;
      }
      last = ts;
    }
    c.Finished(rid, tokenmeter::FinishReason::kStop, last + 1000);
    t->e2e_ns += last + 1000 - a;
    t->queue_ns += 2 * kMs + 17;
    t->prompt += prompt;
    ++t->requests;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  tokenmeter::Options o;
  o.socket_path = argv[1];
  o.engine = argv[2];
  o.model = "e2e-model";
  o.instance = "dp0";
  o.labels = {{"host_role", "test"}};
  std::unique_ptr<tokenmeter::Client> c;
  if (tokenmeter::Client::Create(o, &c) != TM_OK) return 1;
  const uint64_t base = tokenmeter::NowNs() - 60ull * 1000000000ull;
  Totals t[2];
  std::thread a([&] { Run(*c, base, 0, &t[0]); });
  std::thread b([&] { Run(*c, base, 1, &t[1]); });
  a.join();
  b.join();
  const tokenmeter::Stats s = c->Close();
  Totals sum;
  for (const Totals& x : t) {
    sum.requests += x.requests;
    sum.ttft_ns += x.ttft_ns;
    sum.itl_count += x.itl_count;
    sum.itl_ns += x.itl_ns;
    sum.e2e_ns += x.e2e_ns;
    sum.prompt += x.prompt;
    sum.generation += x.generation;
    sum.queue_ns += x.queue_ns;
  }
  std::printf("{\"requests\": %" PRIu64 ", \"ttft_sum_ns\": %" PRIu64
              ", \"itl_count\": %" PRIu64 ", \"itl_sum_ns\": %" PRIu64
              ", \"e2e_sum_ns\": %" PRIu64 ", \"queue_sum_ns\": %" PRIu64
              ", \"prompt_tokens\": %" PRIu64
              ", \"generation_tokens\": %" PRIu64 ", \"sent\": %" PRIu64
              ", \"dropped\": %" PRIu64 "}\n",
              sum.requests, sum.ttft_ns, sum.itl_count, sum.itl_ns, sum.e2e_ns,
              sum.queue_ns, sum.prompt, sum.generation, s.events_sent,
              s.events_dropped);
  return 0;
}
