#include "engine/kv_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/rng.h"

namespace tokenmeter::engine {
namespace {

constexpr size_t kHeaderBytes = 5;  // uint32 length, uint8 type
constexpr size_t kReadChunk = size_t(256) << 10;

// Reads a frame body's fields in order; any overrun marks it bad.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  T Get() {
    T v{};
    if (size_t(end_ - p_) < sizeof v) {
      bad_ = true;
      return v;
    }
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  std::string String(size_t max) {
    const auto n = Get<uint32_t>();
    if (bad_ || n > max || size_t(end_ - p_) < n) {
      bad_ = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  template <typename T>
  void Array(std::vector<T>* out, size_t count) {
    if (bad_ || size_t(end_ - p_) / sizeof(T) < count) {
      bad_ = true;
      return;
    }
    out->resize(count);
    if (count > 0) std::memcpy(out->data(), p_, count * sizeof(T));
    p_ += count * sizeof(T);
  }
  // Every byte used, none missing.
  bool ok() const { return !bad_ && p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  bool bad_ = false;
};

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

Status Errno(const char* what) {
  return Status::Error(std::string("KV channel: ") + what + ": " +
                       std::strerror(errno));
}

}  // namespace

uint64_t KvChecksum(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ULL ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return Mix64(h);
}

KvChannel::KvChannel(int fd) : fd_(fd) {
  const int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0) fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

KvChannel::~KvChannel() { close(fd_); }

void KvChannel::Put(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out_.insert(out_.end(), b, b + n);
}

void KvChannel::PutString(std::string_view s) {
  PutValue(uint32_t(s.size()));
  Put(s.data(), s.size());
}

void KvChannel::BeginFrame(KvMsgType type, size_t body_bytes) {
  if (body_bytes + 1 > kMaxKvFrameBytes) std::abort();
  // Drop what has been written before growing the buffer.
  if (out_pos_ > 0 && out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  }
  out_.reserve(out_.size() + kHeaderBytes + body_bytes);
  PutValue(uint32_t(body_bytes + 1));
  PutValue(uint8_t(type));
}

void KvChannel::SendHandoff(const KvHandoff& h) {
  const size_t body = 8 + 4 + 4 + 1 + 4 + 4 + 8 + 4 + h.traceparent.size() + 4 +
                      h.prompt.size() * sizeof(int32_t);
  BeginFrame(KvMsgType::kHandoff, body);
  PutValue(h.rid);
  PutValue(h.max_tokens);
  PutValue(h.priority);
  PutValue(uint8_t(h.has_priority));
  PutValue(h.lora);
  PutValue(h.tenant);
  PutValue(h.sampling_seed);
  PutString(h.traceparent);
  PutValue(uint32_t(h.prompt.size()));
  Put(h.prompt.data(), h.prompt.size() * sizeof(int32_t));
}

void KvChannel::SendPull(const KvPull& p) {
  BeginFrame(KvMsgType::kPull, 8 + 4 + 4 + 4);
  PutValue(p.rid);
  PutValue(p.attempt);
  PutValue(p.first_block);
  PutValue(p.num_blocks);
}

void KvChannel::SendKv(const KvPull& which, const float* data, size_t floats,
                       uint64_t checksum) {
  BeginFrame(KvMsgType::kKv, 8 + 4 + 4 + 4 + 8 + 8 + floats * sizeof(float));
  PutValue(which.rid);
  PutValue(which.attempt);
  PutValue(which.first_block);
  PutValue(which.num_blocks);
  PutValue(checksum);
  PutValue(uint64_t(floats));
  Put(data, floats * sizeof(float));
}

void KvChannel::SendAck(const KvAck& a) {
  BeginFrame(KvMsgType::kAck, 8 + 4 + 1 + 1 + 4 + a.reason.size());
  PutValue(a.rid);
  PutValue(a.attempt);
  PutValue(uint8_t(a.ok));
  PutValue(uint8_t(a.retry));
  PutString(a.reason);
}

void KvChannel::SendEnd() { BeginFrame(KvMsgType::kEnd, 0); }

void KvChannel::SendReport(std::string_view json) {
  BeginFrame(KvMsgType::kReport, 4 + json.size());
  PutString(json);
}

Status KvChannel::Pump(bool read) {
  while (out_pos_ < out_.size()) {
    const ssize_t n = send(fd_, out_.data() + out_pos_, out_.size() - out_pos_,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EPIPE || errno == ECONNRESET) {
        closed_ = true;
        return Status::Error("KV channel: the peer process has gone");
      }
      return Errno("send");
    }
    out_pos_ += size_t(n);
    bytes_sent_ += uint64_t(n);
  }
  if (out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  }
  while (read && !closed_) {
    // Compact once the consumed part dominates, so the buffer stays about
    // one frame long.
    if (in_pos_ > 0 && in_pos_ * 2 >= in_.size()) {
      in_.erase(in_.begin(), in_.begin() + ptrdiff_t(in_pos_));
      in_pos_ = 0;
    }
    const size_t old = in_.size();
    in_.resize(old + kReadChunk);
    const ssize_t n = recv(fd_, in_.data() + old, kReadChunk, MSG_DONTWAIT);
    in_.resize(old + (n > 0 ? size_t(n) : 0));
    if (n == 0) {
      closed_ = true;
      break;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == ECONNRESET) {
        closed_ = true;
        break;
      }
      return Errno("recv");
    }
    bytes_received_ += uint64_t(n);
  }
  return Status::Ok();
}

Status KvChannel::Next(KvMessage* m, bool* got) {
  *got = false;
  const size_t avail = in_.size() - in_pos_;
  if (avail < kHeaderBytes) return Status::Ok();
  uint32_t len = 0;
  std::memcpy(&len, in_.data() + in_pos_, 4);
  if (len < 1 || len > kMaxKvFrameBytes) {
    return Status::Error("KV channel: bad frame length " + std::to_string(len));
  }
  if (avail < 4 + size_t(len)) {
    // Room for the whole frame, so that the reads need not regrow it.
    in_.reserve(in_pos_ + 4 + size_t(len) + kReadChunk);
    return Status::Ok();
  }
  const uint8_t type = in_[in_pos_ + 4];
  Reader r(in_.data() + in_pos_ + kHeaderBytes, size_t(len) - 1);
  in_pos_ += 4 + size_t(len);
  m->type = KvMsgType(type);
  switch (m->type) {
    case KvMsgType::kHandoff: {
      KvHandoff& h = m->handoff;
      h.rid = r.Get<uint64_t>();
      h.max_tokens = r.Get<uint32_t>();
      h.priority = r.Get<int32_t>();
      h.has_priority = r.Get<uint8_t>() != 0;
      h.lora = r.Get<int32_t>();
      h.tenant = r.Get<int32_t>();
      h.sampling_seed = r.Get<uint64_t>();
      h.traceparent = r.String(kMaxKvShortString);
      const auto n = r.Get<uint32_t>();
      if (n > kMaxKvPromptTokens)
        return Status::Error("KV channel: bad prompt");
      r.Array(&h.prompt, n);
      break;
    }
    case KvMsgType::kPull:
      m->pull.rid = r.Get<uint64_t>();
      m->pull.attempt = r.Get<uint32_t>();
      m->pull.first_block = r.Get<uint32_t>();
      m->pull.num_blocks = r.Get<uint32_t>();
      break;
    case KvMsgType::kKv: {
      KvData& k = m->kv;
      k.rid = r.Get<uint64_t>();
      k.attempt = r.Get<uint32_t>();
      k.first_block = r.Get<uint32_t>();
      k.num_blocks = r.Get<uint32_t>();
      k.checksum = r.Get<uint64_t>();
      const auto floats = r.Get<uint64_t>();
      r.Array(&k.data, size_t(floats));
      break;
    }
    case KvMsgType::kAck:
      m->ack.rid = r.Get<uint64_t>();
      m->ack.attempt = r.Get<uint32_t>();
      m->ack.ok = r.Get<uint8_t>() != 0;
      m->ack.retry = r.Get<uint8_t>() != 0;
      m->ack.reason = r.String(kMaxKvShortString);
      break;
    case KvMsgType::kEnd:
      break;
    case KvMsgType::kReport:
      m->text = r.String(kMaxKvReportBytes);
      break;
    default:
      return Status::Error("KV channel: unknown message type " +
                           std::to_string(type));
  }
  if (!r.ok()) {
    return Status::Error("KV channel: malformed message of type " +
                         std::to_string(type));
  }
  *got = true;
  return Status::Ok();
}

bool KvChannel::HasFrame() const {
  const size_t avail = in_.size() - in_pos_;
  if (avail < kHeaderBytes) return false;
  uint32_t len = 0;
  std::memcpy(&len, in_.data() + in_pos_, 4);
  return len < 1 || len > kMaxKvFrameBytes || avail >= 4 + size_t(len);
}

Status KvChannel::Wait(uint64_t deadline_ns) {
  if (HasFrame() || closed_) return Status::Ok();
  pollfd p{};
  p.fd = fd_;
  p.events = short(POLLIN | (pending_out() > 0 ? POLLOUT : 0));
  timespec ts{};
  timespec* timeout = nullptr;
  if (deadline_ns != 0) {
    const uint64_t now = NowNs();
    const uint64_t left = deadline_ns > now ? deadline_ns - now : 0;
    ts.tv_sec = time_t(left / 1'000'000'000);
    ts.tv_nsec = long(left % 1'000'000'000);
    timeout = &ts;
  }
  if (ppoll(&p, 1, timeout, nullptr) < 0 && errno != EINTR) {
    return Errno("poll");
  }
  return Status::Ok();
}

Status KvChannel::Flush() {
  while (pending_out() > 0) {
    Status s = Pump();
    if (!s.ok()) return s;
    if (pending_out() == 0) break;
    if (closed_) return Status::Error("KV channel: the peer process has gone");
    s = Wait(0);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status KvChannel::Receive(KvMessage* m) {
  for (;;) {
    bool got = false;
    Status s = Next(m, &got);
    if (!s.ok() || got) return s;
    if (closed_) return Status::Error("KV channel: the peer process has gone");
    s = Wait(0);
    if (!s.ok()) return s;
    s = Pump();
    if (!s.ok()) return s;
  }
}

}  // namespace tokenmeter::engine
