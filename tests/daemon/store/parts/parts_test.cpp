// The engine-family parts (daemon/store/parts/): each part's observe API,
// whether its families are shown, what it writes, its snapshot (and the
// refusals of a bad one), the factory and the reading of snapshot formats
// 1 and 2, which kept the features in fields of the series.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/base/state_io.h"
#include "daemon/exposition/text_writer.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/part.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/chunk_tokens.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/parts/reason_counts.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {
namespace {

// The row of `profile` whose part family is `fam` (key: the entry, for
// cache_config values).
const FamilyDef& Row(PartFamily fam, Profile profile = Profile::kVllm,
                     std::string_view key = {}) {
  for (const FamilyDef& f : ProfileFamilies(profile)) {
    if (f.part_family == fam && (key.empty() || f.key == key)) return f;
  }
  ADD_FAILURE() << "no row";
  return ProfileFamilies(profile)[0];
}

// The text samples a part writes for family `f` (named x, or x_total for a
// counter).
std::string Samples(const Part& p, const FamilyDef& f, const EngineSeries& s) {
  std::string out;
  TextWriter w(ExpositionFormat::kText004, out);
  w.BeginFamily("", "x", f.type, "h");
  p.Write(f, s, w);
  // Drop the HELP and TYPE lines.
  const size_t end_of_type = out.find('\n', out.find("# TYPE"));
  return out.substr(end_of_type + 1);
}

class PartsTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(RegistryOptions{}); }
  void Make(const RegistryOptions& options) {
    ASSERT_TRUE(Registry::Create(options, &reg_).ok());
    s_ = reg_->GetOrCreate({"vllm", "m", "0", {{"k", "v"}}});
    ASSERT_NE(s_, nullptr);
  }
  // A part's snapshot, loaded into a fresh part of the same kind.
  template <typename P>
  std::unique_ptr<Part> RoundTrip(const P& part, bool* ok) {
    std::string bytes;
    StateWriter w(bytes);
    part.SaveState(w);
    std::unique_ptr<Part> copy = MakePart(P::kKind, *s_);
    StateReader r(bytes.data(), bytes.size());
    copy->LoadState(r);
    *ok = r.ok() && r.at_end();
    return copy;
  }
  std::unique_ptr<Registry> reg_;
  EngineSeries* s_ = nullptr;
};

TEST_F(PartsTest, FactoryMakesEachKindAndEverySeriesHasItsLoraPart) {
  for (size_t k = 0; k < kNumPartKinds; ++k) {
    std::unique_ptr<Part> p = MakePart(PartKind(k), *s_);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->kind(), PartKind(k));
  }
  EXPECT_EQ(MakePart(PartKind::kNone, *s_), nullptr);
  EXPECT_NE(s_->find_part<LoraPart>(), nullptr);
  EXPECT_EQ(s_->find_part<MoePart>(), nullptr);
  EXPECT_EQ(s_->find_part<CacheConfigPart>(), nullptr);
  EXPECT_EQ(s_->find_part<ChunkTokensPart>(), nullptr);
  EXPECT_EQ(s_->parts().size(), 1u);
  // part<P>() makes it once.
  MoePart* moe = &s_->part<MoePart>();
  EXPECT_EQ(&s_->part<MoePart>(), moe);
  EXPECT_EQ(s_->parts().size(), 2u);
}

TEST_F(PartsTest, CacheConfigRendersItsLabelsOnceAndShowsNumbersOnly) {
  CacheConfigPart& c = s_->part<CacheConfigPart>();
  c.Set({{"block_size", "16", 16},
         {"cache_dtype", "auto", std::nan("")},
         {"quote", "a\"b", std::nan("")}});
  EXPECT_EQ(c.info_text(),
            "model_name=\"m\",engine=\"0\",k=\"v\",block_size=\"16\","
            "cache_dtype=\"auto\",quote=\"a\\\"b\"");
  EXPECT_EQ(c.info_pairs().back().second, "a\"b");
  ASSERT_NE(c.FindNumber("block_size"), nullptr);
  EXPECT_EQ(c.FindNumber("cache_dtype"), nullptr);  // not a number
  EXPECT_EQ(c.FindNumber("page_size"), nullptr);    // not sent
  const RegistryOptions o;
  EXPECT_TRUE(c.Shows(Row(PartFamily::kCacheConfigInfo), o));
  const FamilyDef& page =
      Row(PartFamily::kCacheConfigValue, Profile::kSglang, "page_size");
  EXPECT_FALSE(c.Shows(page, o));
  EXPECT_EQ(Samples(c, Row(PartFamily::kCacheConfigInfo), *s_),
            "x{" + c.info_text() + "} 1\n");
  // A later HELLO's entries replace the earlier ones.
  c.Set({{"page_size", "32", 32}});
  EXPECT_TRUE(c.Shows(page, o));
  EXPECT_EQ(Samples(c, page, *s_),
            "x{model_name=\"m\",engine=\"0\",k=\"v\"} 32\n");
  bool ok = false;
  std::unique_ptr<Part> copy = RoundTrip(c, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(static_cast<CacheConfigPart&>(*copy).info_text(), c.info_text());
}

TEST_F(PartsTest, CacheConfigRefusesMoreEntriesThanTheProtocolAllows) {
  std::string bytes;
  StateWriter w(bytes);
  w.U64(TM_MAX_CACHE_CONFIG + 1);
  for (uint32_t i = 0; i <= TM_MAX_CACHE_CONFIG; ++i) {
    w.Str("k");
    w.Str("v");
    w.F64(1);
  }
  CacheConfigPart c(*s_);
  StateReader r(bytes.data(), bytes.size());
  c.LoadState(r);
  EXPECT_FALSE(r.ok());
}

TEST_F(PartsTest, LoraSetsChangeTheirTimeOnlyWhenASetChanges) {
  LoraPart& l = *s_->find_part<LoraPart>();
  EXPECT_EQ(l.max_lora(), "0");
  l.InitTime(100);
  l.InitTime(150);  // a later HELLO: the sets have not changed
  EXPECT_EQ(l.changed_unix_s(), 100);
  RequestLabels& labels = reg_->request_labels();
  const uint16_t b = labels.InternLora("beta");
  const uint16_t a = labels.InternLora("alpha");
  l.Add(b, /*running=*/true, 1, 200);
  l.Add(a, /*running=*/true, 1, 201);
  l.Add(a, /*running=*/true, 1, 202);  // a second request: no change
  l.Add(b, /*running=*/false, 1, 203);
  l.Add(0, true, 1, 999);  // no adapter: nothing
  EXPECT_EQ(l.Set(true), "alpha,beta");
  EXPECT_EQ(l.Set(false), "beta");
  EXPECT_EQ(l.changed_unix_s(), 203);
  l.SetMaxLora(4);
  EXPECT_TRUE(l.Shows(Row(PartFamily::kLoraRequestsInfo), RegistryOptions{}));
  EXPECT_EQ(Samples(l, Row(PartFamily::kLoraRequestsInfo), *s_),
            "x{model_name=\"m\",engine=\"0\",k=\"v\",max_lora=\"4\","
            "running_lora_adapters=\"alpha,beta\",waiting_lora_adapters="
            "\"beta\"} 203\n");
  bool ok = false;
  std::unique_ptr<Part> copy = RoundTrip(l, &ok);
  EXPECT_TRUE(ok);
  const auto& c = static_cast<LoraPart&>(*copy);
  EXPECT_EQ(c.Set(true), "alpha,beta");
  EXPECT_EQ(c.max_lora(), "4");
  EXPECT_EQ(c.changed_unix_s(), 203);
}

TEST_F(PartsTest, LoraRefusesAnAdapterTheTablesDoNotHave) {
  for (const uint16_t id : {uint16_t{0}, uint16_t{7}}) {
    std::string bytes;
    StateWriter w(bytes);
    w.Str("0");
    w.U64(1);
    w.U16(id);
    w.I64(1);
    w.I64(0);
    w.F64(1);
    LoraPart l(*s_);
    StateReader r(bytes.data(), bytes.size());
    l.LoadState(r);
    EXPECT_FALSE(r.ok()) << id;
  }
}

// The per-expert counts of `layer` (empty when the part keeps none).
std::vector<uint64_t> Experts(const MoePart& m, uint32_t layer) {
  const MoePart::Layer* l = m.FindLayer(layer);
  if (l == nullptr) return {};
  return {l->expert_tokens().begin(), l->expert_tokens().end()};
}

TEST_F(PartsTest, MoeAddsUpPerLayerAndObservesItsImbalance) {
  MoePart& m = s_->part<MoePart>();
  const uint64_t a[] = {6, 2, 0, 0};
  const uint64_t b[] = {1, 1, 1, 1};
  const uint64_t zero[] = {0, 0};
  const uint64_t wrong[] = {1, 2, 3};
  EXPECT_TRUE(m.Add(2, a, true));
  EXPECT_TRUE(m.Add(2, b, true));
  EXPECT_TRUE(m.Add(5, zero, true));
  EXPECT_FALSE(m.Add(2, wrong, true));  // the expert count is fixed
  EXPECT_EQ(Experts(m, 2), (std::vector<uint64_t>{7, 3, 1, 1}));
  EXPECT_EQ(m.FindLayer(2)->routed, 12u);
  EXPECT_DOUBLE_EQ(m.FindLayer(2)->imbalance, 1.0);
  EXPECT_FALSE(m.FindLayer(5)->has_imbalance);
  EXPECT_EQ(m.FindLayer(3), nullptr);
  EXPECT_EQ(s_->hist(kMoeImbalance).count(), 2u);  // 3, then 1
  uint32_t worst = 99;
  ASSERT_NE(m.WorstLayer(&worst), nullptr);
  EXPECT_EQ(worst, 2u);
  // Saturating.
  const uint64_t big[] = {UINT32_MAX, UINT32_MAX};
  MoePart sat(*s_);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sat.Add(0, big, true));
  EXPECT_EQ(Experts(sat, 0)[0], 3ull * UINT32_MAX);
}

// Without --moe-expert-series a layer keeps its expert count, sum and
// imbalance only: what the exposed families need.
TEST_F(PartsTest, MoeKeepsNoPerExpertCountsWithoutTheirOption) {
  MoePart& m = s_->part<MoePart>();
  const std::vector<uint64_t> wide(1024, 3);
  const uint64_t a[] = {6, 2, 0, 0};
  EXPECT_TRUE(m.Add(4095, wide, false));
  EXPECT_TRUE(m.Add(2, a, false));
  EXPECT_TRUE(m.Add(2, a, false));
  const uint64_t three[] = {1, 2, 3};
  EXPECT_FALSE(m.Add(2, three, false));  // still a fixed expert count
  const MoePart::Layer* l = m.FindLayer(2);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->experts, nullptr);
  EXPECT_TRUE(l->expert_tokens().empty());
  EXPECT_EQ(l->expert_count, 4u);
  EXPECT_EQ(l->routed, 16u);
  EXPECT_DOUBLE_EQ(l->imbalance, 3.0);
  EXPECT_EQ(m.FindLayer(4095)->expert_count, 1024u);
  EXPECT_EQ(m.FindLayer(4095)->routed, 3u * 1024);
  EXPECT_EQ(m.FindLayer(4095)->experts, nullptr);
  // Turning the option on starts the counts at 0; off drops them.
  EXPECT_TRUE(m.Add(2, a, true));
  EXPECT_EQ(Experts(m, 2), (std::vector<uint64_t>{6, 2, 0, 0}));
  m.SetPerExpert(false);
  EXPECT_EQ(m.FindLayer(2)->experts, nullptr);
  m.SetPerExpert(true);
  EXPECT_EQ(Experts(m, 4095), std::vector<uint64_t>(1024, 0));
  EXPECT_EQ(m.FindLayer(2)->routed, 24u);
}

// Layers are kept and written by index, whatever order they come in.
TEST_F(PartsTest, MoeWritesLayersInIndexOrder) {
  MoePart& m = s_->part<MoePart>();
  const uint64_t one[] = {1};
  for (const uint32_t layer : {9u, 0u, 4095u, 3u, 10u, 1u}) {
    ASSERT_TRUE(m.Add(layer, one, false));
  }
  std::vector<uint32_t> order;
  for (const MoePart::Layer& l : m.layers()) order.push_back(l.index);
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 1, 3, 9, 10, 4095}));
  const std::string text = Samples(m, Row(PartFamily::kMoeRoutedTokens), *s_);
  EXPECT_LT(text.find("layer=\"1\""), text.find("layer=\"3\""));
  EXPECT_LT(text.find("layer=\"10\""), text.find("layer=\"4095\""));
}

TEST_F(PartsTest, MoeExpertSeriesOnlyWithTheirOption) {
  MoePart& m = s_->part<MoePart>();
  RegistryOptions o;
  EXPECT_FALSE(m.Shows(Row(PartFamily::kMoeRoutedTokens), o));  // no layer
  const uint64_t load[] = {3, 1};
  ASSERT_TRUE(m.Add(7, load, true));
  EXPECT_TRUE(m.Shows(Row(PartFamily::kMoeRoutedTokens), o));
  EXPECT_TRUE(m.Shows(Row(PartFamily::kMoeLayerImbalance), o));
  EXPECT_FALSE(m.Shows(Row(PartFamily::kMoeExpertTokens), o));
  o.moe_expert_series = true;
  EXPECT_TRUE(m.Shows(Row(PartFamily::kMoeExpertTokens), o));
  EXPECT_EQ(Samples(m, Row(PartFamily::kMoeExpertTokens), *s_),
            "x_total{model_name=\"m\",engine=\"0\",k=\"v\",layer=\"7\","
            "expert=\"0\"} 3\n"
            "x_total{model_name=\"m\",engine=\"0\",k=\"v\",layer=\"7\","
            "expert=\"1\"} 1\n");
  EXPECT_EQ(Samples(m, Row(PartFamily::kMoeRoutedTokens), *s_),
            "x_total{model_name=\"m\",engine=\"0\",k=\"v\",layer=\"7\"} 4\n");
  bool ok = false;
  std::unique_ptr<Part> copy = RoundTrip(m, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(static_cast<MoePart&>(*copy).FindLayer(7)->routed, 4u);
  EXPECT_EQ(Experts(static_cast<MoePart&>(*copy), 7),
            (std::vector<uint64_t>{3, 1}));
  // Without per-expert counts the snapshot keeps the expert count.
  m.SetPerExpert(false);
  copy = RoundTrip(m, &ok);
  EXPECT_TRUE(ok);
  const MoePart::Layer* l = static_cast<MoePart&>(*copy).FindLayer(7);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->experts, nullptr);
  EXPECT_EQ(l->expert_count, 2u);
  EXPECT_EQ(l->routed, 4u);
  EXPECT_DOUBLE_EQ(l->imbalance, 1.5);
  // A layer that has no per-expert counts yet shows each of its experts at
  // 0 (a snapshot saved without the option, loaded with it).
  EXPECT_EQ(Samples(*copy, Row(PartFamily::kMoeExpertTokens), *s_),
            "x_total{model_name=\"m\",engine=\"0\",k=\"v\",layer=\"7\","
            "expert=\"0\"} 0\n"
            "x_total{model_name=\"m\",engine=\"0\",k=\"v\",layer=\"7\","
            "expert=\"1\"} 0\n");
}

// A format-3 snapshot (every layer with its per-expert counts) still loads.
TEST_F(PartsTest, MoeLoadsFormatThree) {
  std::string bytes;
  StateWriter w(bytes);
  w.U64(2);
  for (const uint32_t layer : {1u, 7u}) {
    w.U32(layer);
    w.U64(2);
    w.U64(3);
    w.U64(layer);
    w.U64(3 + layer);
    w.F64(1.5);
    w.Bool(true);
  }
  MoePart m(*s_);
  StateReader r(bytes.data(), bytes.size(), /*version=*/3);
  m.LoadState(r);
  ASSERT_TRUE(r.ok() && r.at_end());
  ASSERT_EQ(m.layers().size(), 2u);
  EXPECT_EQ(Experts(m, 7), (std::vector<uint64_t>{3, 7}));
  EXPECT_EQ(m.FindLayer(7)->expert_count, 2u);
  EXPECT_EQ(m.FindLayer(1)->routed, 4u);
  EXPECT_TRUE(m.FindLayer(1)->has_imbalance);
}

TEST_F(PartsTest, MoeRefusesMoreLayersOrExpertsThanTheProtocolAllows) {
  // Two layers (index, experts) in the layout of `version`, or a count of
  // `layers` with zero-filled bytes behind it.
  struct Case {
    const char* what;
    uint64_t layers;
    uint32_t first, second;
    uint64_t experts;
  };
  const Case cases[] = {
      {"too many layers", TM_MAX_MOE_LAYERS + 1, 0, 1, 1},
      {"too many experts", 2, 0, 1, TM_MAX_MOE_EXPERTS + 1},
      {"no expert", 2, 0, 1, 0},
      {"layer past the protocol", 2, 0, TM_MAX_MOE_LAYERS, 1},
      {"layer twice", 2, 5, 5, 1},
      {"layers out of order", 2, 6, 5, 1},
      {"good", 2, 5, 6, 1},
  };
  for (const uint32_t version : {3u, 4u}) {
    for (const Case& c : cases) {
      std::string bytes;
      StateWriter w(bytes);
      w.U64(c.layers);
      for (const uint32_t layer : {c.first, c.second}) {
        w.U32(layer);
        if (version == 3) {
          w.U64(c.experts);
        } else {
          w.U32(uint32_t(c.experts));
          w.Bool(true);
        }
        for (uint64_t e = 0; e < std::min<uint64_t>(c.experts, 2); ++e) {
          w.U64(1);
        }
        w.U64(1);
        w.F64(1);
        w.Bool(true);
      }
      const bool good = std::string_view(c.what) == "good";
      if (!good) bytes.append(64 * 1024, '\0');
      MoePart m(*s_);
      StateReader r(bytes.data(), bytes.size(), version);
      m.LoadState(r);
      EXPECT_EQ(r.ok(), good) << c.what << " format " << version;
      if (good) {
        EXPECT_TRUE(r.at_end()) << version;
      }
    }
  }
}

TEST_F(PartsTest, ChunkTokensObservesAsAPlainHistogramWould) {
  EngineSeries* lm =
      reg_->GetOrCreate({"lmdeploy", "m", "0", {}, Profile::kLmdeploy});
  ChunkTokensPart& c = lm->part<ChunkTokensPart>();
  // LMDeploy's per-chunk TPOT and its ITL share their bounds.
  EXPECT_TRUE(c.tpot_shares_itl_buckets());
  Histogram plain(&lm->hist(kIterationTokensChunk).layout());
  for (uint64_t n : {1, 1, 1, 7, 7, 1, 300, 1}) {
    c.ObserveChunk(n);
    plain.Observe(double(n));
  }
  EXPECT_EQ(lm->hist(kIterationTokensChunk).counts(), plain.counts());
  EXPECT_EQ(lm->hist(kIterationTokensChunk).sum(), plain.sum());
  // It has no family and nothing to save.
  EXPECT_FALSE(c.Shows(Row(PartFamily::kLoraRequestsInfo), RegistryOptions{}));
  std::string bytes;
  StateWriter w(bytes);
  c.SaveState(w);
  EXPECT_TRUE(bytes.empty());
}

// A series' snapshot (the current format).
std::string SeriesBytes(const EngineSeries& s) {
  std::string bytes;
  StateWriter w(bytes);
  s.SaveState(w);
  return bytes;
}

TEST_F(PartsTest, SeriesSnapshotRefusesAnUnknownOrRepeatedPart) {
  s_->part<MoePart>();
  const std::string good = SeriesBytes(*s_);
  // The parts come last but for the start time (8 bytes, format 6):
  // count, then kind and payload each. The LoRA part (kind 0) comes first;
  // find its kind byte after the count.
  const size_t end = good.size() - 8 /*start time*/;
  const size_t parts_at = end - 1 /*MoE kind*/ - 8 /*no layers*/ -
                          (1 + 4 + 1 + 8 + 8) /*LoRA*/ - 8 /*count*/;
  ASSERT_EQ(good[parts_at], 2);  // two parts
  for (const uint8_t kind : {uint8_t(kNumPartKinds), uint8_t(0)}) {
    std::string bad = good;
    bad[end - 9] = char(kind);  // the MoE part's kind byte
    auto reg = std::unique_ptr<Registry>();
    ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
    EngineSeries* fresh = reg->GetOrCreate({"vllm", "m", "0", {{"k", "v"}}});
    StateReader r(bad.data(), bad.size());
    LoadLabelPairs(r);  // what the registry reads before the series
    fresh->LoadState(r);
    EXPECT_FALSE(r.ok()) << int(kind);
  }
  // The untouched bytes load.
  auto reg = std::unique_ptr<Registry>();
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* fresh = reg->GetOrCreate({"vllm", "m", "0", {{"k", "v"}}});
  StateReader r(good.data(), good.size());
  LoadLabelPairs(r);
  fresh->LoadState(r);
  EXPECT_TRUE(r.ok() && r.at_end());
  EXPECT_NE(fresh->find_part<MoePart>(), nullptr);
}

TEST_F(PartsTest, FormatsOneAndTwoKeptTheFeaturesInTheSeries) {
  // What a format-2 daemon wrote after a series' admitted values: has
  // cache_config, its entries, max_lora, the MoE layers, the LoRA sets and
  // their time.
  const uint16_t adapter = reg_->request_labels().InternLora("sql");
  std::string bytes;
  StateWriter w(bytes);
  w.Bool(true);
  w.U64(1);
  w.Str("block_size");
  w.Str("16");
  w.F64(16);
  w.Str("8");
  w.U64(1);  // one layer
  w.U32(3);
  w.U64(2);
  w.U64(5);
  w.U64(1);
  w.U64(6);
  w.F64(5.0 / 3);
  w.Bool(true);
  w.U64(1);  // one adapter in use
  w.U16(adapter);
  w.I64(0);
  w.I64(2);
  w.F64(1'700'000'000.5);
  StateReader r(bytes.data(), bytes.size(), /*version=*/2);
  LoadLegacyParts(r, *s_);
  ASSERT_TRUE(r.ok() && r.at_end());
  ASSERT_NE(s_->find_part<CacheConfigPart>(), nullptr);
  EXPECT_NE(s_->find_part<CacheConfigPart>()->FindNumber("block_size"),
            nullptr);
  ASSERT_NE(s_->find_part<MoePart>(), nullptr);
  EXPECT_EQ(s_->find_part<MoePart>()->FindLayer(3)->routed, 6u);
  EXPECT_EQ(Experts(*s_->find_part<MoePart>(), 3),
            (std::vector<uint64_t>{5, 1}));
  const LoraPart& l = *s_->find_part<LoraPart>();
  EXPECT_EQ(l.max_lora(), "8");
  EXPECT_EQ(l.Set(true), "sql");
  EXPECT_EQ(l.changed_unix_s(), 1'700'000'000.5);

  // Without cache_config or MoE, no such part is made.
  Make(RegistryOptions{});
  std::string none;
  StateWriter n(none);
  n.Bool(false);
  n.U64(0);
  n.Str("0");
  n.U64(0);
  n.U64(0);
  n.F64(0);
  StateReader rn(none.data(), none.size(), 2);
  LoadLegacyParts(rn, *s_);
  ASSERT_TRUE(rn.ok() && rn.at_end());
  EXPECT_EQ(s_->find_part<CacheConfigPart>(), nullptr);
  EXPECT_EQ(s_->find_part<MoePart>(), nullptr);
  EXPECT_NE(s_->find_part<LoraPart>(), nullptr);
}

}  // namespace
}  // namespace tokenmeter::daemon

namespace tokenmeter::daemon {
namespace {

// "__other__" is the overflow's name: an engine's own reason of that name
// counts there, and a snapshot that holds it as a reason (written before
// Add() folded it) loads it folded, so no two samples share it.
TEST(ReasonCountsTest, AnEnginesOwnOtherIsTheOverflow) {
  ReasonCounts c;
  c.Add("__other__");
  for (int i = 0; i < 17; ++i) c.Add("r" + std::to_string(i));
  EXPECT_EQ(c.count("__other__"), 2u);  // its own and r16
  EXPECT_EQ(c.count("r15"), 1u);
  size_t others = 0;
  c.ForEach([&](std::string_view reason, uint64_t) {
    others += reason == ReasonCounts::kOther;
  });
  EXPECT_EQ(others, 1u);

  std::string bytes;
  StateWriter w(bytes);
  w.U64(2);
  w.Str("a");
  w.U64(3);
  w.Str("__other__");
  w.U64(4);
  w.U64(5);  // the overflow
  ReasonCounts loaded;
  StateReader r(bytes.data(), bytes.size());
  loaded.LoadState(r);
  ASSERT_TRUE(r.ok() && r.at_end());
  EXPECT_EQ(loaded.count("a"), 3u);
  EXPECT_EQ(loaded.count("__other__"), 9u);
  others = 0;
  loaded.ForEach([&](std::string_view reason, uint64_t) {
    others += reason == ReasonCounts::kOther;
  });
  EXPECT_EQ(others, 1u);
}

}  // namespace
}  // namespace tokenmeter::daemon
