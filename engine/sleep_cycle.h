// SleepCycle: the engine's one sleep/wake cycle (--sleep-after S
// --wake-after W, docs/engine.md "Sleep mode") as a state machine of
// times, so that the engine loop only asks it what to do now.
//
//   kAwake --(now >= start + S)--> kPausing   the scheduler admits nobody
//   kPausing --(no KV pull in flight)--> kAsleep   Sleep: preempt everything,
//                                                 release the KV cache
//   kAsleep --(now >= slept + W)--> kWoken    Wake: restore the cache, resume
//
// kWoken is final: one cycle per run. Times are CLOCK_MONOTONIC ns. Not
// thread-safe; O(1) everything.
#ifndef TOKENMETER_ENGINE_SLEEP_CYCLE_H_
#define TOKENMETER_ENGINE_SLEEP_CYCLE_H_

#include <cstdint>

namespace tokenmeter::engine {

class SleepCycle {
 public:
  enum class Phase : uint8_t { kOff, kAwake, kPausing, kAsleep, kWoken };
  enum class Action : uint8_t { kNone, kSleep, kWake };

  // Off (never sleeps) unless enabled.
  SleepCycle() = default;
  SleepCycle(uint64_t start_ns, uint64_t sleep_after_ns, uint64_t wake_after_ns)
      : phase_(Phase::kAwake),
        sleep_at_ns_(start_ns + sleep_after_ns),
        wake_after_ns_(wake_after_ns) {}

  // Advances with the clock; returns what the engine must do now. A
  // kSleep comes only with no KV pull in flight; the wake time counts from
  // that call's now_ns.
  Action Poll(uint64_t now_ns, bool pulls_in_flight) {
    if (phase_ == Phase::kAwake && now_ns >= sleep_at_ns_) {
      phase_ = Phase::kPausing;
    }
    if (phase_ == Phase::kPausing && !pulls_in_flight) {
      phase_ = Phase::kAsleep;
      slept_ns_ = now_ns;
      return Action::kSleep;
    }
    if (phase_ == Phase::kAsleep && now_ns >= slept_ns_ + wake_after_ns_) {
      phase_ = Phase::kWoken;
      woke_ns_ = now_ns;
      return Action::kWake;
    }
    return Action::kNone;
  }

  // The engine fell asleep at `t_ns` (after the kSleep's work: preempting,
  // releasing the cache), the time it reports: the wake counts from it, so
  // that the time reported asleep is never short of the delay.
  void AsleepSince(uint64_t t_ns) {
    if (phase_ == Phase::kAsleep && t_ns > slept_ns_) slept_ns_ = t_ns;
  }

  // The scheduler must not admit waiting requests.
  bool paused() const {
    return phase_ == Phase::kPausing || phase_ == Phase::kAsleep;
  }
  // Nothing may run (the KV cache is released).
  bool asleep() const { return phase_ == Phase::kAsleep; }
  // When Poll() next has something to do on its own (0: never, or it
  // waits for the pulls in flight).
  uint64_t next_deadline_ns() const {
    if (phase_ == Phase::kAwake) return sleep_at_ns_;
    if (phase_ == Phase::kAsleep) return slept_ns_ + wake_after_ns_;
    return 0;
  }
  Phase phase() const { return phase_; }
  uint64_t slept_ns() const { return slept_ns_; }
  uint64_t woke_ns() const { return woke_ns_; }

 private:
  Phase phase_ = Phase::kOff;
  uint64_t sleep_at_ns_ = 0;
  uint64_t wake_after_ns_ = 0;
  uint64_t slept_ns_ = 0, woke_ns_ = 0;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_SLEEP_CYCLE_H_
