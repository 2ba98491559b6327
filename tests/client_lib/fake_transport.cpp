#include "fake_transport.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {

using client::IoResult;

class FakePeer::Transport final : public client::Transport {
 public:
  explicit Transport(std::shared_ptr<FakePeer> peer) : peer_(std::move(peer)) {}
  int Connect(const std::string& /*path*/) override { return peer_->Connect(); }
  IoResult Write(const uint8_t* data, size_t n) override {
    return peer_->Write(data, n);
  }
  IoResult Read(uint8_t* buf, size_t cap) override {
    return peer_->Read(buf, cap);
  }
  void Shutdown() override { peer_->Shutdown(); }
  void Close() override { peer_->Close(); }
  int fd() const override { return peer_->fd(); }

 private:
  const std::shared_ptr<FakePeer> peer_;
};

std::shared_ptr<FakePeer> FakePeer::New() {
  return std::shared_ptr<FakePeer>(new FakePeer());
}

FakePeer::FakePeer() {
  // A pipe's read end: readable when signalled, never writable, so the
  // sender's POLLOUT after kAgain waits like it would on a full socket.
  if (pipe2(pipe_, O_NONBLOCK | O_CLOEXEC) != 0) std::abort();
}

FakePeer::~FakePeer() {
  close(pipe_[0]);
  close(pipe_[1]);
}

client::TransportFactory FakePeer::Factory() {
  std::shared_ptr<FakePeer> self = shared_from_this();
  return [self] { return std::make_unique<Transport>(self); };
}

void FakePeer::SetRefuseConnect(bool refuse) {
  std::lock_guard<std::mutex> l(mu_);
  refuse_ = refuse;
}

void FakePeer::SetWriteSizes(std::vector<size_t> sizes) {
  std::lock_guard<std::mutex> l(mu_);
  write_sizes_ = std::move(sizes);
}

void FakePeer::SetWriteLimit(size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  write_limit_ = bytes;
  SignalLocked();
}

void FakePeer::SetScript(size_t index, ConnScript script) {
  std::lock_guard<std::mutex> l(mu_);
  if (scripts_.size() <= index) scripts_.resize(index + 1);
  scripts_[index] = script;
}

std::vector<FakeConn> FakePeer::Conns() const {
  std::lock_guard<std::mutex> l(mu_);
  return conns_;
}
std::vector<uint64_t> FakePeer::ConnectAttemptsNs() const {
  std::lock_guard<std::mutex> l(mu_);
  return attempts_ns_;
}
bool FakePeer::connected() const {
  std::lock_guard<std::mutex> l(mu_);
  return connected_;
}
uint64_t FakePeer::writes() const {
  std::lock_guard<std::mutex> l(mu_);
  return writes_;
}
uint64_t FakePeer::reads() const {
  std::lock_guard<std::mutex> l(mu_);
  return reads_;
}
size_t FakePeer::max_read_cap() const {
  std::lock_guard<std::mutex> l(mu_);
  return max_read_cap_;
}

void FakePeer::SignalLocked() {
  const char c = 1;
  [[maybe_unused]] ssize_t w = write(pipe_[1], &c, 1);
}

void FakePeer::DrainSignalLocked() {
  char sink[64];
  while (read(pipe_[0], sink, sizeof sink) > 0) {
  }
}

int FakePeer::Connect() {
  std::lock_guard<std::mutex> l(mu_);
  if (connected_) std::abort();  // the contract: only while not connected
  attempts_ns_.push_back(tm_now_ns());
  if (refuse_) return ECONNREFUSED;
  const size_t index = conns_.size();
  const ConnScript script =
      index < scripts_.size() ? scripts_[index] : ConnScript{};
  conns_.emplace_back();
  conns_.back().connected_ns = attempts_ns_.back();
  connected_ = true;
  inbound_left_ = script.inbound_bytes;
  eof_ = script.eof_after_connect;
  DrainSignalLocked();
  if (inbound_left_ > 0 || eof_) SignalLocked();
  return 0;
}

IoResult FakePeer::Write(const uint8_t* data, size_t n) {
  std::lock_guard<std::mutex> l(mu_);
  if (!connected_ || n == 0) std::abort();  // contract violations
  const size_t index = conns_.size() - 1;
  const ConnScript script =
      index < scripts_.size() ? scripts_[index] : ConnScript{};
  std::vector<uint8_t>& bytes = conns_.back().bytes;
  size_t take = n;
  if (!write_sizes_.empty()) {
    take = std::min(take, write_sizes_[writes_ % write_sizes_.size()]);
  }
  ++writes_;
  if (bytes.size() >= script.fail_after) {
    return {IoResult::Status::kError, 0, script.fail_errno};
  }
  take = std::min(take, script.fail_after - bytes.size());
  if (bytes.size() >= write_limit_) return {IoResult::Status::kAgain, 0, 0};
  take = std::min(take, write_limit_ - bytes.size());
  bytes.insert(bytes.end(), data, data + take);
  return {IoResult::Status::kOk, take, 0};
}

IoResult FakePeer::Read(uint8_t* buf, size_t cap) {
  std::lock_guard<std::mutex> l(mu_);
  if (!connected_ || cap == 0) std::abort();
  ++reads_;
  max_read_cap_ = std::max(max_read_cap_, cap);
  DrainSignalLocked();
  if (inbound_left_ > 0) {
    const size_t n = std::min(cap, inbound_left_);
    std::fill(buf, buf + n, uint8_t{0xc1});  // never used in msgpack
    inbound_left_ -= n;
    if (inbound_left_ > 0 || eof_) SignalLocked();  // still readable
    return {IoResult::Status::kOk, n, 0};
  }
  if (eof_) {
    SignalLocked();  // EOF stays readable
    return {IoResult::Status::kEof, 0, 0};
  }
  return {IoResult::Status::kAgain, 0, 0};
}

void FakePeer::Shutdown() {
  std::lock_guard<std::mutex> l(mu_);
  if (connected_) conns_.back().shutdown = true;
}

void FakePeer::Close() {
  std::lock_guard<std::mutex> l(mu_);
  if (!connected_) return;
  conns_.back().closed_ns = tm_now_ns();
  connected_ = false;
  inbound_left_ = 0;
  eof_ = false;
  DrainSignalLocked();
}

int FakePeer::fd() const {
  std::lock_guard<std::mutex> l(mu_);
  return connected_ ? pipe_[0] : -1;
}

}  // namespace tokenmeter::testing
