// Single-producer single-consumer ring of 64-bit words holding
// variable-length event records. The producer is the one engine thread that
// owns the ring; the consumer is the client's sender thread.
//
// Positions are monotonically increasing word counts; the slot of position p
// is p & mask. A record never straddles the end of the array: when it would,
// the producer first writes a padding record that covers the rest, and
// publishes both at once.
#ifndef TOKENMETER_CLIENT_LIB_SRC_RING_H_
#define TOKENMETER_CLIENT_LIB_SRC_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tokenmeter/protocol.h"

namespace tokenmeter::client {

// Records (words):
//   ARRIVED     hdr(arg=prompt_tokens) t rid... params(max_tokens<<32 | n)
//               [with the 1.1 or 1.2 params (tm_arrived_ex,
//               tm_arrived_params), only when it has a lora, labels, a
//               priority or a trace string:
//                 the extras word (ArrivedExtrasWord(): lengths, flags,
//                 priority)
//                 PackLengths(name_len, value_len) per label
//                 the bytes of lora, name 0, value 0, name 1, ...,
//                 traceparent, tracestate back to back, zero padded to a
//                 word]
//               The encoder tells the two forms apart by the record length.
//   QUEUED, PREEMPTED   hdr t rid...
//   SCHEDULED   hdr(arg=kScheduledInfo when an info word follows) t rid...
//               [PackLengths(cached_tokens, external_tokens)]
//   TOKENS      hdr(arg=n) t rid...
//   FINISHED    hdr(arg=tm_finish_reason) t rid...
//   STEP        hdr(arg=key mask in bits 0-10 | n_pos << 16) t
//               value per key in key order (uint64, kv_usage as double bits)
//               n_pos uint64 positions
//   EXPERT_LOAD hdr(arg=layer) t counts[n]   (n = record length - 2)
//   ADMISSION_REJECTED   hdr(arg=reason_len | kAdmissionIntRid) t [rid...]
//               the reason's bytes, zero padded (a string id: the header's
//               id length; an integer id: the flag; neither: no id); with
//               kAdmissionValueId, arg's low byte is the reason's registered
//               id (value_table.h) and no bytes follow
//   KV_TRANSFER hdr(arg=KvArg(): role, failed, has bytes / blocks, reason
//               and connector lengths) t rid... start [bytes] [blocks]
//               the bytes of reason, zero padded to a word, then those of
//               connector, zero padded (kKvReasonId / kKvConnectorId: that
//               field's length is its registered id and it has no bytes;
//               kKvPacked: one amounts word, KvPackedAmounts(), bytes + 1
//               and blocks + 1 in 40 and 24 bits, 0 when not given)
//   SLEEP       hdr(arg=SleepArg(): each part's state + 1, 0 = keep) t
//   REQUEST_SUMMARY   hdr(arg=SummaryArg(): reason, integer id flag, the
//               mask of optional fields given) t [rid...]
//               PackLengths(prompt_tokens, generation_tokens)
//               one word per optional field given, in kSummary* bit order
//               (a string id: the header's id length; an integer id: the
//               flag; neither: no id)
//   LATENCIES   hdr(arg=LatenciesArg(): n_ttft, the mask of counts given) t
//               one word per count given, in kLat* bit order
//               ttft[n_ttft] itl[...]   (n_itl = what the record has left)
// `rid...` is one word for an integer id, ceil(len / 8) words of bytes for a
// string id.
//
// Record header word: kind (bits 0-7, 0 = padding), record length in words
// (bits 8-23, including the header), request-id string length in bytes
// (bits 24-31, 0 = integer id), and a 32-bit kind-specific argument
// (bits 32-63).
inline constexpr uint64_t MakeHeader(uint8_t kind, uint32_t words,
                                     uint32_t rid_len, uint32_t arg) {
  return uint64_t{kind} | (uint64_t{words} << 8) | (uint64_t{rid_len} << 24) |
         (uint64_t{arg} << 32);
}
inline constexpr uint8_t HeaderKind(uint64_t h) { return h & 0xff; }
inline constexpr uint32_t HeaderWords(uint64_t h) { return (h >> 8) & 0xffff; }
inline constexpr uint32_t HeaderRidLen(uint64_t h) { return (h >> 24) & 0xff; }
inline constexpr uint32_t HeaderArg(uint64_t h) { return h >> 32; }

// Two 32-bit lengths in one word (the low one first), for the records'
// length words.
inline constexpr uint64_t PackLengths(uint32_t low, uint32_t high) {
  return uint64_t{low} | (uint64_t{high} << 32);
}

// The ARRIVED extras word: lora length (bits 0-7), label count (bits
// 8-15), tracestate length (bits 16-24), flags (tracestate, traceparent,
// priority given) and the priority's 32 bits (bits 32-63).
inline constexpr uint64_t kExtraTracestate = uint64_t{1} << 25;
inline constexpr uint64_t kExtraTraceparent = uint64_t{1} << 26;
inline constexpr uint64_t kExtraPriority = uint64_t{1} << 27;
inline constexpr uint64_t ArrivedExtrasWord(uint32_t lora_len,
                                            uint32_t n_labels,
                                            uint32_t tracestate_len,
                                            uint64_t flags, int32_t priority) {
  return uint64_t{lora_len} | (uint64_t{n_labels} << 8) |
         (uint64_t{tracestate_len} << 16) | flags |
         (uint64_t{static_cast<uint32_t>(priority)} << 32);
}
inline constexpr uint32_t ExtrasLoraLen(uint64_t w) { return w & 0xff; }
inline constexpr uint32_t ExtrasLabels(uint64_t w) { return (w >> 8) & 0xff; }
inline constexpr uint32_t ExtrasTracestateLen(uint64_t w) {
  return (w >> 16) & 0x1ff;
}
inline constexpr int32_t ExtrasPriority(uint64_t w) {
  return static_cast<int32_t>(static_cast<uint32_t>(w >> 32));
}
static_assert(TM_MAX_LORA_BYTES <= 0xff && TM_MAX_REQUEST_LABELS <= 0xff &&
              TM_MAX_TRACESTATE_BYTES <= 0x1ff);

// SCHEDULED: an info word follows the id.
inline constexpr uint32_t kScheduledInfo = 1;

// ADMISSION_REJECTED: the reason's length (bits 0-7) and whether an integer
// id follows the time.
inline constexpr uint32_t kAdmissionIntRid = 1u << 8;
// ADMISSION_REJECTED: bits 0-7 are the reason's registered id, not a length.
inline constexpr uint32_t kAdmissionValueId = 1u << 9;

// KV_TRANSFER header argument.
inline constexpr uint32_t kKvRecv = 1u << 0;
inline constexpr uint32_t kKvFailed = 1u << 1;
inline constexpr uint32_t kKvBytes = 1u << 2;
inline constexpr uint32_t kKvBlocks = 1u << 3;
inline constexpr uint32_t kKvReasonId = 1u << 4;  // reason: an id, no bytes
inline constexpr uint32_t kKvConnectorId = 1u << 5;
// One amounts word follows start, KvPackedAmounts(): bytes + 1 in its low
// 40 bits, blocks + 1 in its high 24, 0 for one not given (instead of
// kKvBytes / kKvBlocks and a word for each given, when both fit: bytes
// below 2^40 - 1, blocks below 2^24 - 1, or not given).
inline constexpr uint32_t kKvPacked = 1u << 7;
inline constexpr int kKvPackedBytesBits = 40;
inline constexpr uint64_t kKvPackedBytesMask =
    (uint64_t{1} << kKvPackedBytesBits) - 1;
// bytes1 / blocks1: the amount + 1 (TM_KV_UNKNOWN wraps to 0).
inline constexpr bool KvAmountsFitPacked(uint64_t bytes1, uint64_t blocks1) {
  return ((bytes1 >> kKvPackedBytesBits) |
          (blocks1 >> (64 - kKvPackedBytesBits))) == 0;
}
inline constexpr uint64_t KvPackedAmounts(uint64_t bytes1, uint64_t blocks1) {
  return bytes1 | (blocks1 << kKvPackedBytesBits);
}
inline constexpr uint32_t KvArg(uint32_t flags, uint32_t reason_len,
                                uint32_t connector_len) {
  return flags | (reason_len << 8) | (connector_len << 16);
}
inline constexpr uint32_t KvReasonLen(uint32_t arg) {
  return (arg >> 8) & 0xff;
}
inline constexpr uint32_t KvConnectorLen(uint32_t arg) {
  return (arg >> 16) & 0xff;
}
static_assert(TM_MAX_LABEL_VALUE_BYTES <= 0xff);

// SLEEP header argument: 2 bits per part (scheduler, weights, kv_cache),
// each the tm_*_state value + 1 (0: keep).
inline constexpr uint32_t SleepArg(int scheduler, int weights, int kv_cache) {
  return uint32_t(scheduler + 1) | (uint32_t(weights + 1) << 2) |
         (uint32_t(kv_cache + 1) << 4);
}

// REQUEST_SUMMARY header argument: the tm_finish_reason (bits 0-1), an
// integer id follows the time (bit 2), and the optional fields given
// (bits 3-13, kSummary* << kSummaryMaskShift), their words in bit order.
inline constexpr uint32_t kSummaryIntRid = 1u << 2;
inline constexpr int kSummaryMaskShift = 3;
inline constexpr uint32_t kSummaryCached = 1u << 0;
inline constexpr uint32_t kSummaryMaxTokens = 1u << 1;
inline constexpr uint32_t kSummaryN = 1u << 2;
inline constexpr uint32_t kSummaryMaxGeneration = 1u << 3;
inline constexpr uint32_t kSummaryTtft = 1u << 4;  // then queue, prefill,
                                                   // decode, inference, e2e,
                                                   // tpot
inline constexpr int kNumSummaryFields = 11;
inline constexpr uint32_t SummaryArg(uint32_t reason, bool int_rid,
                                     uint32_t mask) {
  return reason | (int_rid ? kSummaryIntRid : 0) | (mask << kSummaryMaskShift);
}

// LATENCIES header argument: n_ttft (bits 0-10, <= TM_MAX_LATENCIES) and
// the counts given (bits 11-13: prompt tokens, generation tokens,
// preemptions), their words in bit order after the time.
inline constexpr int kLatCountsShift = 11;
inline constexpr int kNumLatCounts = 3;
inline constexpr uint32_t LatenciesArg(uint32_t n_ttft, uint32_t counts) {
  return n_ttft | (counts << kLatCountsShift);
}
static_assert(TM_MAX_LATENCIES < (1u << kLatCountsShift));

inline constexpr uint8_t kPadKind = 0;
// The largest STEP: header, time, eleven values, 64 positions.
inline constexpr uint32_t kMaxStepWords = 2 + 11 + 64;
// The largest ARRIVED: header, time, a TM_MAX_RID_BYTES id, params, the
// extras word and label lengths, and the longest lora, labels (names up to
// TM_MAX_STRING_BYTES, values up to TM_MAX_REQUEST_LABEL_VALUE_BYTES),
// traceparent and tracestate (2,168 bytes).
inline constexpr uint32_t kMaxArrivedWords =
    2 + TM_MAX_RID_BYTES / 8 + 1 + 1 + TM_MAX_REQUEST_LABELS +
    (TM_MAX_LORA_BYTES +
     TM_MAX_REQUEST_LABELS *
         (TM_MAX_STRING_BYTES + TM_MAX_REQUEST_LABEL_VALUE_BYTES) +
     TM_TRACEPARENT_BYTES + TM_MAX_TRACESTATE_BYTES + 7) /
        8;
static_assert(kMaxArrivedWords * 8 == 2168);  // tokenmeter.h says so
// The largest EXPERT_LOAD: header, time, TM_MAX_MOE_EXPERTS counts (8,208
// bytes).
inline constexpr uint32_t kMaxExpertLoadWords = 2 + TM_MAX_MOE_EXPERTS;
// The largest KV_TRANSFER (296 bytes, tokenmeter.h) and ADMISSION_REJECTED.
inline constexpr uint32_t kMaxKvTransferWords =
    2 + TM_MAX_RID_BYTES / 8 + 3 + (2 * TM_MAX_LABEL_VALUE_BYTES) / 8;
static_assert(kMaxKvTransferWords * 8 == 296);
inline constexpr uint32_t kMaxAdmissionWords =
    2 + TM_MAX_RID_BYTES / 8 + TM_MAX_LABEL_VALUE_BYTES / 8;
static_assert(kMaxKvTransferWords <= kMaxArrivedWords &&
              kMaxAdmissionWords <= kMaxArrivedWords &&
              kMaxStepWords <= kMaxArrivedWords);
// The largest REQUEST_SUMMARY (integer id: 15 words, 120 bytes; a
// TM_MAX_RID_BYTES string id: 30 words) and LATENCIES (header, time, three
// counts, TM_MAX_LATENCIES values: 8,232 bytes, tokenmeter.h).
inline constexpr uint32_t kMaxSummaryWords =
    3 + TM_MAX_RID_BYTES / 8 + kNumSummaryFields;
inline constexpr uint32_t kMaxLatenciesWords =
    2 + kNumLatCounts + TM_MAX_LATENCIES;
static_assert(kMaxLatenciesWords * 8 == 8232);
static_assert(kMaxSummaryWords <= kMaxArrivedWords);
inline constexpr uint32_t kMaxRecordWords =
    kMaxLatenciesWords > kMaxExpertLoadWords
        ? kMaxLatenciesWords
        : (kMaxExpertLoadWords > kMaxArrivedWords ? kMaxExpertLoadWords
                                                  : kMaxArrivedWords);
// The smallest ring (1024 events of capacity: 4096 words) holds any record,
// even behind the padding of a wrap (at most kMaxRecordWords - 1 words), and
// a record's length fits its header's 16 bits.
static_assert(2 * kMaxRecordWords <= 4096);

class Ring {
 public:
  // capacity_words: a power of two, > kMaxRecordWords. Allocates and
  // pre-faults the array; the caller checks ok().
  explicit Ring(size_t capacity_words);
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring();

  bool ok() const { return words_ != nullptr; }

  // Producer: space for `n` words (n <= kMaxRecordWords), or nullptr when
  // the ring is full. The words become visible to the consumer at Commit().
  uint64_t* Reserve(uint32_t n) {
    uint64_t tail = tail_.load(std::memory_order_relaxed);
    uint64_t idx = tail & mask_;
    uint64_t to_end = capacity_ - idx;
    uint64_t need = to_end < n ? to_end + n : n;
    if (tail + need - cached_head_ > capacity_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (tail + need - cached_head_ > capacity_) return nullptr;
    }
    if (to_end < n) {
      words_[idx] = MakeHeader(kPadKind, static_cast<uint32_t>(to_end), 0, 0);
      tail += to_end;
      idx = 0;
    }
    pending_tail_ = tail + n;
    return &words_[idx];
  }
  void Commit() { tail_.store(pending_tail_, std::memory_order_release); }

  // Producer: brackets one event call (tm_client::Enter()/Leave()). The
  // store in BeginCall() is ordered before the caller's next load of the
  // client's state by a compiler barrier only; the closing thread supplies
  // the processor barrier (client.cpp, HeavyFence()). Plain stores on the
  // producer's own line: no read-modify-write.
  void BeginCall() {
    in_call_.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  void EndCall() { in_call_.store(0, std::memory_order_release); }
  // Any thread: whether the producer is inside an event call.
  bool InCall() const { return in_call_.load(std::memory_order_acquire) != 0; }

  // The thread that owns the producer side, as its thread pointer
  // (ThreadPointer(), thread_registry.h), 0 while none. Set by that thread
  // when it attaches and cleared when it lets the ring go; its event calls
  // check it before they use the ring (ThreadSlotCache::Find()).
  void SetProducer(uintptr_t thread) {
    producer_.store(thread, std::memory_order_relaxed);
  }
  uintptr_t producer() const {
    return producer_.load(std::memory_order_relaxed);
  }

  // Producer: one more event thrown away (single writer, so no RMW).
  void CountDrop() {
    dropped_.store(dropped_.load(std::memory_order_relaxed) + 1,
                   std::memory_order_relaxed);
  }

  // Consumer side.
  uint64_t head() const { return head_.load(std::memory_order_relaxed); }
  uint64_t tail() const { return tail_.load(std::memory_order_acquire); }
  const uint64_t* At(uint64_t pos) const { return &words_[pos & mask_]; }
  void Release(uint64_t new_head) {
    head_.store(new_head, std::memory_order_release);
  }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t capacity_words() const { return capacity_; }

 private:
  // Producer-owned line.
  alignas(64) std::atomic<uint64_t> tail_{0};
  uint64_t cached_head_ = 0;
  uint64_t pending_tail_ = 0;
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint32_t> in_call_{0};
  std::atomic<uintptr_t> producer_{0};
  // Consumer-owned line.
  alignas(64) std::atomic<uint64_t> head_{0};
  // Read-only after construction.
  alignas(64) uint64_t* words_ = nullptr;
  uint64_t capacity_;
  uint64_t mask_;
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_RING_H_
