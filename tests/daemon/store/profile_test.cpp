// The naming profiles (profile.h: vLLM, SGLang, LMDeploy), their router
// series and the per-request labels, seen through the rendered exposition:
// a golden file of the families the profiles change
// (TOKENMETER_UPDATE_GOLDEN=1 rewrites it), each profile's families against
// its table in docs/metrics.md, the families of one part or one profile
// sample by sample, and promtool's findings per profile.
#include "daemon/store/profile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/exposition/text_writer.h"
#include "daemon/store/catalog.h"
#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/kv_transfer.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/parts/sleep.h"
#include "daemon/store/parts/waiting_reason.h"
#include "daemon/store/registry.h"
#include "daemon/store/request_labels.h"
#include "tests/daemon/exposition/exposition_fixture.h"
#include "tokenmeter/protocol.h"

#ifndef TOKENMETER_TEST_DATA_DIR
#error "TOKENMETER_TEST_DATA_DIR must name tests/data"
#endif

namespace tokenmeter::daemon::exposition_test {
namespace {

constexpr char kProfilesGoldenPath[] =
    TOKENMETER_TEST_DATA_DIR "/exposition_profiles_golden.txt";
constexpr char kMetricsDocPath[] =
    TOKENMETER_TEST_DATA_DIR "/../../docs/metrics.md";

// The lines of engine families and of tokenmeter_request_label_overflow:
// what the profiles change (the rest is the first golden file's).
std::string ProfileLines(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string_view name = line;
    if (name.starts_with("# HELP ") || name.starts_with("# TYPE ")) {
      name.remove_prefix(7);
    }
    name = name.substr(0, name.find_first_of("{ "));
    if (name.find(':') != std::string_view::npos ||
        name.starts_with("tokenmeter_request_label_overflow")) {
      out += line;
      out += '\n';
    }
  }
  return out;
}

TEST(ProfileTest, ProfilesMatchTheirGoldenFile) {
  const auto reg = ProfilesRegistry();
  ExpectGolden(kProfilesGoldenPath,
               ProfileLines(Render(*reg, ExpositionFormat::kText004)));
}

TEST(ProfileTest, ProfilesStructure) {
  const auto reg = ProfilesRegistry();
  CheckStructure(Render(*reg, ExpositionFormat::kText004),
                 ExpositionFormat::kText004);
  CheckStructure(Render(*reg, ExpositionFormat::kOpenMetrics100),
                 ExpositionFormat::kOpenMetrics100);
}

// The (name, type) rows of docs/metrics.md's generated table of `profile`,
// `<ns>` replaced by `ns`; legacy rows only with `legacy`.
std::set<std::pair<std::string, std::string>> DocRows(
    const std::string& profile, const std::string& ns, bool legacy) {
  std::ifstream in(kMetricsDocPath);
  EXPECT_TRUE(in) << kMetricsDocPath;
  const std::string begin = "<!-- BEGIN GENERATED: profile " + profile + " -->";
  std::set<std::pair<std::string, std::string>> rows;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == begin) inside = true;
    if (!inside) continue;
    if (line.starts_with("<!-- END GENERATED")) break;
    if (!line.starts_with("| `")) continue;
    const size_t close = line.find('`', 3);
    std::string name = line.substr(3, close - 3);
    if (name.starts_with("<ns>:")) name = ns + name.substr(4);
    const size_t type_start = line.find("| ", close) + 2;
    const std::string type =
        line.substr(type_start, line.find(' ', type_start) - type_start);
    const bool is_legacy =
        line.substr(close, line.find('|', close) - close).find("legacy") !=
        std::string::npos;
    if (is_legacy && !legacy) continue;
    rows.emplace(name, type);
  }
  EXPECT_FALSE(rows.empty()) << profile;
  return rows;
}

// The (name, type) of every engine family rendered.
std::set<std::pair<std::string, std::string>> EngineFamilies(
    const std::string& text) {
  std::set<std::pair<std::string, std::string>> out;
  for (const Family& f : Parse(text, ExpositionFormat::kText004)) {
    if (f.name.find(':') != std::string::npos) out.emplace(f.name, f.type);
  }
  return out;
}

// One series of `p` with data in every family its table has.
std::string RenderOneSeries(Profile p, bool legacy_names) {
  RegistryOptions options;
  options.legacy_names = legacy_names;
  options.moe_expert_series = true;
  std::unique_ptr<Registry> reg;
  EXPECT_TRUE(Registry::Create(options, &reg).ok());
  const std::string ns = ProfileNamespace(p, "vllm", "");
  EngineSeries* s = reg->GetOrCreate({ns, "m", "0", {}, p});
  Fill(*s, 1, true, true);
  s->part<CacheConfigPart>().Set(
      {{"page_size", "16", 16}, {"num_pages", "4", 4}});
  const uint64_t counts[] = {3, 1};
  EXPECT_TRUE(
      s->part<MoePart>().Add(0, std::span<const uint64_t>(counts, 2), true));
  // Protocol 1.2 parts.
  s->part<AdmissionPart>().Reject("queue_full");
  s->part<WaitingReasonPart>().Set(5, 2);
  s->part<KvTransferPart>().Add(0, 2'000'000, true, 4096, false, "timeout");
  s->part<KvTransferPart>().Add(1, 3'000'000, true, 4096, true, {});
  s->part<SleepPart>().Apply(1, 1, 1);
  return Render(*reg, ExpositionFormat::kText004);
}

TEST(ProfileTest, EachProfileShowsTheFamiliesOfItsDocsTable) {
  struct Case {
    Profile profile;
    bool legacy;
  };
  for (const Case c :
       {Case{Profile::kVllm, false}, Case{Profile::kVllm, true},
        Case{Profile::kSglang, false}, Case{Profile::kSglang, true},
        Case{Profile::kLmdeploy, false}, Case{Profile::kLmdeploy, true}}) {
    const std::string name(ProfileName(c.profile));
    SCOPED_TRACE(name + (c.legacy ? " --legacy-names" : ""));
    // --legacy-names adds vLLM's aliases only.
    const bool legacy = c.legacy && c.profile == Profile::kVllm;
    EXPECT_EQ(EngineFamilies(RenderOneSeries(c.profile, c.legacy)),
              DocRows(name, "vllm", legacy));
  }
}

// Every label the daemon sets on an engine series, in every profile, is
// one a HELLO may not use (protocol-v1.md: HELLO labels "must not ...
// repeat a label the daemon sets"): else a HELLO label of that name would
// give a sample the label twice, which no scraper parses. The series here
// has no HELLO or request labels, so each label is the daemon's, but for
// cache_config_info's, which are the HELLO's own cache_config keys (a HELLO
// label named like one of them is refused: IngestServer::LabelClash()).
TEST(ProfileTest, EveryLabelTheDaemonSetsIsReserved) {
  for (const Profile p :
       {Profile::kVllm, Profile::kSglang, Profile::kLmdeploy}) {
    for (const bool legacy : {false, true}) {
      SCOPED_TRACE(std::string(ProfileName(p)) + (legacy ? " legacy" : ""));
      std::set<std::string> names;
      for (const Family& f :
           Parse(RenderOneSeries(p, legacy), ExpositionFormat::kText004)) {
        if (f.name.find(':') == std::string::npos ||
            f.name.ends_with("cache_config_info")) {
          continue;
        }
        for (const Sample& smp : f.samples) {
          for (const auto& [n, v] : smp.labels) names.insert(n);
        }
      }
      EXPECT_GT(names.size(), 5u);
      for (const std::string& n : names) {
        EXPECT_EQ(tm_proto_reserved_label(n.data(), n.size()), 1) << n;
      }
    }
  }
}

bool HasLine(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(ProfileTest, MoeSeriesPerLayerAndExpert) {
  for (const bool expert_series : {false, true}) {
    SCOPED_TRACE(expert_series);
    RegistryOptions options;
    options.moe_expert_series = expert_series;
    std::unique_ptr<Registry> reg;
    ASSERT_TRUE(Registry::Create(options, &reg).ok());
    EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
    EngineSeries* dense = reg->GetOrCreate({"vllm", "m", "1", {}});
    ASSERT_NE(dense, nullptr);
    const uint64_t a[] = {6, 2, 0, 0};  // max 6, mean 2: imbalance 3
    const uint64_t b[] = {1, 1, 1, 1};  // balanced
    const uint64_t zero[] = {0, 0, 0, 0};
    const uint64_t wrong[] = {1, 2};
    ASSERT_TRUE(s->part<MoePart>().Add(3, std::span<const uint64_t>(a, 4),
                                       expert_series));
    ASSERT_TRUE(s->part<MoePart>().Add(3, std::span<const uint64_t>(b, 4),
                                       expert_series));
    ASSERT_TRUE(
        s->part<MoePart>().Add(7, std::span<const uint64_t>(zero, 4),
                               expert_series));  // fixes 4 experts, no ratio
    EXPECT_FALSE(s->part<MoePart>().Add(3, std::span<const uint64_t>(wrong, 2),
                                        expert_series));  // the count is fixed
    const std::string text = Render(*reg, ExpositionFormat::kText004);
    const std::string l = "model_name=\"m\",engine=\"0\"";
    EXPECT_TRUE(HasLine(
        text, "vllm:moe_routed_tokens_total{" + l + ",layer=\"3\"} 12"));
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_routed_tokens_total{" + l + ",layer=\"7\"} 0"));
    // The latest load with a non-zero sum: the balanced one.
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_layer_imbalance{" + l + ",layer=\"3\"} 1"));
    EXPECT_EQ(text.find("vllm:moe_layer_imbalance{" + l + ",layer=\"7\"}"),
              std::string::npos);
    EXPECT_TRUE(HasLine(text, "vllm:moe_imbalance_count{" + l + "} 2"));
    EXPECT_TRUE(HasLine(text, "vllm:moe_imbalance_sum{" + l + "} 4"));
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_imbalance_bucket{" + l + ",le=\"1\"} 1"));
    EXPECT_TRUE(
        HasLine(text, "vllm:moe_imbalance_bucket{" + l + ",le=\"3\"} 2"));
    // Every expert of a known layer, 0 until it gets tokens; only with
    // --moe-expert-series.
    EXPECT_EQ(HasLine(text, "vllm:moe_expert_tokens_total{" + l +
                                ",layer=\"3\",expert=\"0\"} 7"),
              expert_series);
    EXPECT_EQ(HasLine(text, "vllm:moe_expert_tokens_total{" + l +
                                ",layer=\"7\",expert=\"3\"} 0"),
              expert_series);
    // A series without EXPERT_LOAD has no MoE samples.
    EXPECT_EQ(text.find("moe_routed_tokens_total{model_name=\"m\",engine="
                        "\"1\""),
              std::string::npos);
  }
}

TEST(ProfileTest, VllmLegacyNamesReadTheSameValues) {
  const std::string text = RenderOneSeries(Profile::kVllm, true);
  const std::string l = "{model_name=\"m\",engine=\"0\"}";
  EXPECT_TRUE(HasLine(text, "vllm:kv_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(HasLine(text, "vllm:gpu_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(
      HasLine(text, "vllm:gpu_prefix_cache_queries_total" + l + " 1000"));
  EXPECT_TRUE(HasLine(text, "vllm:gpu_prefix_cache_hits_total" + l + " 250"));
  EXPECT_TRUE(HasLine(text, "vllm:gpu_prefix_cache_hit_rate" + l + " 0.25"));
  // The ITL histogram under its pre-0.11 name: the same samples.
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> itl, tpot;
  while (std::getline(in, line)) {
    if (line.starts_with("vllm:inter_token_latency_seconds_")) {
      itl.push_back(line.substr(line.find('_', 5)));
    }
    if (line.starts_with("vllm:time_per_output_token_seconds_")) {
      tpot.push_back(line.substr(line.find('_', 5)));
    }
  }
  ASSERT_FALSE(itl.empty());
  ASSERT_EQ(itl.size(), tpot.size());
  for (size_t i = 0; i < itl.size(); ++i) {
    EXPECT_EQ(itl[i].substr(itl[i].find('{')),
              tpot[i].substr(tpot[i].find('{')));
  }
  // Without the option: none of them.
  const std::string plain = RenderOneSeries(Profile::kVllm, false);
  for (const char* alias :
       {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_hit_rate",
        "vllm:time_per_output_token_seconds"}) {
    EXPECT_EQ(plain.find(std::string("\n") + alias), std::string::npos)
        << alias;
  }
}

TEST(ProfileTest, CacheConfigInfoCarriesEveryEntry) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* a = reg->GetOrCreate({"vllm", "m", "0", {{"tier", "x"}}});
  EngineSeries* b = reg->GetOrCreate({"vllm", "m", "1", {}});
  std::string text = Render(*reg, ExpositionFormat::kText004);
  // Absent while no HELLO sent one.
  EXPECT_EQ(text.find("cache_config_info"), std::string::npos);
  a->part<CacheConfigPart>().Set(
      {{"block_size", "16", 16},
       {"num_gpu_blocks", "8192", 8192},
       {"gpu_memory_utilization", "0.9", 0.9},
       {"enable_prefix_caching", "True", std::nan("")},
       {"cache_dtype", "a \"b\"", std::nan("")}});
  text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_TRUE(HasLine(
      text,
      "vllm:cache_config_info{model_name=\"m\",engine=\"0\",tier=\"x\","
      "block_size=\"16\",num_gpu_blocks=\"8192\",gpu_memory_utilization="
      "\"0.9\",enable_prefix_caching=\"True\",cache_dtype=\"a \\\"b\\\"\"} 1"))
      << text;
  EXPECT_EQ(text.find("vllm:cache_config_info{model_name=\"m\",engine=\"1\""),
            std::string::npos);
  // The latest HELLO's replaces it; an empty one keeps the family.
  a->part<CacheConfigPart>().Set({{"block_size", "32", 32}});
  b->part<CacheConfigPart>().Set({});
  text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_TRUE(HasLine(text,
                      "vllm:cache_config_info{model_name=\"m\",engine=\"0\","
                      "tier=\"x\",block_size=\"32\"} 1"));
  EXPECT_TRUE(
      HasLine(text, "vllm:cache_config_info{model_name=\"m\",engine=\"1\"} 1"));
  EXPECT_EQ(text.find("num_gpu_blocks"), std::string::npos);
}

TEST(ProfileTest, SglangPageSizeAndNumPagesComeFromCacheConfig) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* a =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  EngineSeries* b =
      reg->GetOrCreate({"sglang", "m", "1", {}, Profile::kSglang});
  std::string text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_EQ(text.find("sglang:page_size"), std::string::npos);
  EXPECT_EQ(text.find("sglang:num_pages"), std::string::npos);
  EXPECT_EQ(text.find("sglang:cache_config_info"), std::string::npos);
  a->part<CacheConfigPart>().Set(
      {{"page_size", "16", 16}, {"num_pages", "8192", 8192}});
  // Not a number: no gauge sample, still a label.
  b->part<CacheConfigPart>().Set({{"page_size", "big", std::nan("")}});
  text = Render(*reg, ExpositionFormat::kText004);
  const std::string l0 = "{model_name=\"m\",engine=\"0\"";
  const std::string l1 = "{model_name=\"m\",engine=\"1\"";
  EXPECT_TRUE(HasLine(text, "sglang:cache_config_info" + l0 +
                                ",page_size=\"16\",num_pages=\"8192\"} 1"))
      << text;
  EXPECT_TRUE(
      HasLine(text, "sglang:cache_config_info" + l1 + ",page_size=\"big\"} 1"));
  EXPECT_TRUE(HasLine(text, "sglang:page_size" + l0 + "} 16"));
  EXPECT_TRUE(HasLine(text, "sglang:num_pages" + l0 + "} 8192"));
  EXPECT_EQ(text.find("sglang:page_size" + l1), std::string::npos);
  EXPECT_EQ(text.find("sglang:num_pages" + l1), std::string::npos);
  EXPECT_NE(text.find("# HELP sglang:cache_config_info Cache configuration "
                      "information.\n"),
            std::string::npos);
}

TEST(ProfileTest, SglangCountersAndWindowGauges) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"sglang", "m", "0", {}, Profile::kSglang});
  s->Add(kPromptTokens, 1);  // the vLLM counters are not what SGLang shows
  s->Add(kGenerationTokens, 2);
  s->Add(kPromptTokensAtFinish, 30);
  s->Add(kGenerationTokensAtFinish, 40);
  s->Add(kNumFinishedRequests, 5);
  s->Add(kNumAbortedRequests, 2);
  s->Add(kPrefixCacheHits, 77);
  s->Set(kWindowGenerationThroughput, 12.5);
  s->Set(kWindowCacheHitRate, 0.5);
  s->Set(kKvCacheUsagePerc, 0.125);
  s->AddDerived(kNumRequestsRunning, 3);
  s->AddDerived(kNumRequestsWaiting, 4);
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string l = "{model_name=\"m\",engine=\"0\"}";
  EXPECT_TRUE(HasLine(text, "sglang:prompt_tokens_total" + l + " 30")) << text;
  EXPECT_TRUE(HasLine(text, "sglang:generation_tokens_total" + l + " 40"));
  EXPECT_TRUE(HasLine(text, "sglang:num_requests_total" + l + " 5"));
  EXPECT_TRUE(HasLine(text, "sglang:num_aborted_requests_total" + l + " 2"));
  EXPECT_TRUE(HasLine(text,
                      "sglang:cached_tokens_total{model_name=\"m\",engine="
                      "\"0\",cache_source=\"total\"} 77"));
  EXPECT_TRUE(HasLine(text, "sglang:gen_throughput" + l + " 12.5"));
  EXPECT_TRUE(HasLine(text, "sglang:cache_hit_rate" + l + " 0.5"));
  EXPECT_TRUE(HasLine(text, "sglang:spec_accept_length" + l + " 0"));
  EXPECT_TRUE(HasLine(text, "sglang:token_usage" + l + " 0.125"));
  EXPECT_TRUE(HasLine(text, "sglang:num_running_reqs" + l + " 3"));
  EXPECT_TRUE(HasLine(text, "sglang:num_queue_reqs" + l + " 4"));
  EXPECT_NE(text.find("# TYPE sglang:prompt_tokens_histogram histogram\n"),
            std::string::npos);
  EXPECT_NE(text.find("sglang:queue_time_seconds_bucket{model_name=\"m\","
                      "engine=\"0\",le=\"0\"} 0\n"),
            std::string::npos);
}

TEST(ProfileTest, LmdeployFinishedReasonsAreResponseTypes) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"lmdeploy", "m", "0", {}, Profile::kLmdeploy});
  s->AddChild(kRequestSuccess, size_t(FinishReason::kStop), 3);
  s->AddChild(kRequestSuccess, size_t(FinishReason::kLength), 2);
  s->AddChild(kRequestSuccess, size_t(FinishReason::kAbort), 1);
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string p =
      "lmdeploy:request_success_total{model_name=\"m\",engine=\"0\","
      "finished_reason=\"ResponseType.";
  EXPECT_TRUE(HasLine(text, p + "FINISH\"} 5")) << text;
  EXPECT_TRUE(HasLine(text, p + "CANCEL\"} 1"));
  EXPECT_TRUE(HasLine(text, p + "INTERNAL_ENGINE_ERROR\"} 0"));
  size_t samples = 0;
  for (size_t at = text.find("\nlmdeploy:request_success_total{");
       at != std::string::npos;
       at = text.find("\nlmdeploy:request_success_total{", at + 1)) {
    ++samples;
  }
  EXPECT_EQ(samples, 3u);
}

TEST(ProfileTest, LmdeploySpecDecodeRatios) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s =
      reg->GetOrCreate({"lmdeploy", "m", "0", {}, Profile::kLmdeploy});
  const std::string l = "{model_name=\"m\",engine=\"0\"";
  std::string text = Render(*reg, ExpositionFormat::kText004);
  // No drafts yet: 0, and no per-position series.
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_rate" + l + "} 0"));
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_length" + l + "} 0"));
  EXPECT_EQ(text.find("spec_decode_per_position_accept_rate"),
            std::string::npos);
  s->Add(kSpecDecodeNumDrafts, 4);
  s->Add(kSpecDecodeNumDraftTokens, 8);
  s->Add(kSpecDecodeNumAcceptedTokens, 6);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 0, 3);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 1, 2);
  s->AddChild(kSpecDecodeNumAcceptedTokensPerPos, 2, 1);
  text = Render(*reg, ExpositionFormat::kText004);
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_rate" + l + "} 0.75"));
  EXPECT_TRUE(
      HasLine(text, "lmdeploy:spec_decode_mean_accept_length" + l + "} 2.5"));
  const std::string pos = "lmdeploy:spec_decode_per_position_accept_rate" + l;
  EXPECT_TRUE(HasLine(text, pos + ",position=\"0\"} 0.75")) << text;
  EXPECT_TRUE(HasLine(text, pos + ",position=\"1\"} 0.5"));
  EXPECT_TRUE(HasLine(text, pos + ",position=\"2\"} 0.25"));
}

TEST(ProfileTest, LoraRequestsInfoIsOneSeriesPerEngineSeries) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* a = reg->GetOrCreate({"vllm", "m", "0", {}});
  EngineSeries* b = reg->GetOrCreate({"vllm", "m", "1", {{"tier", "x"}}});
  a->part<LoraPart>().InitTime(1'764'633'600);
  b->part<LoraPart>().InitTime(1'764'633'600);
  b->part<LoraPart>().SetMaxLora(8);
  RequestLabels& labels = reg->request_labels();
  const uint16_t x = labels.InternLora("x");
  const uint16_t y = labels.InternLora("y");
  b->part<LoraPart>().Add(y, true, 1, 1'764'633'601);
  b->part<LoraPart>().Add(x, true, 1, 1'764'633'602);
  b->part<LoraPart>().Add(x, false, 1, 1'764'633'603.5);
  b->part<LoraPart>().Add(y, true, 1,
                          1'764'633'604);  // a second request: no change
  const std::string text = Render(*reg, ExpositionFormat::kText004);
  const std::string p = "vllm:lora_requests_info{model_name=\"m\",";
  EXPECT_TRUE(HasLine(text, p + "engine=\"0\",max_lora=\"0\","
                                "running_lora_adapters=\"\","
                                "waiting_lora_adapters=\"\"} 1764633600"))
      << text;
  EXPECT_TRUE(HasLine(text, p + "engine=\"1\",tier=\"x\",max_lora=\"8\","
                                "running_lora_adapters=\"x,y\","
                                "waiting_lora_adapters=\"x\"} 1764633603.5"));
  size_t samples = 0;
  for (size_t at = text.find("\nvllm:lora_requests_info{");
       at != std::string::npos;
       at = text.find("\nvllm:lora_requests_info{", at + 1)) {
    ++samples;
  }
  EXPECT_EQ(samples, 2u);
}

// The per-request labels go on request-level families only: not on
// gauges, STEP counters, num_preemptions or iteration histograms.
TEST(ProfileTest, RequestLabelsOnlyOnRequestLevelFamilies) {
  for (Profile p : {Profile::kVllm, Profile::kSglang, Profile::kLmdeploy}) {
    SCOPED_TRACE(ProfileName(p));
    RegistryOptions options;
    options.request_labels = {"tenant"};
    options.legacy_names = true;
    std::unique_ptr<Registry> reg;
    ASSERT_TRUE(Registry::Create(options, &reg).ok());
    EngineSeries* s =
        reg->GetOrCreate({ProfileNamespace(p, "vllm", ""), "m", "0", {}, p});
    Fill(*s, 1, true, true);
    Fill(s->Cell(KeyOf(*reg, *s, {"acme"})), 2, true, true);
    s->part<CacheConfigPart>().Set({{"page_size", "16", 16}});
    const std::string text = Render(*reg, ExpositionFormat::kText004);
    std::map<std::string, bool> request_level;  // exposed name -> flag
    for (const FamilyDef& f : ProfileFamilies(p)) {
      std::string name =
          ProfileNamespace(p, "vllm", "") + ":" + std::string(FamilyName(f));
      if (f.type == MetricType::kCounter) name += "_total";
      request_level[name] = f.source == FamilySource::kMetric &&
                            kEngineMetrics[f.metric].request_level;
    }
    size_t labelled = 0;
    for (const Family& f : Parse(text, ExpositionFormat::kText004)) {
      if (f.name.find(':') == std::string::npos) continue;
      SCOPED_TRACE(f.name);
      ASSERT_TRUE(request_level.count(f.name));
      bool acme = false;
      for (const Sample& smp : f.samples) {
        bool has_tenant = false;
        for (const auto& [n, v] : smp.labels) {
          if (n != "tenant") continue;
          has_tenant = true;
          acme = acme || v == "acme";
        }
        EXPECT_EQ(has_tenant, request_level[f.name]) << smp.name;
      }
      EXPECT_EQ(acme, request_level[f.name]);
      if (acme) ++labelled;
    }
    size_t want = 0;
    for (const auto& [name, flag] : request_level) want += flag ? 1 : 0;
    EXPECT_EQ(labelled, want);
    EXPECT_GE(want, 10u);
  }
}

// What promtool finds in the profiles: the findings docs/metrics.md keeps
// on purpose for each (SGLang's *_histogram names and units in its KV
// transfer names, LMDeploy's iter_token_latency), nothing else, no parse
// error.
bool IsExpectedProfileLintFinding(const std::string& line) {
  if (IsExpectedLintFinding(line)) return true;
  for (const char* name :
       {"sglang:prompt_tokens_histogram", "sglang:generation_tokens_histogram",
        "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_total_mb",
        "lmdeploy:iter_token_latency"}) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

TEST(ProfileTest, PromtoolFindsOnlyTheKnownLintsOfEachProfile) {
  const std::string promtool = FindOnPath("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not on PATH";
  const auto reg = ProfilesRegistry();
  ExpectOnlyExpectedLints(promtool, Render(*reg, ExpositionFormat::kText004),
                          IsExpectedProfileLintFinding);
}

}  // namespace
}  // namespace tokenmeter::daemon::exposition_test
