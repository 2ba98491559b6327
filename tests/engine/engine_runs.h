// The whole-loop tests' common run: a small CPU workload without a daemon
// (engine_test.cpp, engine_modes_test.cpp).
#ifndef TOKENMETER_TESTS_ENGINE_ENGINE_RUNS_H_
#define TOKENMETER_TESTS_ENGINE_ENGINE_RUNS_H_

#include <gtest/gtest.h>

#include <memory>

#include "engine/engine.h"

namespace tokenmeter::engine {

// 24 requests of about 40 + 24 tokens, all at once, batches of 8, 64
// tokens a step, 256 blocks of 8, seed 5, the CPU backend, no metrics.
inline EngineOptions SmallRun() {
  EngineOptions o;
  o.workload.requests = 24;
  o.workload.prompt_len = 40;
  o.workload.output_len = 24;
  o.workload.seed = 5;
  o.model.seed = 5;
  o.scheduler.max_batch = 8;
  o.scheduler.max_tokens_per_step = 64;
  o.kv.num_blocks = 256;
  o.kv.block_size = 8;
  o.backend = Backend::kCpu;
  o.metrics = false;
  return o;
}

// Creates and runs an engine; a failure fails the test (and the engine is
// returned as it is, for the rest of the test to find wanting).
inline std::unique_ptr<Engine> RunEngine(const EngineOptions& o) {
  std::unique_ptr<Engine> e;
  Status s = Engine::Create(o, &e);
  EXPECT_TRUE(s.ok()) << s.message();
  s = e->Run();
  EXPECT_TRUE(s.ok()) << s.message();
  return e;
}

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_TESTS_ENGINE_ENGINE_RUNS_H_
