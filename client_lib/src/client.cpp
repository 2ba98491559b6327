#include "client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tokenmeter::client {
namespace {

constexpr uint32_t kBatchMaxEvents = 4096;
constexpr size_t kBatchMaxBytes = 256 * 1024;
constexpr uint64_t kMs = 1000000;
constexpr uint64_t kBackoffMinNs = 10 * kMs;
constexpr uint64_t kBackoffMaxNs = 1000 * kMs;
// A connection that lived at least this long resets the backoff.
constexpr uint64_t kStableConnectionNs = 1000 * kMs;

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// Ids are never reused, so a thread's cache entry can never match a later
// client that happens to live at the same address.
std::atomic<uint64_t> next_client_id{1};

struct TlsEntry {
  uint64_t client_id;
  ThreadSlot* slot;
};
constexpr int kTlsEntries = 8;

// Trivially destructible so that the hot-path lookup needs no TLS guard;
// the reaper below (touched only when attaching) releases the slots when the
// thread exits.
thread_local TlsEntry tls_entries[kTlsEntries];

void ReleaseEntry(TlsEntry& e) {
  e.slot->state.store(ThreadSlot::kOrphaned, std::memory_order_release);
  ThreadSlot::Unref(e.slot);
  e = TlsEntry{0, nullptr};
}

struct TlsReaper {
  ~TlsReaper() {
    for (TlsEntry& e : tls_entries) {
      if (e.slot != nullptr) ReleaseEntry(e);
    }
  }
};
thread_local TlsReaper tls_reaper;

}  // namespace

ThreadSlot* CachedSlot(uint64_t client_id) {
  if (tls_entries[0].client_id == client_id) [[likely]]
    return tls_entries[0].slot;
  for (int i = 1; i < kTlsEntries; ++i) {
    if (tls_entries[i].client_id == client_id) {
      std::swap(tls_entries[0], tls_entries[i]);
      return tls_entries[0].slot;
    }
  }
  return nullptr;
}

}  // namespace tokenmeter::client

// This file implements tm_client, which lives outside the namespace.
using namespace tokenmeter::client;  // NOLINT(google-build-using-namespace)

namespace {
size_t RingWords(size_t capacity_events) {
  // 32 bytes = 4 words per event of capacity.
  size_t words = 1;
  while (words < capacity_events * 4) words <<= 1;
  return words;
}
}  // namespace

tm_client::tm_client(const tm_options& opts)
    : opts_(opts),
      id_(next_client_id.fetch_add(1)),
      ring_words_(RingWords(opts.buffer_capacity)),
      slots_(new std::atomic<ThreadSlot*>[opts.max_threads]) {
  for (uint32_t i = 0; i < opts_.max_threads; ++i) slots_[i] = nullptr;
  batch_body_.Reserve(kBatchMaxBytes + 4096);
}

tm_client::~tm_client() {
  if (sender_.joinable()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      closing_ = true;
    }
    Wake();
    sender_.join();
  }
  const uint32_t n = n_slots_.load();
  for (uint32_t i = 0; i < n; ++i) {
    ThreadSlot* s = slots_[i].load();
    s->client_gone.store(true, std::memory_order_release);
    ThreadSlot::Unref(s);
  }
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

int tm_client::Start() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return TM_E_SYSTEM;
  try {
    sender_ = std::thread([this] { Run(); });
  } catch (...) {
    return TM_E_SYSTEM;
  }
  return TM_OK;
}

void tm_client::Wake() {
  uint64_t one = 1;
  // A full eventfd counter still wakes the reader; nothing to handle.
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
}

Ring* tm_client::AttachSlow(bool count_drop) {
  std::lock_guard<std::mutex> l(mu_);
  // Forget slots of clients that have been closed, and find a free entry.
  TlsEntry* free_entry = nullptr;
  for (TlsEntry& e : tls_entries) {
    if (e.slot != nullptr &&
        e.slot->client_gone.load(std::memory_order_acquire)) {
      ThreadSlot::Unref(e.slot);
      e = TlsEntry{0, nullptr};
    }
    if (e.slot == nullptr && free_entry == nullptr) free_entry = &e;
  }
  ThreadSlot* slot = nullptr;
  if (free_entry != nullptr) {
    const uint32_t n = n_slots_.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < n && slot == nullptr; ++i) {
      ThreadSlot* s = slots_[i].load(std::memory_order_relaxed);
      // A free slot, or one whose thread exited and whose events are all
      // sent: the latter is taken now rather than after the sender's next
      // RecycleOrphans() pass (which may race us to kFree; then retry).
      int state = s->state.load(std::memory_order_acquire);
      while (state == ThreadSlot::kFree || (state == ThreadSlot::kOrphaned &&
                                            s->ring.head() == s->ring.tail())) {
        if (s->state.compare_exchange_weak(state, ThreadSlot::kActive)) {
          slot = s;
          break;
        }
      }
    }
    if (slot == nullptr && n < opts_.max_threads) {
      auto* s = new (std::nothrow) ThreadSlot(ring_words_);
      if (s != nullptr && s->ring.ok()) {
        s->state.store(ThreadSlot::kActive, std::memory_order_relaxed);
        slots_[n].store(s, std::memory_order_release);
        n_slots_.store(n + 1, std::memory_order_release);
        slot = s;
      } else {
        delete s;
      }
    }
  }
  if (slot == nullptr) {
    if (count_drop) dropped_extra_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  slot->refs.fetch_add(1, std::memory_order_relaxed);
  *free_entry = TlsEntry{id_, slot};
  // Registers the thread-exit hook that releases this thread's slots.
  [[maybe_unused]] volatile auto* reaper = &tls_reaper;
  return &slot->ring;
}

uint64_t tm_client::DroppedEvents() const {
  uint64_t total = dropped_extra_.load(std::memory_order_relaxed);
  const uint32_t n = n_slots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    total += slots_[i].load(std::memory_order_relaxed)->ring.dropped();
  }
  return total;
}

uint64_t tm_client::DroppedTotal() const {
  return DroppedEvents() + rejected_.load(std::memory_order_relaxed);
}

int tm_client::Stats(uint64_t* out, size_t n) const {
  if (out == nullptr && n > 0) return TM_E_INVALID;
  const uint64_t all[TM_STAT_COUNT] = {
      sent_.load(std::memory_order_relaxed),
      DroppedEvents(),
      rejected_.load(std::memory_order_relaxed),
      reconnects_.load(std::memory_order_relaxed),
      batches_.load(std::memory_order_relaxed),
      bytes_.load(std::memory_order_relaxed),
      connected_.load(std::memory_order_relaxed),
      connect_failures_.load(std::memory_order_relaxed),
  };
  for (size_t i = 0; i < n && i < TM_STAT_COUNT; ++i) out[i] = all[i];
  return TM_OK;
}

int tm_client::Flush(uint32_t timeout_ms) {
  std::unique_lock<std::mutex> l(mu_);
  if (closing_) return TM_E_INVALID;
  const uint64_t ticket = ++flush_requested_;
  Wake();
  const bool done = cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] {
    return flush_done_ >= ticket || sender_done_;
  });
  if (!done || flush_done_ < ticket) return TM_E_TIMEOUT;
  return flush_result_;
}

int tm_client::Close(uint64_t* stats_out, size_t n) {
  {
    std::lock_guard<std::mutex> l(mu_);
    closing_ = true;
  }
  Wake();
  if (sender_.joinable()) sender_.join();
  if (stats_out != nullptr) Stats(stats_out, n);
  return close_dropped_ == 0 ? TM_OK : TM_E_TIMEOUT;
}

// ---- sender thread ---------------------------------------------------------

bool tm_client::TryConnect(uint64_t now_ns) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, opts_.socket_path.data(),
                opts_.socket_path.size());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      fd_ = fd;
      connected_.store(1, std::memory_order_relaxed);
      if (ever_connected_) reconnects_.fetch_add(1, std::memory_order_relaxed);
      ever_connected_ = true;
      connected_at_ns_ = now_ns;
      seq_ = 0;
      out_.Clear();
      out_off_ = 0;
      out_batch_events_ = 0;
      EncodeHello(opts_.meta, &out_);
      return true;
    }
    close(fd);
  }
  connect_failures_.fetch_add(1, std::memory_order_relaxed);
  backoff_ns_ = std::clamp(backoff_ns_ * 2, kBackoffMinNs, kBackoffMaxNs);
  next_attempt_ns_ = now_ns + backoff_ns_;
  return false;
}

void tm_client::Disconnect(uint64_t now_ns) {
  close(fd_);
  fd_ = -1;
  connected_.store(0, std::memory_order_relaxed);
  // A batch that was not completely written stays in batch_body_ and is sent
  // whole, with a fresh header, on the next connection: the daemon discards
  // the truncated frame it saw.
  out_.Clear();
  out_off_ = 0;
  out_batch_events_ = 0;
  if (now_ns - connected_at_ns_ >= kStableConnectionNs) {
    backoff_ns_ = kBackoffMinNs;
  } else {
    backoff_ns_ = std::clamp(backoff_ns_ * 2, kBackoffMinNs, kBackoffMaxNs);
  }
  next_attempt_ns_ = now_ns + backoff_ns_;
}

bool tm_client::FillBatch() {
  const uint32_t n = n_slots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    ThreadSlot* s = slots_[i].load(std::memory_order_relaxed);
    Ring& r = s->ring;
    uint64_t head = r.head();
    const uint64_t tail = r.tail();
    while (head < tail) {
      if (batch_events_ >= kBatchMaxEvents ||
          batch_body_.size() >= kBatchMaxBytes) {
        r.Release(head);
        return true;
      }
      const uint64_t* rec = r.At(head);
      head += HeaderWords(*rec);
      if (HeaderKind(*rec) == kPadKind) continue;
      EncodeEvent(rec, &batch_body_);
      ++batch_events_;
    }
    r.Release(head);
  }
  return false;
}

void tm_client::PrepareBatchFrame() {
  // out_ holds at most a HELLO that is already queued; the batch frame
  // follows it.
  EncodeBatchHeader(seq_, DroppedTotal(), batch_events_, &out_);
  out_.Append(batch_body_.data(), batch_body_.size());
  out_batch_events_ = batch_events_;
}

bool tm_client::WritePending() {
  while (out_off_ < out_.size()) {
    ssize_t w = send(fd_, out_.data() + out_off_, out_.size() - out_off_,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return false;
    }
    out_off_ += size_t(w);
    bytes_.fetch_add(uint64_t(w), std::memory_order_relaxed);
  }
  // Everything queued reached the socket.
  if (out_batch_events_ > 0) {
    sent_.fetch_add(out_batch_events_, std::memory_order_relaxed);
    batches_.fetch_add(1, std::memory_order_relaxed);
    ++seq_;
    batch_body_.Clear();
    batch_events_ = 0;
    out_batch_events_ = 0;
  }
  out_.Clear();
  out_off_ = 0;
  return true;
}

bool tm_client::RingsEmpty() const {
  const uint32_t n = n_slots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    const Ring& r = slots_[i].load(std::memory_order_relaxed)->ring;
    if (r.head() != r.tail()) return false;
  }
  return true;
}

uint64_t tm_client::CountBufferedEvents() const {
  uint64_t events = 0;
  const uint32_t n = n_slots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    const Ring& r = slots_[i].load(std::memory_order_relaxed)->ring;
    for (uint64_t p = r.head(), tail = r.tail(); p < tail;) {
      const uint64_t* rec = r.At(p);
      if (HeaderKind(*rec) != kPadKind) ++events;
      p += HeaderWords(*rec);
    }
  }
  return events;
}

void tm_client::RecycleOrphans() {
  const uint32_t n = n_slots_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    ThreadSlot* s = slots_[i].load(std::memory_order_relaxed);
    if (s->state.load(std::memory_order_acquire) != ThreadSlot::kOrphaned) {
      continue;
    }
    if (s->ring.head() != s->ring.tail()) continue;
    int expected = ThreadSlot::kOrphaned;
    s->state.compare_exchange_strong(expected, ThreadSlot::kFree);
  }
}

void tm_client::Run() {
  bool closing = false;
  uint64_t close_deadline_ns = 0;
  bool flush_active = false;
  for (;;) {
    uint64_t now = NowNs();
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closing_ && !closing) {
        closing = true;
        close_deadline_ns = now + uint64_t{opts_.close_timeout_ms} * kMs;
      }
      if (flush_requested_ > flush_ticket_) {
        flush_ticket_ = flush_requested_;
        flush_active = true;
        const uint32_t n = n_slots_.load(std::memory_order_acquire);
        flush_targets_.assign(n, 0);
        for (uint32_t i = 0; i < n; ++i) {
          flush_targets_[i] = slots_[i].load()->ring.tail();
        }
      }
    }
    RecycleOrphans();
    if (fd_ < 0 && now >= next_attempt_ns_) TryConnect(now);

    bool more = false;
    if (fd_ >= 0) {
      for (;;) {
        if (out_batch_events_ == 0) {
          more = FillBatch();
          if (batch_events_ > 0) PrepareBatchFrame();
        } else {
          // A batch left over from a full socket: once it is written, the
          // rings may hold more than one flush interval's worth.
          more = true;
        }
        if (out_.size() == 0) break;
        if (!WritePending()) {
          Disconnect(now);
          break;
        }
        if (out_.size() != 0) break;  // socket full; wait for POLLOUT
        if (!more) break;
      }
    }

    if (flush_active) {
      int result = TM_OK;
      bool done = false;
      if (fd_ < 0) {
        result = TM_E_DISCONNECTED;
        done = true;
      } else if (out_.size() == 0 && batch_events_ == 0) {
        done = true;
        for (size_t i = 0; i < flush_targets_.size(); ++i) {
          if (slots_[i].load()->ring.head() < flush_targets_[i]) done = false;
        }
      }
      if (done) {
        flush_active = false;
        std::lock_guard<std::mutex> l(mu_);
        flush_done_ = flush_ticket_;
        flush_result_ = result;
        cv_.notify_all();
      }
    }

    if (closing) {
      const bool empty = out_.size() == 0 && batch_events_ == 0 && RingsEmpty();
      if (empty || now >= close_deadline_ns) break;
    }

    // Sleep until the flush interval, a reconnect attempt, a wake-up, or
    // the socket becoming writable again.
    uint64_t wait_ns = uint64_t{opts_.flush_interval_ms} * kMs;
    if (more && out_.size() == 0) wait_ns = 0;
    if (fd_ < 0) wait_ns = next_attempt_ns_ > now ? next_attempt_ns_ - now : 0;
    if (closing) {
      wait_ns = std::min<uint64_t>(wait_ns, 10 * kMs);
      if (close_deadline_ns > now) {
        wait_ns = std::min(wait_ns, close_deadline_ns - now);
      }
    }
    pollfd pfd[2] = {{wake_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
    if (fd_ >= 0 && out_.size() != 0) pfd[1].events |= POLLOUT;
    const int nfds = fd_ >= 0 ? 2 : 1;
    const int timeout_ms = int((wait_ns + kMs - 1) / kMs);
    if (poll(pfd, nfds, timeout_ms) > 0) {
      if (pfd[0].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof v);
      }
      if (nfds == 2 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
        // The v1 daemon never writes: readable means closed (or a protocol
        // newer than ours); either way, read it off and drop on EOF/error.
        char sink[256];
        ssize_t r = recv(fd_, sink, sizeof sink, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          Disconnect(NowNs());
        }
      }
    }
  }

  if (fd_ >= 0 && out_.size() == 0) {
    EncodeGoodbye(&out_);
    WritePending();
    shutdown(fd_, SHUT_WR);
  }
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
    connected_.store(0, std::memory_order_relaxed);
  }
  close_dropped_ = CountBufferedEvents() + batch_events_;
  dropped_extra_.fetch_add(close_dropped_, std::memory_order_relaxed);
  std::lock_guard<std::mutex> l(mu_);
  sender_done_ = true;
  cv_.notify_all();
}
