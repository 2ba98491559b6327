// The part factory: the one place that knows every part (store/part.h).
#include "daemon/base/state_io.h"
#include "daemon/store/engine_series.h"
#include "daemon/store/part.h"
#include "daemon/store/parts/admission.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/chunk_tokens.h"
#include "daemon/store/parts/kv_transfer.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/parts/sleep.h"
#include "daemon/store/parts/waiting_reason.h"

namespace tokenmeter::daemon {

std::unique_ptr<Part> MakePart(PartKind k, EngineSeries& s) {
  switch (k) {
    case PartKind::kLora:
      return std::make_unique<LoraPart>(s);
    case PartKind::kCacheConfig:
      return std::make_unique<CacheConfigPart>(s);
    case PartKind::kMoe:
      return std::make_unique<MoePart>(s);
    case PartKind::kChunkTokens:
      return std::make_unique<ChunkTokensPart>(s);
    case PartKind::kAdmission:
      return std::make_unique<AdmissionPart>(s);
    case PartKind::kWaitingReason:
      return std::make_unique<WaitingReasonPart>(s);
    case PartKind::kKvTransfer:
      return std::make_unique<KvTransferPart>(s);
    case PartKind::kSleep:
      return std::make_unique<SleepPart>(s);
    case PartKind::kNone:
      break;
  }
  return nullptr;
}

void MakeEveryPart(EngineSeries& s) { s.part<LoraPart>(); }

void LoadLegacyParts(StateReader& r, EngineSeries& s) {
  const bool has_cache_config = r.Bool();
  auto cache_config = std::make_unique<CacheConfigPart>(s);
  cache_config->LoadState(r);
  if (has_cache_config) s.parts().Put(std::move(cache_config));
  LoraPart& lora = s.part<LoraPart>();
  lora.LoadMaxLora(r);
  auto moe = std::make_unique<MoePart>(s);
  moe->LoadState(r);
  if (!moe->layers().empty()) s.parts().Put(std::move(moe));
  lora.LoadSets(r);
}

MoeSize MoePartSize(const EngineSeries& s) {
  MoeSize size;
  if (const MoePart* moe = s.find_part<MoePart>()) {
    size.layers = moe->layers().size();
    for (const MoePart::Layer& l : moe->layers()) {
      size.experts += l.expert_count;
    }
  }
  return size;
}

void FitMoePart(EngineSeries& s, bool per_expert) {
  if (MoePart* moe = s.find_part<MoePart>()) moe->SetPerExpert(per_expert);
}

}  // namespace tokenmeter::daemon
