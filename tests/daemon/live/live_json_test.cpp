// /api/v1/live's document, byte for byte.
#include "daemon/live/live_json.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "daemon/live/history.h"
#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/waiting_reason.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon::live {
namespace {

constexpr uint64_t kSec = 1'000'000'000;

TEST(RenderJsonTest, OneEntryPerSeriesWithNowAndHistory) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s = reg->GetOrCreate(
      {"vllm", "m\"1", "dp0", {{"team", "a"}, {"zone", "x\\y"}}});
  History h;
  h.Start(*reg, 0);
  s->Add(kPromptTokens, 10);
  s->hist(kTimeToFirstToken).Observe(3e6);
  h.Tick(*reg, kSec, 1000);
  s->AddDerived(kNumRequestsWaiting, 2);
  // Protocol 1.2: null before the series' first rejection and first STEP
  // waiting_deferred, numbers from then on.
  s->part<AdmissionPart>().Reject("queue_full");
  s->part<AdmissionPart>().Reject("token_cap");
  s->part<WaitingReasonPart>().Set(2, 1);
  h.Tick(*reg, 2 * kSec, 1001);
  // A series made after the last tick: no point yet.
  reg->GetOrCreate({"vllm", "n", "dp1", {}});
  std::string out;
  RenderJson(*reg, h, out);
  EXPECT_EQ(
      out,
      "{\"series\":[{\"engine_family\":\"vllm\",\"model_name\":\"m\\\"1\","
      "\"engine\":\"dp0\",\"labels\":{\"team\":\"a\",\"zone\":\"x\\\\y\"},"
      "\"now\":{\"t\":1001,\"running\":0,\"waiting\":2,\"kv_usage\":0,"
      "\"prompt_tokens_per_s\":0,\"generation_tokens_per_s\":0,"
      "\"preemptions_per_s\":0,\"prefix_cache_hit_rate\":null,"
      "\"ttft_p50_s\":null,\"ttft_p99_s\":null,\"itl_p50_s\":null,"
      "\"itl_p99_s\":null,\"e2e_p50_s\":null,\"e2e_p99_s\":null,"
      "\"admission_rejections_per_s\":2,\"waiting_capacity\":1,"
      "\"waiting_deferred\":1},"
      "\"history\":{\"t\":[1000,1001],\"running\":[0,0],\"waiting\":[0,2],"
      "\"kv_usage\":[0,0],\"prompt_tokens_per_s\":[10,0],"
      "\"generation_tokens_per_s\":[0,0],\"preemptions_per_s\":[0,0],"
      "\"prefix_cache_hit_rate\":[null,null],\"ttft_p50_s\":[0.003,null],"
      "\"ttft_p99_s\":[0.00496,null],\"itl_p50_s\":[null,null],"
      "\"itl_p99_s\":[null,null],\"e2e_p50_s\":[null,null],"
      "\"e2e_p99_s\":[null,null],\"admission_rejections_per_s\":[null,2],"
      "\"waiting_capacity\":[null,1],\"waiting_deferred\":[null,1]}},"
      "{\"engine_family\":\"vllm\",\"model_name\":\"n\",\"engine\":\"dp1\","
      "\"labels\":{},\"now\":{\"t\":null,\"running\":null,\"waiting\":null,"
      "\"kv_usage\":null,\"prompt_tokens_per_s\":null,"
      "\"generation_tokens_per_s\":null,\"preemptions_per_s\":null,"
      "\"prefix_cache_hit_rate\":null,\"ttft_p50_s\":null,"
      "\"ttft_p99_s\":null,\"itl_p50_s\":null,\"itl_p99_s\":null,"
      "\"e2e_p50_s\":null,\"e2e_p99_s\":null,"
      "\"admission_rejections_per_s\":null,\"waiting_capacity\":null,"
      "\"waiting_deferred\":null},\"history\":{\"t\":[],"
      "\"running\":[],\"waiting\":[],\"kv_usage\":[],"
      "\"prompt_tokens_per_s\":[],\"generation_tokens_per_s\":[],"
      "\"preemptions_per_s\":[],\"prefix_cache_hit_rate\":[],"
      "\"ttft_p50_s\":[],\"ttft_p99_s\":[],\"itl_p50_s\":[],"
      "\"itl_p99_s\":[],\"e2e_p50_s\":[],\"e2e_p99_s\":[],"
      "\"admission_rejections_per_s\":[],\"waiting_capacity\":[],"
      "\"waiting_deferred\":[]}}],"
      "\"points_max\":900,\"series_max\":64,\"series_unfollowed\":0}\n");
}

TEST(RenderJsonTest, NoSeriesIsAnEmptyList) {
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  History h;
  std::string out;
  RenderJson(*reg, h, out);
  EXPECT_EQ(out,
            "{\"series\":[],\"points_max\":900,\"series_max\":64,"
            "\"series_unfollowed\":0}\n");
}

TEST(PageHtmlTest, IsTheEmbeddedSelfContainedPage) {
  const std::string_view page = PageHtml();
  EXPECT_EQ(page.substr(0, 15), "<!doctype html>");
  EXPECT_NE(page.find("api/v1/live"), std::string_view::npos);
  EXPECT_NE(page.find("href=\"metrics\""), std::string_view::npos);
  // Nothing from elsewhere: no absolute URL, no external script or sheet.
  EXPECT_EQ(page.find("http://"), std::string_view::npos);
  EXPECT_EQ(page.find("https://"), std::string_view::npos);
  EXPECT_EQ(page.find("src="), std::string_view::npos);
  EXPECT_EQ(page.find("<link"), std::string_view::npos);
  EXPECT_EQ(page.find("@import"), std::string_view::npos);
}

}  // namespace
}  // namespace tokenmeter::daemon::live
