#include "client.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <utility>

#include "clock.h"

using tokenmeter::client::ClientCounters;
using tokenmeter::client::ClientParts;
using tokenmeter::client::NewUnixSocketTransport;
using tokenmeter::client::Ring;
using tokenmeter::client::SenderOptions;
using tokenmeter::client::ThreadSlotCache;
using tokenmeter::client::Transport;

namespace {

// HELLO's session: random, nonzero, one per client. getrandom() without
// GRND_NONBLOCK blocks only before the kernel's pool is first initialised
// (early boot); if it fails (an old kernel, a seccomp filter), the time,
// pid and a per-process counter, mixed (splitmix64), still differ between
// clients.
uint64_t NewSession() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != ssize_t(sizeof v) || v == 0) {
    static std::atomic<uint64_t> counter{0};
    uint64_t z = tokenmeter::client::MonotonicNowNs() ^
                 (uint64_t(getpid()) << 32) ^
                 (counter.fetch_add(1) * 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    v = z ^ (z >> 31);
  }
  return v != 0 ? v : 1;
}

SenderOptions SenderOptionsOf(const tm_options& opts) {
  SenderOptions s;
  s.socket_path = opts.socket_path;
  s.meta = opts.meta;
  s.meta.session = NewSession();
  s.meta.ack = opts.ack;
  s.flush_interval_ms = opts.flush_interval_ms;
  s.close_timeout_ms = opts.close_timeout_ms;
  s.ack = opts.ack;
  s.replay_bytes = opts.replay_bytes;
  return s;
}

std::unique_ptr<Transport> TransportOf(const tm_options& opts) {
  std::unique_ptr<Transport> t =
      opts.make_transport ? opts.make_transport() : NewUnixSocketTransport();
  if (t == nullptr) throw std::bad_alloc();
  return t;
}

// ---- the processor barrier of close
// ------------------------------------------

// How HeavyFence() makes every thread of the process execute a full barrier.
enum class FenceKind { kExpedited, kGlobal, kMprotect };

FenceKind ChooseFence() {
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0,
              0) == 0) {
    return FenceKind::kExpedited;
  }
  const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds > 0 && (cmds & MEMBARRIER_CMD_GLOBAL) != 0) {
    return FenceKind::kGlobal;
  }
  return FenceKind::kMprotect;
}

// The heavy half of an asymmetric Dekker: after it returns, every store
// another thread made before its next compiler barrier (Ring::BeginCall())
// is visible here, and every load that thread makes afterwards sees what
// this thread stored before the call. The light half (the event calls)
// then needs no processor fence. Linux >= 4.14 has the expedited
// membarrier (microseconds); the global one waits for a grace period
// (milliseconds); without membarrier (a seccomp filter), changing a page's
// protection makes the kernel interrupt every CPU that runs this process
// (the TLB shootdown), which is a barrier on each.
void HeavyFence() {
  static const FenceKind kind = ChooseFence();
  switch (kind) {
    case FenceKind::kExpedited:
      if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) ==
          0) {
        return;
      }
      break;
    case FenceKind::kGlobal:
      if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0) return;
      break;
    case FenceKind::kMprotect:
      break;
  }
  static const long page = sysconf(_SC_PAGESIZE);
  static void* const dummy = mmap(nullptr, size_t(page), PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  if (dummy == MAP_FAILED) abort();  // no way to order the close: invariant
  // Touch the page so that it is mapped (and cached in the TLBs of the CPUs
  // running our threads), then take write access away: the kernel flushes
  // those TLBs by interrupting each of them.
  *static_cast<volatile char*>(dummy) = 1;
  mprotect(dummy, size_t(page), PROT_READ);
  mprotect(dummy, size_t(page), PROT_READ | PROT_WRITE);
}

// Waits (yielding) until `done()`; what it waits for ends within a few
// event calls or one attach.
template <typename F>
void YieldUntil(F done) {
  while (!done()) sched_yield();
}

// ---- every client, for fork() and to keep tombstones reachable
// ---------------

// Open clients (the fork handler's list) and closed ones: a tombstone stays
// linked until the process exits, so that leak checkers (LSan, valgrind)
// see it as reachable, which it is: the application may hold it.
std::mutex clients_mu;
tm_client* open_head = nullptr;
tm_client* closed_head = nullptr;

void Link(tm_client** head, tm_client* c) {
  c->prev_ = nullptr;
  c->next_ = *head;
  if (*head != nullptr) (*head)->prev_ = c;
  *head = c;
}

void Unlink(tm_client** head, tm_client* c) {
  if (c->prev_ != nullptr) c->prev_->next_ = c->next_;
  if (c->next_ != nullptr) c->next_->prev_ = c->prev_;
  if (*head == c) *head = c->next_;
  c->prev_ = c->next_ = nullptr;
}

// clients_mu is held across fork() so that the child's lists are whole: no
// client is half linked or half closed in them.
void BeforeFork() { clients_mu.lock(); }
void AfterForkParent() { clients_mu.unlock(); }
void AfterForkChild() {
  while (open_head != nullptr) {
    tm_client* c = open_head;
    Unlink(&open_head, c);
    c->ForgetAfterFork();
    Link(&closed_head, c);
  }
  clients_mu.unlock();
}

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(BeforeFork, AfterForkParent, AfterForkChild);
  });
}

}  // namespace

namespace tokenmeter::client {

ClientParts::ClientParts(const tm_options& opts, ClientCounters& counters,
                         ThreadSlotCache& cache)
    : registry(opts.buffer_capacity, opts.max_threads, counters, cache),
      sender(SenderOptionsOf(opts), TransportOf(opts), registry, values,
             counters) {}

}  // namespace tokenmeter::client

tm_client::tm_client(const tm_options& opts)
    : owned_parts_(
          std::make_unique<ClientParts>(opts, counters_, slot_cache_)) {
  registry_id_ = owned_parts_->registry.id();
  parts_.store(owned_parts_.get(), std::memory_order_release);
}

int tm_client::New(const tm_options& opts, tm_client** out) {
  InstallForkHandlers();
  std::unique_ptr<tm_client> c;
  try {
    c = std::make_unique<tm_client>(opts);
  } catch (...) {
    return TM_E_NOMEM;
  }
  // Started and linked under clients_mu: a fork() sees the client with its
  // sender thread and in the list, or neither.
  std::lock_guard<std::mutex> l(clients_mu);
  const int rc = c->owned_parts_->sender.Start();
  if (rc != TM_OK) return rc;
  Link(&open_head, c.get());
  *out = c.release();
  return TM_OK;
}

int tm_client::Close(uint64_t* stats_out, size_t n) {
  int was = kOpen;
  {
    std::lock_guard<std::mutex> l(clients_mu);
    if (!state_.compare_exchange_strong(was, kClosed)) {
      if (was == kForked) state_.store(kClosed);  // already on closed_head
    } else {
      Unlink(&open_head, this);
      Link(&closed_head, this);
    }
  }
  if (was == kClosed) {
    Stats(stats_out, n);
    return TM_E_CLOSED;
  }
  ClientParts* parts = owned_parts_.get();
  if (was == kForked) {
    // The child of a fork(): no sender thread, and the parent's locks may
    // have been copied held; nothing to send, nothing safe to free. The
    // parts stay (owned_parts_ is never reset), their pages shared with the
    // parent's copy-on-write.
    Stats(stats_out, n);
    final_ring_drops_ = parts->registry.RingDrops();
    parts_.store(nullptr);
    return TM_E_FORKED;
  }
  // Every event call that read kOpen is now seen in its ring's in-call mark
  // (the barrier pairs with Ring::BeginCall()), and every later one reads
  // kClosed and touches nothing but this handle and its own slot. Wait for
  // the attaches, then the calls, then send what they committed.
  HeavyFence();
  YieldUntil([this] { return attaching_.load() == 0; });
  const uint32_t slots = parts->registry.size();
  for (uint32_t i = 0; i < slots; ++i) {
    const Ring& r = parts->registry.slot(i)->ring;
    YieldUntil([&r] { return !r.InCall(); });
  }
  const uint64_t given_up = parts->sender.Stop();
  const uint64_t unacked = parts->sender.unacked_at_close();
  // Stop() woke any flush; wait for the flush and stats calls to leave the
  // parts, then free them. Threads keep only their slots (reference
  // counted) and this handle.
  final_ring_drops_ = parts->registry.RingDrops();
  parts_.store(nullptr);
  YieldUntil([this] { return callers_.load() == 0; });
  owned_parts_.reset();
  Stats(stats_out, n);
  return given_up == 0 && unacked == 0 ? TM_OK : TM_E_TIMEOUT;
}

void tm_client::ForgetAfterFork() {
  state_.store(kForked, std::memory_order_relaxed);
  owned_parts_->sender.ForgetAfterFork();
}

int tm_client::Flush(uint32_t timeout_ms) {
  callers_.fetch_add(1);
  const int state = state_.load();
  int rc = state == kForked ? TM_E_FORKED : TM_E_CLOSED;
  ClientParts* parts = Parts();
  if (state == kOpen && parts != nullptr) rc = parts->sender.Flush(timeout_ms);
  callers_.fetch_sub(1, std::memory_order_release);
  return rc;
}

int tm_client::RegisterValue(const char* value) {
  callers_.fetch_add(1);
  const int state = state_.load();
  int rc = state == kForked ? TM_E_FORKED : TM_E_CLOSED;
  ClientParts* parts = Parts();
  if (state == kOpen && parts != nullptr) {
    rc = parts->values.Register(value, &value_ids_);
  }
  callers_.fetch_sub(1, std::memory_order_release);
  return rc;
}

int tm_client::Attach() {
  Ring* ring = nullptr;
  const int rc = Enter(&ring, 0);
  if (rc == TM_OK) Leave(ring);
  return rc;
}

int tm_client::EnterSlow(Ring** ring, uint64_t events) {
  tokenmeter::client::ThreadSlot* slot = slot_cache_.FindSlow(registry_id_);
  if (slot == nullptr) return AttachRing(ring, events);
  return EnterSlot(slot, ring, events);
}

int tm_client::AttachRing(Ring** ring, uint64_t events) {
  attaching_.fetch_add(1);
  const int state = state_.load();
  int rc = TM_OK;
  Ring* r = nullptr;
  if (state != kOpen) {
    rc = Refuse(state, events);
  } else {
    // tm_thread_attach() (events == 0) drops nothing when it finds no slot.
    r = owned_parts_->registry.AttachSlow(/*count_drop=*/events > 0);
    if (r == nullptr) {
      rc = TM_E_DROPPED;
    } else {
      r->BeginCall();  // before attaching_ drops: Close() scans the slots
      *ring = r;
    }
  }
  attaching_.fetch_sub(1, std::memory_order_release);
  return rc;
}

int tm_client::Stats(uint64_t* out, size_t n) const {
  if (out == nullptr && n > 0) return TM_E_INVALID;
  callers_.fetch_add(1);
  const ClientParts* parts = Parts();
  const uint64_t ring_drops =
      parts != nullptr ? parts->registry.RingDrops() : final_ring_drops_;
  callers_.fetch_sub(1, std::memory_order_release);
  const uint64_t dropped =
      counters_.dropped_extra.load(std::memory_order_relaxed) + ring_drops;
  const uint64_t all[TM_STAT_COUNT] = {
      counters_.sent.load(std::memory_order_relaxed),
      dropped,
      counters_.rejected.load(std::memory_order_relaxed),
      counters_.reconnects.load(std::memory_order_relaxed),
      counters_.batches.load(std::memory_order_relaxed),
      counters_.bytes.load(std::memory_order_relaxed),
      counters_.connected.load(std::memory_order_relaxed),
      counters_.connect_failures.load(std::memory_order_relaxed),
      counters_.replayed.load(std::memory_order_relaxed),
      counters_.unacked.load(std::memory_order_relaxed),
      counters_.discarded.load(std::memory_order_relaxed),
      counters_.fields_dropped.load(std::memory_order_relaxed),
  };
  for (size_t i = 0; i < n && i < TM_STAT_COUNT; ++i) out[i] = all[i];
  return TM_OK;
}
