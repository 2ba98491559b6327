#include "daemon/ingest/ingest_stats.h"

#include "daemon/base/state_io.h"
#include "daemon/base/text_format.h"

namespace tokenmeter::daemon {
namespace {

// What snapshot formats 1 to 3 saved, without a length: every event kind
// up to EXPERT_LOAD and every reason before bad_field.
constexpr size_t kLegacyEventKinds = 8;
constexpr size_t kLegacyIngestErrors = size_t(IngestError::kBadField);
static_assert(kLegacyEventKinds <= kNumEventKinds);

constexpr DaemonMetric kOwned[] = {
    kIngestConnections, kIngestFrames,           kIngestEvents,
    kIngestErrors,      kIngestDuplicateBatches, kClientDroppedEvents};

}  // namespace

IngestStats::IngestStats(Registry& registry)
    : max_identities_(registry.options().max_engine_series),
      registration_(registry, this, kOwned) {}

IngestStats::~IngestStats() = default;

uint64_t IngestStats::events_total() const {
  uint64_t n = 0;
  for (uint64_t e : events_) n += e;
  return n;
}

IngestStats::Drops* IngestStats::DropsFor(const std::string& family,
                                          const std::string& model,
                                          const std::string& instance) {
  auto key = std::make_tuple(family, model, instance);
  auto it = dropped_.find(key);
  if (it == dropped_.end()) {
    if (dropped_.size() >= max_identities_) return nullptr;
    it = dropped_.emplace(std::move(key), Drops{}).first;
  }
  return &it->second;
}

void IngestStats::SetClientDropped(Drops* identity, int64_t client,
                                   uint64_t dropped_total) {
  if (identity == nullptr) return;
  Drops& d = *identity;
  auto c = d.clients.find(client);
  if (c == d.clients.end()) {
    if (d.clients.size() >= kMaxClientsPerIdentity) {
      auto oldest = d.clients.begin();
      for (auto i = d.clients.begin(); i != d.clients.end(); ++i) {
        if (i->second.updated < oldest->second.updated) oldest = i;
      }
      d.retired += oldest->second.dropped_total;
      d.clients.erase(oldest);
    }
    c = d.clients.emplace(client, Drops::Client{}).first;
  }
  c->second.dropped_total = dropped_total;
  c->second.updated = ++reports_;
}

void IngestStats::Collect(DaemonMetric id, MetricWriter& w) const {
  const SampleLabels none;
  switch (id) {
    case kIngestConnections:
      w.Sample(none, double(connections_));
      break;
    case kIngestFrames:
      w.Sample(none, frames_);
      break;
    case kIngestEvents:
      for (int k = 0; k < kNumEventKinds; ++k) {
        w.Sample(none.WithOwn("kind", EventKindName(EventKind(k + 1))),
                 events_[size_t(k)]);
      }
      break;
    case kIngestErrors:
      for (size_t r = 0; r < size_t(IngestError::kCount); ++r) {
        w.Sample(none.WithOwn("reason", IngestErrorName(IngestError(r))),
                 errors_[r]);
      }
      break;
    case kIngestDuplicateBatches:
      w.Sample(none, duplicate_batches_);
      break;
    case kClientDroppedEvents: {
      std::string text;
      for (const auto& [key, drops] : dropped_) {
        uint64_t total = drops.retired;
        for (const auto& [client, c] : drops.clients) total += c.dropped_total;
        const auto& [family, model, instance] = key;
        text = "engine_family=\"";
        AppendEscaped(text, family);
        text += "\",model_name=\"";
        AppendEscaped(text, model);
        text += "\",engine=\"";
        AppendEscaped(text, instance);
        text += '"';
        const std::pair<std::string, std::string> pairs[] = {
            {"engine_family", family},
            {"model_name", model},
            {"engine", instance}};
        w.Sample(SampleLabels{text, pairs, {}, {}}, total);
      }
      break;
    }
    default:
      break;
  }
}

void IngestStats::SaveState(StateWriter& w) const {
  w.U64(frames_);
  w.U64(duplicate_batches_);
  w.U64(events_.size());
  for (uint64_t n : events_) w.U64(n);
  w.U64(errors_.size());
  for (uint64_t n : errors_) w.U64(n);
  w.U64(reports_);
  w.U64(dropped_.size());
  for (const auto& [identity, drops] : dropped_) {
    w.Str(std::get<0>(identity));
    w.Str(std::get<1>(identity));
    w.Str(std::get<2>(identity));
    w.U64(drops.retired);
    w.U64(drops.clients.size());
    for (const auto& [client, c] : drops.clients) {
      w.I64(client);
      w.U64(c.dropped_total);
      w.U64(c.updated);
    }
  }
}

void IngestStats::LoadState(StateReader& r) {
  frames_ = r.U64();
  duplicate_batches_ = r.U64();
  // Before format 4 the arrays had no length: 7 event kinds and 22 reasons
  // (the ones before EXPERT_LOAD and bad_field). New kinds and reasons are
  // appended, so an older array is a prefix of today's.
  const bool sized = r.version() >= 4;
  const size_t kinds = sized ? r.Count(events_.size(), 8) : kLegacyEventKinds;
  for (size_t i = 0; i < kinds; ++i) events_[i] = r.U64();
  const size_t reasons =
      sized ? r.Count(errors_.size(), 8) : kLegacyIngestErrors;
  for (size_t i = 0; i < reasons; ++i) errors_[i] = r.U64();
  reports_ = r.U64();
  const size_t identities = r.Count(max_identities_, 28);
  for (size_t i = 0; i < identities && r.ok(); ++i) {
    std::string family = r.Str(TM_MAX_STRING_BYTES);
    std::string model = r.Str(TM_MAX_STRING_BYTES);
    std::string instance = r.Str(TM_MAX_STRING_BYTES);
    Drops& drops =
        dropped_[{std::move(family), std::move(model), std::move(instance)}];
    drops.retired = r.U64();
    const size_t clients = r.Count(kMaxClientsPerIdentity, 24);
    for (size_t c = 0; c < clients && r.ok(); ++c) {
      Drops::Client& client = drops.clients[r.I64()];
      client.dropped_total = r.U64();
      client.updated = r.U64();
    }
  }
}

}  // namespace tokenmeter::daemon
