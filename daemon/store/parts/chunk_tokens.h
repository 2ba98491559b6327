// LMDeploy's per-chunk figures (its iteration_tokens_total and
// time_per_output_token_seconds observe once per TOKENS chunk): the
// bucket of the latest chunk size (nearly every chunk after the first has
// one token, so one bucket search in many is done), and whether the
// per-chunk TPOT has the ITL's bounds (a one-token chunk then falls in the
// ITL's bucket). A series of the lmdeploy profile has this part from its
// first TOKENS. Nothing of it is state: a snapshot holds it empty.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_CHUNK_TOKENS_H_
#define TOKENMETER_DAEMON_STORE_PARTS_CHUNK_TOKENS_H_

#include <cstddef>
#include <cstdint>

#include "daemon/store/part.h"

namespace tokenmeter::daemon {

class Histogram;

class ChunkTokensPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kChunkTokens;
  explicit ChunkTokensPart(EngineSeries& series);

  // Observes a chunk of n tokens into the series' per-chunk iteration
  // tokens. O(1) when n is the previous chunk's size, else a bucket search.
  void ObserveChunk(uint64_t n);
  // Whether the per-chunk TPOT and the ITL have the same bounds and units.
  bool tpot_shares_itl_buckets() const { return tpot_shares_itl_; }

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef&, const RegistryOptions&) const override {
    return false;
  }
  void Write(const FamilyDef&, const EngineSeries&,
             MetricWriter&) const override {}
  void SaveState(StateWriter&) const override {}
  void LoadState(StateReader&) override {}

 private:
  Histogram& chunk_tokens_;  // the series' iteration tokens per chunk
  const bool tpot_shares_itl_;
  uint64_t n_ = UINT64_MAX;  // the latest chunk's size
  size_t bucket_ = 0;        // and its bucket
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_CHUNK_TOKENS_H_
