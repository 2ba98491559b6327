// The cost per traced request of daemon/trace: BuildSpans() alone, and
// BuildSpans() plus encoding into an OTLP request (protobuf, JSON), for a
// typical request: ARRIVED, QUEUED, SCHEDULED (with info), 200 TOKENS
// events (kept in the timeline, not turned into spans), FINISHED; two
// engine labels, one request label, no traceparent (a random trace id).
// That gives 4 spans (llm_request, queue, prefill, decode) and 19 root
// attributes. The encoders finish a request every 128 traced requests
// (512 spans), so the envelope is amortized as an exporter's batching
// would. Also: the sampling decision, and the pair of clock reads a
// caller makes once per export for SpanOptions::unix_minus_monotonic_ns
// (its duration bounds that offset's read error).
//
// Prints ns per request (the "Time" column).
#include <benchmark/benchmark.h>
#include <time.h>

#include <string>

#include "daemon/trace/ids.h"
#include "daemon/trace/otlp_trace_encoder.h"
#include "daemon/trace/sampling.h"
#include "daemon/trace/span_builder.h"
#include "daemon/trace/trace_context.h"

namespace {

namespace tr = tokenmeter::daemon::trace;

tr::RequestTimeline TypicalRequest() {
  tr::RequestTimeline t;
  t.request_id = "123456";
  t.engine = "vllm";
  t.profile = "vllm";
  t.engine_labels = {{"model_name", "meta-llama/Llama-3.1-8B-Instruct"},
                     {"engine", "0"}};
  t.request_labels = {{"tenant", "acme"}};
  t.arrived_ns = 1000000000000;
  t.queued_ns = 1000000050000;
  t.scheduled_ns = 1000012000000;
  t.first_token_ns = 1000060000000;
  for (uint32_t i = 0; i < 200; ++i) {
    t.tokens.push_back({t.first_token_ns + i * 20000000ULL, 1});
  }
  t.last_token_ns = t.tokens.back().t_ns;
  t.finished_ns = t.last_token_ns + 100000;
  t.finish_reason = "stop";
  t.prompt_tokens = 812;
  t.generation_tokens = 200;
  t.max_tokens = 256;
  t.n = 1;
  t.has_info = true;
  t.cached_tokens = 256;
  return t;
}

tr::TraceResource Resource() {
  tr::TraceResource r;
  r.attributes = {{"service.name", "tokenmeterd"},
                  {"service.instance.id", "host-1"}};
  r.scope_version = "1.2.0";
  return r;
}

constexpr int kRequestsPerExport = 128;

void BM_BuildSpans(benchmark::State& state) {
  const tr::RequestTimeline t = TypicalRequest();
  tr::RandomIdSource ids(1);
  tr::SpanOptions options;
  options.unix_minus_monotonic_ns = 1767225600000000000LL;
  tr::SpanBatch batch;
  for (auto _ : state) {
    batch.Clear();
    benchmark::DoNotOptimize(tr::BuildSpans(t, options, ids, &batch));
  }
  state.SetItemsProcessed(int64_t(state.iterations()));
  state.counters["spans"] = double(batch.spans.size());
  state.counters["attributes"] = double(batch.attributes.size());
}
BENCHMARK(BM_BuildSpans);

void BuildAndEncode(benchmark::State& state, tr::OtlpEncoding encoding) {
  const tr::RequestTimeline t = TypicalRequest();
  tr::RandomIdSource ids(1);
  tr::SpanOptions options;
  options.unix_minus_monotonic_ns = 1767225600000000000LL;
  tr::SpanBatch batch;
  tr::OtlpTraceEncoder encoder(encoding, Resource());
  std::string body;
  size_t body_bytes = 0;
  int n = 0;
  for (auto _ : state) {
    batch.Clear();
    tr::BuildSpans(t, options, ids, &batch);
    encoder.Add(batch);
    if (++n == kRequestsPerExport) {
      body.clear();
      encoder.Finish(&body);
      body_bytes = body.size();
      n = 0;
    }
  }
  benchmark::DoNotOptimize(body.data());
  state.SetItemsProcessed(int64_t(state.iterations()));
  state.counters["bytes_per_request"] =
      double(body_bytes) / double(kRequestsPerExport);
}

void BM_BuildAndEncodeProtobuf(benchmark::State& state) {
  BuildAndEncode(state, tr::OtlpEncoding::kProtobuf);
}
BENCHMARK(BM_BuildAndEncodeProtobuf);

void BM_BuildAndEncodeJson(benchmark::State& state) {
  BuildAndEncode(state, tr::OtlpEncoding::kJson);
}
BENCHMARK(BM_BuildAndEncodeJson);

// Resolving the trace id and deciding (ratio 0.01, a slow threshold):
// what every retired request pays when tracing is on.
void BM_DecideTrace(benchmark::State& state) {
  const tr::RequestTimeline t = TypicalRequest();
  tr::RandomIdSource ids(1);
  tr::SamplingOptions options;
  options.ratio = 0.01;
  options.slower_than_ns = 10000000000;
  int64_t kept = 0;
  for (auto _ : state) {
    const tr::TraceContext ctx = tr::ResolveTraceContext(t, ids);
    kept += tr::KeepTrace(t, options, tr::TraceRandomness(ctx.trace_id));
  }
  benchmark::DoNotOptimize(kept);
  state.SetItemsProcessed(int64_t(state.iterations()));
  state.counters["kept_ratio"] = double(kept) / double(state.iterations());
}
BENCHMARK(BM_DecideTrace);

// CLOCK_REALTIME then CLOCK_MONOTONIC, back to back: the offset's read.
void BM_UnixMinusMonotonicRead(benchmark::State& state) {
  int64_t sink = 0;
  for (auto _ : state) {
    timespec real{};
    timespec mono{};
    clock_gettime(CLOCK_REALTIME, &real);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    sink += tr::UnixMinusMonotonicNs(
        uint64_t(real.tv_sec) * 1000000000ULL + uint64_t(real.tv_nsec),
        uint64_t(mono.tv_sec) * 1000000000ULL + uint64_t(mono.tv_nsec));
  }
  benchmark::DoNotOptimize(sink);
}
BENCHMARK(BM_UnixMinusMonotonicRead);

}  // namespace

BENCHMARK_MAIN();
