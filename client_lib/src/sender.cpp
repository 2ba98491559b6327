#include "sender.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "clock.h"

namespace tokenmeter::client {
namespace {

constexpr uint64_t kMs = 1000000;

uint64_t NowNs() { return MonotonicNowNs(); }

}  // namespace

Sender::Sender(SenderOptions opts, std::unique_ptr<Transport> transport,
               ThreadRegistry& registry, const ValueTable& values,
               ClientCounters& counters)
    : opts_(std::move(opts)),
      transport_(std::move(transport)),
      registry_(registry),
      values_(values),
      counters_(counters),
      replay_(opts_.ack ? opts_.replay_bytes : 0),
      inbound_(kInboundReadBytes) {
  // A batch ends once its body reaches kBatchMaxBytes, so it may exceed
  // that by one event: at most about 9.3 KB (a LATENCIES of 1024 values of
  // 9 bytes each; an EXPERT_LOAD of 1024 counts of 5 bytes is 5.2 KB).
  batch_body_.Reserve(kBatchMaxBytes + 10240);
}

Sender::~Sender() {
  Stop();
  transport_->Close();
  if (wake_fd_ >= 0) close(wake_fd_);
}

int Sender::Start() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return TM_E_SYSTEM;
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (...) {
    return TM_E_SYSTEM;
  }
  return TM_OK;
}

void Sender::Wake() {
  uint64_t one = 1;
  // A full eventfd counter still wakes the reader; nothing to handle.
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
}

int Sender::Flush(uint32_t timeout_ms) {
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

uint64_t Sender::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return 0;
    stopped_ = true;
    closing_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  return close_dropped_;
}

void Sender::ForgetAfterFork() {
  transport_->Close();
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

uint64_t Sender::DroppedTotal() const {
  return counters_.dropped_extra.load(std::memory_order_relaxed) +
         registry_.RingDrops() +
         counters_.rejected.load(std::memory_order_relaxed);
}

// ---- connection
// --------------------------------------------------------------

bool Sender::TryConnect(uint64_t now_ns) {
  if (transport_->Connect(opts_.socket_path) == 0) {
    OnConnected(now_ns);
    return true;
  }
  counters_.connect_failures.fetch_add(1, std::memory_order_relaxed);
  backoff_ns_ = std::clamp(backoff_ns_ * 2, kBackoffMinNs, kBackoffMaxNs);
  next_attempt_ns_ = now_ns + backoff_ns_;
  return false;
}

void Sender::OnConnected(uint64_t now_ns) {
  connected_ = true;
  counters_.connected.store(1, std::memory_order_relaxed);
  if (ever_connected_) {
    counters_.reconnects.fetch_add(1, std::memory_order_relaxed);
  }
  ever_connected_ = true;
  connected_at_ns_ = now_ns;
  // Without ack, seq counts per connection; with it, per client, and what
  // the daemon has not acked goes again, first, once its answer to HELLO
  // says what that is.
  if (!opts_.ack) seq_ = 0;
  ack_mode_ = opts_.ack ? AckMode::kAwaiting : AckMode::kOff;
  answer_deadline_ns_ = now_ns + kAnswerWaitNs;
  replay_.Rewind();
  replayed_oldest_ = false;
  acks_.Reset();
  out_.Clear();
  out_off_ = 0;
  out_batch_events_ = 0;
  out_replay_ = false;
  EncodeHello(opts_.meta, &out_);
}

void Sender::Disconnect(uint64_t now_ns) {
  transport_->Close();
  connected_ = false;
  counters_.connected.store(0, std::memory_order_relaxed);
  CountReplayRefusal(now_ns);
  // A batch that was not completely written stays in batch_body_ and is sent
  // whole, with a fresh header, on the next connection: the daemon discards
  // the truncated frame it saw.
  out_.Clear();
  out_off_ = 0;
  out_batch_events_ = 0;
  out_replay_ = false;
  if (now_ns - connected_at_ns_ >= kStableConnectionNs) {
    backoff_ns_ = kBackoffMinNs;
  } else {
    backoff_ns_ = std::clamp(backoff_ns_ * 2, kBackoffMinNs, kBackoffMaxNs);
  }
  next_attempt_ns_ = now_ns + backoff_ns_;
}

// At a disconnect: a short connection that replayed the oldest kept batch
// and broke before it was acked counts one refusal of that batch; the
// kMaxReplayRefusals-th in a row drops it (dropped_total). Anything else
// (a long connection, the batch acked, another oldest batch) starts over.
void Sender::CountReplayRefusal(uint64_t now_ns) {
  ReplayBuffer::Entry oldest;
  const bool refused = ack_mode_ == AckMode::kAcking && replayed_oldest_ &&
                       now_ns - connected_at_ns_ < kStableConnectionNs &&
                       replay_.Oldest(&oldest) && oldest.seq == replayed_seq_;
  replayed_oldest_ = false;
  if (!refused) {
    refusals_ = 0;
    return;
  }
  if (refusals_ == 0 || oldest.seq != refused_seq_) {
    refused_seq_ = oldest.seq;
    refusals_ = 0;
  }
  if (++refusals_ < kMaxReplayRefusals) return;
  refusals_ = 0;
  const uint64_t events = replay_.PopOldest();
  counters_.dropped_extra.fetch_add(events, std::memory_order_relaxed);
}

bool Sender::ReadInbound() {
  for (int i = 0; i < kMaxReadsPerWake; ++i) {
    const IoResult r = transport_->Read(inbound_.data(), inbound_.size());
    switch (r.status) {
      case IoResult::Status::kAgain:
        return true;
      case IoResult::Status::kOk:
        if (!OnInbound(inbound_.data(), r.bytes)) return false;
        break;
      case IoResult::Status::kEof:
      case IoResult::Status::kError:
        return false;
    }
  }
  return true;
}

void Sender::AwaitFinalAcks() {
  if (!opts_.ack) return;
  const int fd = transport_->fd();
  const uint64_t deadline_ns = NowNs() + kFinalAckWaitNs;
  // ReadInbound() is false at the close (EOF), an error or a bad byte.
  while (ReadInbound() && fd >= 0) {
    const uint64_t now_ns = NowNs();
    if (now_ns >= deadline_ns) return;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int((deadline_ns - now_ns + kMs - 1) / kMs)) <= 0) return;
  }
}

bool Sender::OnInbound(const uint8_t* data, size_t n) {
  // Without `ack` in HELLO the daemon must never write to this client; with
  // it, only ACK frames. Other bytes mean a peer we do not understand:
  // closing (and the backoff that follows) is what keeps a chatty peer
  // from making this thread spin.
  if (!opts_.ack) return false;
  uint64_t acked = 0;
  bool any = false;
  const uint64_t frames = acks_.frames();
  // The ACKs before a bad byte are the daemon's word all the same.
  const bool ok = acks_.Feed(data, n, &acked, &any);
  if (any) replay_.Release(acked);
  // The first frame is the answer to HELLO: this daemon acks. An answer
  // after the deadline changes nothing (nothing was kept since).
  if (ack_mode_ == AckMode::kAwaiting && acks_.frames() > frames) {
    ack_mode_ = AckMode::kAcking;
  }
  return ok;
}

void Sender::GiveUpOnAnswer() {
  ack_mode_ = AckMode::kNotAcking;
  // Replaying them could count them twice; they were written once.
  const uint64_t events = replay_.Clear();
  counters_.discarded.fetch_add(events, std::memory_order_relaxed);
}

// ---- batches
// -----------------------------------------------------------------

bool Sender::FillBatch() {
  const uint32_t n = registry_.size();
  for (uint32_t i = 0; i < n; ++i) {
    Ring& r = registry_.slot(i)->ring;
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
      EncodeEvent(rec, values_, &batch_body_);
      ++batch_events_;
    }
    r.Release(head);
  }
  return false;
}

void Sender::PrepareBatchFrame() {
  // out_ holds at most a HELLO that is already queued; the batch frame
  // follows it.
  EncodeBatchHeader(seq_, DroppedTotal(), batch_events_, &out_);
  out_.Append(batch_body_.data(), batch_body_.size());
  out_batch_events_ = batch_events_;
  out_replay_ = false;
  out_seq_ = seq_;
}

void Sender::PrepareReplayFrame() {
  ReplayBuffer::Entry e;
  if (!replay_.Current(&e)) return;
  EncodeBatchHeader(e.seq, DroppedTotal(), e.events, &out_);
  out_.Append(e.body, e.size);
  out_batch_events_ = e.events;
  out_replay_ = true;
  out_seq_ = e.seq;
}

bool Sender::WritePending() {
  while (out_off_ < out_.size()) {
    const IoResult w =
        transport_->Write(out_.data() + out_off_, out_.size() - out_off_);
    if (w.status == IoResult::Status::kAgain) return true;
    if (w.status != IoResult::Status::kOk) return false;
    out_off_ += w.bytes;
    counters_.bytes.fetch_add(uint64_t(w.bytes), std::memory_order_relaxed);
  }
  // Everything queued reached the transport.
  if (out_batch_events_ > 0) OnBatchWritten();
  out_.Clear();
  out_off_ = 0;
  return true;
}

void Sender::OnBatchWritten() {
  if (out_replay_) {
    counters_.replayed.fetch_add(1, std::memory_order_relaxed);
    ReplayBuffer::Entry oldest;
    if (replay_.Oldest(&oldest) && oldest.seq == out_seq_) {
      replayed_oldest_ = true;
      replayed_seq_ = out_seq_;
    }
    replay_.AdvancePast(out_seq_);
    out_replay_ = false;
    out_batch_events_ = 0;
    return;
  }
  counters_.sent.fetch_add(out_batch_events_, std::memory_order_relaxed);
  counters_.batches.fetch_add(1, std::memory_order_relaxed);
  if (ack_mode_ == AckMode::kAwaiting || ack_mode_ == AckMode::kAcking) {
    const uint64_t dropped = replay_.Push(
        seq_, batch_events_, batch_body_.data(), batch_body_.size());
    if (dropped > 0) {
      counters_.dropped_extra.fetch_add(dropped, std::memory_order_relaxed);
    }
  }
  ++seq_;
  batch_body_.Clear();
  batch_events_ = 0;
  out_batch_events_ = 0;
}

bool Sender::SendBatches(uint64_t now_ns) {
  bool more = false;
  // Before the answer to HELLO: no replay, and a new batch only after the
  // kept ones and only if it is kept without dropping one (a daemon that
  // does not ack would make that a loss counted as a drop). HELLO itself
  // goes out either way.
  const bool awaiting = ack_mode_ == AckMode::kAwaiting;
  for (;;) {
    if (out_batch_events_ == 0 && replay_.replay_pending()) {
      if (!awaiting) {
        PrepareReplayFrame();
        more = true;
      }
    } else if (out_batch_events_ == 0) {
      more = FillBatch();
      if (batch_events_ > 0 &&
          (!awaiting || replay_.FitsWithoutDropping(batch_body_.size()))) {
        PrepareBatchFrame();
      } else if (batch_events_ > 0) {
        more = false;  // held until the answer or the deadline
      }
    } else {
      // A batch left over from a full transport: once it is written, the
      // rings may hold more than one flush interval's worth.
      more = true;
    }
    if (out_.size() == 0) break;
    if (!WritePending()) {
      AwaitFinalAcks();
      Disconnect(now_ns);
      break;
    }
    if (out_.size() != 0) break;  // transport full; wait for POLLOUT
    if (!more) break;
  }
  return more;
}

// ---- the thread
// --------------------------------------------------------------

void Sender::TakeRequests(uint64_t now_ns, bool* closing,
                          uint64_t* close_deadline_ns, bool* flush_active) {
  std::lock_guard<std::mutex> l(mu_);
  if (closing_ && !*closing) {
    *closing = true;
    *close_deadline_ns = now_ns + uint64_t{opts_.close_timeout_ms} * kMs;
  }
  if (flush_requested_ > flush_ticket_) {
    flush_ticket_ = flush_requested_;
    *flush_active = true;
    const uint32_t n = registry_.size();
    flush_targets_.assign(n, 0);
    for (uint32_t i = 0; i < n; ++i) {
      flush_targets_[i] = registry_.slot(i)->ring.tail();
    }
  }
}

bool Sender::AllDelivered() const {
  return out_.size() == 0 && batch_events_ == 0 && registry_.RingsEmpty() &&
         replay_.empty();
}

bool Sender::FlushDone(int* result) const {
  *result = TM_OK;
  if (!connected_) {
    *result = TM_E_DISCONNECTED;
    return true;
  }
  if (out_.size() != 0 || batch_events_ != 0) return false;
  for (size_t i = 0; i < flush_targets_.size(); ++i) {
    if (registry_.slot(uint32_t(i))->ring.head() < flush_targets_[i]) {
      return false;
    }
  }
  return true;
}

void Sender::Run() {
  bool closing = false;
  uint64_t close_deadline_ns = 0;
  bool flush_active = false;
  for (;;) {
    const uint64_t now = NowNs();
    TakeRequests(now, &closing, &close_deadline_ns, &flush_active);
    registry_.RecycleOrphans();
    if (!connected_ && now >= next_attempt_ns_) TryConnect(now);
    if (connected_ && ack_mode_ == AckMode::kAwaiting &&
        now >= answer_deadline_ns_) {
      GiveUpOnAnswer();
    }

    const bool more = connected_ && SendBatches(now);

    int result = TM_OK;
    if (flush_active && FlushDone(&result)) {
      flush_active = false;
      std::lock_guard<std::mutex> l(mu_);
      flush_done_ = flush_ticket_;
      flush_result_ = result;
      cv_.notify_all();
    }

    if (closing && (AllDelivered() || now >= close_deadline_ns)) break;

    // Sleep until the flush interval, a reconnect attempt, a wake-up, the
    // transport taking bytes again, or bytes (or a close) from the peer.
    uint64_t wait_ns = uint64_t{opts_.flush_interval_ms} * kMs;
    if (more && out_.size() == 0) wait_ns = 0;
    if (!connected_) {
      wait_ns = next_attempt_ns_ > now ? next_attempt_ns_ - now : 0;
    } else if (ack_mode_ == AckMode::kAwaiting) {
      wait_ns = std::min(wait_ns, answer_deadline_ns_ > now
                                      ? answer_deadline_ns_ - now
                                      : uint64_t{0});
    }
    if (closing) {
      wait_ns = std::min<uint64_t>(wait_ns, 10 * kMs);
      if (close_deadline_ns > now) {
        wait_ns = std::min(wait_ns, close_deadline_ns - now);
      }
    }
    pollfd pfd[2] = {{wake_fd_, POLLIN, 0}, {transport_->fd(), POLLIN, 0}};
    if (connected_ && out_.size() != 0) pfd[1].events |= POLLOUT;
    const int nfds = connected_ ? 2 : 1;
    const int timeout_ms = int((wait_ns + kMs - 1) / kMs);
    if (poll(pfd, nfds, timeout_ms) > 0) {
      if (pfd[0].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof v);
      }
      if (nfds == 2 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
          !ReadInbound()) {
        Disconnect(NowNs());
      }
    }
  }

  if (connected_ && out_.size() == 0) {
    EncodeGoodbye(&out_);
    WritePending();
    transport_->Shutdown();
  }
  if (connected_) {
    transport_->Close();
    connected_ = false;
    counters_.connected.store(0, std::memory_order_relaxed);
  }
  close_dropped_ = registry_.CountBufferedEvents() + batch_events_;
  counters_.dropped_extra.fetch_add(close_dropped_, std::memory_order_relaxed);
  // Written but not acked: delivered, maybe not durable; not dropped.
  close_unacked_ = replay_.events();
  counters_.unacked.store(close_unacked_, std::memory_order_relaxed);
  std::lock_guard<std::mutex> l(mu_);
  sender_done_ = true;
  cv_.notify_all();
}

}  // namespace tokenmeter::client
