// The largest snapshot (daemon/state/snapshot.h) a daemon with a given
// configuration writes: LoadSnapshot() sets a larger file aside unread, so
// a planted or runaway file (a 2 GiB sparse one, say) costs a stat, not
// gigabytes of memory and seconds of start-up. docs/operations.md ("Who can
// reach what") gives the formula and the figures at the default caps.
//
// The bound follows the encoders term by term from the caps: per engine
// series (--max-engine-series) its identity and labels, every counter,
// gauge, own-label child and histogram (classic buckets of the configured
// layouts, native buckets at NativeHistogram::kMaxBuckets), its request-
// label cells (the combinations --request-label-values allows), its
// admitted values and parts; per request (--max-requests) one tracker
// record with the longest request id; the shared spaces and sessions; the
// request-label tables; the clients' drop counts; the MoE layers of all
// series (--max-moe-layers) and their expert counts. One term depends on
// what engines send rather than on a cap, and gets a documented allowance
// instead: LoRA adapter sets (kLoraSetsAllowance per series). A daemon
// whose snapshot passes the bound logs it once (Snapshotter), so an
// allowance that proves short is seen, not silently set aside.
#ifndef TOKENMETER_DAEMON_SNAPSHOT_BOUND_H_
#define TOKENMETER_DAEMON_SNAPSHOT_BOUND_H_

#include <cstdint>

#include "daemon/config.h"
#include "daemon/state/snapshot.h"
#include "daemon/store/registry.h"
#include "tokenmeter/protocol.h"

namespace tokenmeter::daemon {

// One MoE layer as MoePart::SaveState() writes it without its per-expert
// counts (index, expert count, whether counts follow, routed, imbalance,
// has_imbalance); --max-moe-layers caps the layers of all series, and with
// --moe-expert-series each kept expert count (8 bytes) is an engine series
// toward --max-engine-series.
inline constexpr uint64_t kMoeLayerBytes = 4 + 4 + 1 + 8 + 8 + 1;
// LoRA adapters with running or waiting requests, per series.
inline constexpr uint64_t kLoraSetsAllowance = 256;

struct SnapshotBound {
  uint64_t per_series = 0;   // one engine series at its caps
  uint64_t per_request = 0;  // one tracker record
  uint64_t fixed = 0;        // everything counted once
  uint64_t total = 0;        // fixed + the caps times the above (saturating)
};

// The bound for `config`, whose histogram layouts `registry` holds, and
// the fingerprint the snapshot carries. Pure arithmetic over the layouts
// (microseconds); any thread; never fails (a product past 2^64 saturates).
SnapshotBound MaxSnapshotBytes(const Config& config, const Registry& registry,
                               const SnapshotFingerprint& fp);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_SNAPSHOT_BOUND_H_
