#include "engine/options.h"

#include <gtest/gtest.h>

#include <vector>

namespace tokenmeter::engine {
namespace {

Status Parse(std::vector<const char*> args, EngineOptions* o) {
  args.insert(args.begin(), "tokenmeter-engine");
  return ParseOptions(int(args.size()), args.data(), o);
}

TEST(OptionsTest, DefaultsMatchTheDocumentedOnes) {
  EngineOptions o;
  ASSERT_TRUE(Parse({}, &o).ok());
  EXPECT_EQ(o.workload.requests, 200u);
  EXPECT_EQ(o.workload.rate, 0.0);
  EXPECT_EQ(o.metrics_socket, "/run/tokenmeter/ingest.sock");
  EXPECT_EQ(o.engine_name, "tokenmeter-engine");
  EXPECT_EQ(o.model_name, "tokenmeter-tiny");
  EXPECT_EQ(o.backend, Backend::kAuto);
  EXPECT_TRUE(o.metrics);
  EXPECT_EQ(o.workload.vocab, o.model.vocab);
}

TEST(OptionsTest, ParsesTheFixedFlags) {
  EngineOptions o;
  Status s = Parse({"--requests",
                    "10",
                    "--rate",
                    "2.5",
                    "--prompt-len",
                    "30",
                    "--output-len=12",
                    "--max-batch",
                    "4",
                    "--seed",
                    "9",
                    "--backend",
                    "cpu",
                    "--metrics-socket",
                    "/tmp/x",
                    "--engine-name",
                    "vllm",
                    "--model",
                    "m",
                    "--instance",
                    "dp1",
                    "--report",
                    "/tmp/r.json"},
                   &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.workload.requests, 10u);
  EXPECT_EQ(o.workload.rate, 2.5);
  EXPECT_EQ(o.workload.prompt_len, 30u);
  EXPECT_EQ(o.workload.output_len, 12u);
  EXPECT_EQ(o.scheduler.max_batch, 4u);
  EXPECT_EQ(o.workload.seed, 9u);
  EXPECT_EQ(o.model.seed, 9u);
  EXPECT_EQ(o.backend, Backend::kCpu);
  EXPECT_EQ(o.metrics_socket, "/tmp/x");
  EXPECT_EQ(o.engine_name, "vllm");
  EXPECT_EQ(o.model_name, "m");
  EXPECT_EQ(o.instance, "dp1");
  EXPECT_EQ(o.report_path, "/tmp/r.json");
}

TEST(OptionsTest, ParsesTheEngineFlags) {
  EngineOptions o;
  Status s = Parse(
      {"--model-size", "small", "--kv-blocks", "99", "--block-size", "8",
       "--shared-prefix", "0.25", "--max-tokens-per-step", "100",
       "--temperature", "0", "--no-prefix-cache", "--no-metrics", "--quiet"},
      &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.model.size, "small");
  EXPECT_EQ(o.model_name, "tokenmeter-small");
  EXPECT_EQ(o.kv.num_blocks, 99u);
  EXPECT_EQ(o.kv.block_size, 8u);
  EXPECT_EQ(o.workload.shared_prefix, 0.25);
  EXPECT_EQ(o.scheduler.max_tokens_per_step, 100u);
  EXPECT_EQ(o.temperature, 0.0f);
  EXPECT_FALSE(o.kv.prefix_caching);
  EXPECT_FALSE(o.metrics);
  EXPECT_TRUE(o.quiet);
}

TEST(OptionsTest, RejectsUnknownFlagsAndBadValues) {
  EngineOptions o;
  EXPECT_FALSE(Parse({"--bogus", "1"}, &o).ok());
  EXPECT_FALSE(Parse({"--requests", "x"}, &o).ok());
  EXPECT_FALSE(Parse({"--requests", "0"}, &o).ok());
  EXPECT_FALSE(Parse({"--rate", "-1"}, &o).ok());
  EXPECT_FALSE(Parse({"--backend", "tpu"}, &o).ok());
  EXPECT_FALSE(Parse({"--model-size", "huge"}, &o).ok());
  EXPECT_FALSE(Parse({"--requests"}, &o).ok());
  EXPECT_FALSE(Parse({"--max-batch", "0"}, &o).ok());
}

TEST(OptionsTest, ARequestMustFitTheContextAndTheCache) {
  EngineOptions o;
  Status s = Parse({"--prompt-len", "2000"}, &o);  // tiny: 2048 context
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("context"), std::string::npos);
  o = EngineOptions();
  s = Parse({"--kv-blocks", "8"}, &o);  // 288 tokens need 18 blocks
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--kv-blocks"), std::string::npos);
}

TEST(OptionsTest, HelpAndVersionStopParsing) {
  EngineOptions o;
  ASSERT_TRUE(Parse({"--help"}, &o).ok());
  EXPECT_TRUE(o.show_help);
  EXPECT_NE(UsageText().find("--metrics-socket"), std::string::npos);
}

}  // namespace
}  // namespace tokenmeter::engine
