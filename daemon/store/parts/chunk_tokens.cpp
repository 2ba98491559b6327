#include "daemon/store/parts/chunk_tokens.h"

#include "daemon/store/engine_series.h"

namespace tokenmeter::daemon {
namespace {

bool SameLayout(const HistogramLayout& a, const HistogramLayout& b) {
  return a.bounds() == b.bounds() && a.divisor() == b.divisor();
}

}  // namespace

ChunkTokensPart::ChunkTokensPart(EngineSeries& series)
    : chunk_tokens_(series.hist(kIterationTokensChunk)),
      tpot_shares_itl_(
          SameLayout(series.hist(kTimePerOutputTokenChunk).layout(),
                     series.hist(kInterTokenLatency).layout())) {}

void ChunkTokensPart::ObserveChunk(uint64_t n) {
  if (n != n_) {
    n_ = n;
    bucket_ = chunk_tokens_.layout().BucketFor(double(n));
  }
  chunk_tokens_.ObserveIn(bucket_, double(n));
}

}  // namespace tokenmeter::daemon
