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
  EXPECT_TRUE(o.metrics_ack);  // the library's default: acked delivery
  EXPECT_EQ(o.workload.vocab, o.model.vocab);
  EXPECT_EQ(o.workload.lora_adapters, 0u);
  EXPECT_EQ(o.max_lora, 4u);
  EXPECT_EQ(o.scheduler.max_lora, 0u);  // no adapters: no slots
  EXPECT_EQ(o.lora_rank, 8u);
  EXPECT_EQ(o.workload.tenants, 3u);
  EXPECT_EQ(o.metrics_profile, "");
  EXPECT_EQ(o.model.moe_experts, 0u);  // dense
  EXPECT_EQ(o.model.moe_top_k, 2u);
  EXPECT_EQ(o.expert_load_every, 16u);
}

TEST(OptionsTest, ParsesTheMoeFlags) {
  EngineOptions o;
  ASSERT_TRUE(Parse({"--moe-experts", "16", "--moe-top-k", "2",
                     "--expert-load-every", "4"},
                    &o)
                  .ok());
  EXPECT_EQ(o.model.moe_experts, 16u);
  EXPECT_EQ(o.model.moe_top_k, 2u);
  EXPECT_EQ(o.expert_load_every, 4u);
  o = EngineOptions();
  ASSERT_TRUE(Parse({"--moe-experts=1024", "--moe-top-k=16",
                     "--expert-load-every=0", "--model-size", "small"},
                    &o)
                  .ok());
  EXPECT_EQ(o.model.moe_experts, 1024u);
  EXPECT_EQ(o.model.moe_top_k, 16u);
  EXPECT_EQ(o.expert_load_every, 0u);
  EXPECT_EQ(o.model.d_model, 256u);  // the size applies with the experts
  o = EngineOptions();
  ASSERT_TRUE(Parse({"--moe-experts", "1", "--moe-top-k", "1"}, &o).ok());
}

TEST(OptionsTest, RejectsBadMoeValuesNamingTheFlag) {
  struct Case {
    std::vector<const char*> args;
    const char* names;
  };
  const Case cases[] = {
      {{"--moe-experts", "1025"}, "--moe-experts"},
      {{"--moe-experts", "-1"}, "--moe-experts"},
      {{"--moe-experts", "x"}, "--moe-experts"},
      {{"--moe-experts", "4", "--moe-top-k", "5"}, "--moe-top-k"},
      {{"--moe-experts", "64", "--moe-top-k", "17"}, "--moe-top-k"},
      {{"--moe-experts", "64", "--moe-top-k", "0"}, "--moe-top-k"},
      {{"--moe-top-k", "2"}, "--moe-experts"},
      {{"--expert-load-every", "-3"}, "--expert-load-every"},
      {{"--moe-experts", "1024", "--model-size", "large", "--prompt-len", "64",
        "--output-len", "64"},
       "--moe-experts"},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    const Status s = Parse(c.args, &o);
    ASSERT_FALSE(s.ok()) << c.args[0] << " " << c.args[1];
    EXPECT_NE(s.message().find(c.names), std::string::npos) << s.message();
  }
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
  Status s = Parse({"--model-size", "small", "--kv-blocks", "99",
                    "--block-size", "8", "--shared-prefix", "0.25",
                    "--max-tokens-per-step", "100", "--temperature", "0",
                    "--no-prefix-cache", "--no-metrics", "--no-ack", "--quiet"},
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
  EXPECT_FALSE(o.metrics_ack);
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

TEST(OptionsTest, ParsesTheLoraAndTenantFlags) {
  EngineOptions o;
  Status s = Parse({"--lora-adapters", "10", "--max-lora=3", "--lora-rank",
                    "16", "--tenants", "0", "--metrics-profile", "sglang"},
                   &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.workload.lora_adapters, 10u);
  EXPECT_EQ(o.max_lora, 3u);
  EXPECT_EQ(o.scheduler.max_lora, 3u);
  EXPECT_EQ(o.lora_rank, 16u);
  EXPECT_EQ(o.workload.tenants, 0u);
  EXPECT_EQ(o.metrics_profile, "sglang");
  for (const char* p : {"vllm", "lmdeploy"}) {
    o = EngineOptions();
    ASSERT_TRUE(Parse({"--metrics-profile", p}, &o).ok()) << p;
    EXPECT_EQ(o.metrics_profile, p);
  }
  // More slots than adapters is allowed (they stay empty).
  o = EngineOptions();
  EXPECT_TRUE(Parse({"--lora-adapters", "2", "--max-lora", "8"}, &o).ok());
}

// Each bad value fails with a line that names its flag.
TEST(OptionsTest, RejectsBadLoraValuesNamingTheFlag) {
  struct Case {
    std::vector<const char*> args;
    const char* names;
  };
  const Case cases[] = {
      {{"--lora-adapters", "4", "--max-lora", "0"}, "--max-lora"},
      {{"--max-lora", "257"}, "--max-lora"},
      {{"--lora-adapters", "1025"}, "--lora-adapters"},
      {{"--lora-adapters", "-1"}, "--lora-adapters"},
      {{"--lora-rank", "0"}, "--lora-rank"},
      {{"--lora-rank", "65", "--model-size", "small"}, "--lora-rank"},
      {{"--lora-rank", "x"}, "--lora-rank"},
      {{"--tenants", "1025"}, "--tenants"},
      {{"--metrics-profile", "tgi"}, "--metrics-profile"},
      {{"--metrics-profile", ""}, "--metrics-profile"},
      // 1024 large adapters of rank 64 (16 MiB each) exceed the 4 GiB cap.
      {{"--lora-adapters", "1024", "--lora-rank", "64", "--model-size", "large",
        "--prompt-len", "64", "--output-len", "64"},
       "--lora-rank"},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    const Status s = Parse(c.args, &o);
    ASSERT_FALSE(s.ok()) << c.args[0] << " " << c.args[1];
    EXPECT_NE(s.message().find(c.names), std::string::npos) << s.message();
  }
  // The rank is at most d_model: the tiny model's is 64, so 64 is fine.
  EngineOptions o;
  EXPECT_TRUE(Parse({"--lora-adapters", "2", "--lora-rank", "64"}, &o).ok());
}

TEST(OptionsTest, ProtocolTwelveModesAreOffByDefault) {
  EngineOptions o;
  ASSERT_TRUE(Parse({}, &o).ok());
  EXPECT_FALSE(o.disaggregate);
  EXPECT_EQ(o.kv_fail_every, 0u);
  EXPECT_EQ(o.kv_retries, 1u);
  EXPECT_EQ(o.max_queued, 0u);
  EXPECT_EQ(o.workload.priority_levels, 0u);
  EXPECT_FALSE(o.scheduler.priority);
  EXPECT_LT(o.sleep_after_s, 0);
  EXPECT_LT(o.wake_after_s, 0);
  EXPECT_FALSE(o.trace_context);
}

TEST(OptionsTest, ParsesTheProtocolTwelveFlags) {
  EngineOptions o;
  ASSERT_TRUE(Parse({"--disaggregate", "--kv-fail-every", "3", "--kv-retries=2",
                     "--max-queued", "10", "--priority-levels", "5",
                     "--sleep-after", "0.5", "--wake-after=1.25"},
                    &o)
                  .ok());
  EXPECT_TRUE(o.disaggregate);
  EXPECT_EQ(o.kv_fail_every, 3u);
  EXPECT_EQ(o.kv_retries, 2u);
  EXPECT_EQ(o.max_queued, 10u);
  EXPECT_EQ(o.workload.priority_levels, 5u);
  EXPECT_TRUE(o.scheduler.priority);  // priorities turn on the policy
  EXPECT_EQ(o.sleep_after_s, 0.5);
  EXPECT_EQ(o.wake_after_s, 1.25);
  EXPECT_TRUE(o.trace_context);  // always with --disaggregate
  o = EngineOptions();
  ASSERT_TRUE(Parse({"--trace-context", "--sleep-after", "0", "--wake-after",
                     "0", "--kv-retries", "0", "--disaggregate"},
                    &o)
                  .ok());
  EXPECT_TRUE(o.trace_context);
  EXPECT_EQ(o.sleep_after_s, 0.0);
  EXPECT_EQ(o.kv_retries, 0u);
}

// --priority: a priority workload of vLLM's five buckets, or --priority=K
// (--priority K) levels; a --priority-levels given too wins, in either
// order.
TEST(OptionsTest, PriorityIsAPriorityWorkload) {
  // The levels each order of the flags gives; the policy on with any.
  const struct {
    std::vector<const char*> args;
    uint32_t levels;
  } cases[] = {
      {{"--priority"}, 5},
      {{"--priority=3"}, 3},
      {{"--priority-levels", "7", "--priority"}, 7},
      {{"--priority", "--priority-levels", "2"}, 2},
      {{"--priority-levels", "5", "--priority=3"}, 5},
      {{"--priority=3", "--priority-levels", "5"}, 5},
      {{"--priority", "--priority-levels", "0"}, 0},
      // The K as the next argument (a number), as every other flag's value.
      {{"--priority", "3"}, 3},
      {{"--priority", "3", "--requests", "9"}, 3},
      {{"--priority", "--requests", "9"}, 5},
      {{"--priority-levels", "5", "--priority", "3"}, 5},
  };
  for (const auto& c : cases) {
    EngineOptions o;
    ASSERT_TRUE(Parse(c.args, &o).ok()) << c.args.back();
    EXPECT_EQ(o.workload.priority_levels, c.levels) << c.args.back();
    EXPECT_EQ(o.scheduler.priority, c.levels > 0) << c.args.back();
  }
  for (const std::vector<const char*>& args :
       {std::vector<const char*>{"--priority-levels", "5", "--priority=1025"},
        std::vector<const char*>{"--priority=1025"},
        std::vector<const char*>{"--priority", "1025"},
        std::vector<const char*>{"--priority", "x"},
        std::vector<const char*>{"--priority", "-1"},
        std::vector<const char*>{"--priority", "99999999999"},
        std::vector<const char*>{"--priority=x"}}) {
    EngineOptions o;
    EXPECT_FALSE(Parse(args, &o).ok()) << args.back();
  }
  // A K out of range after a space is --priority's error, not an unknown
  // flag's.
  for (const char* k : {"-1", "99999999999", "1025"}) {
    EngineOptions o;
    const Status s = Parse({"--priority", k}, &o);
    ASSERT_FALSE(s.ok()) << k;
    EXPECT_NE(s.message().find("--priority"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find("unknown flag"), std::string::npos)
        << s.message();
  }
}

TEST(OptionsTest, RejectsBadProtocolTwelveValuesNamingTheFlag) {
  struct Case {
    std::vector<const char*> args;
    const char* names;
  };
  const Case cases[] = {
      {{"--kv-fail-every", "2"}, "--kv-fail-every needs --disaggregate"},
      {{"--kv-retries", "1"}, "--kv-retries needs --disaggregate"},
      {{"--disaggregate", "--kv-fail-every", "-1"}, "--kv-fail-every"},
      {{"--disaggregate", "--kv-fail-every", "x"}, "--kv-fail-every"},
      {{"--disaggregate", "--kv-retries", "17"}, "--kv-retries"},
      {{"--disaggregate", "--scope", "s"}, "--scope"},
      {{"--max-queued", "-5"}, "--max-queued"},
      {{"--max-queued", "1.5"}, "--max-queued"},
      {{"--priority-levels", "1025"}, "--priority-levels"},
      {{"--priority-levels", "many"}, "--priority-levels"},
      {{"--sleep-after", "1"}, "--sleep-after and --wake-after"},
      {{"--wake-after", "1"}, "--sleep-after and --wake-after"},
      {{"--sleep-after", "-1", "--wake-after", "1"}, "--sleep-after"},
      {{"--sleep-after", "nan", "--wake-after", "1"}, "--sleep-after"},
      {{"--sleep-after", "1", "--wake-after", "inf"}, "--wake-after"},
      {{"--sleep-after", "1", "--wake-after", "86401"}, "--wake-after"},
      {{"--sleep-after", "", "--wake-after", "1"}, "--sleep-after"},
  };
  for (const Case& c : cases) {
    EngineOptions o;
    const Status s = Parse(c.args, &o);
    ASSERT_FALSE(s.ok()) << c.args[0] << " " << c.args[1];
    EXPECT_NE(s.message().find(c.names), std::string::npos)
        << s.message() << " should name " << c.names;
  }
}

}  // namespace
}  // namespace tokenmeter::engine
