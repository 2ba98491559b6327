#include "client.h"

#include <utility>

using tokenmeter::client::NewUnixSocketTransport;
using tokenmeter::client::SenderOptions;
using tokenmeter::client::Transport;

namespace {

SenderOptions SenderOptionsOf(const tm_options& opts) {
  SenderOptions s;
  s.socket_path = opts.socket_path;
  s.meta = opts.meta;
  s.flush_interval_ms = opts.flush_interval_ms;
  s.close_timeout_ms = opts.close_timeout_ms;
  return s;
}

std::unique_ptr<Transport> TransportOf(const tm_options& opts) {
  std::unique_ptr<Transport> t =
      opts.make_transport ? opts.make_transport() : NewUnixSocketTransport();
  if (t == nullptr) throw std::bad_alloc();
  return t;
}

}  // namespace

tm_client::tm_client(const tm_options& opts)
    : registry_(opts.buffer_capacity, opts.max_threads, counters_),
      sender_(SenderOptionsOf(opts), TransportOf(opts), registry_, counters_) {}

int tm_client::Close(uint64_t* stats_out, size_t n) {
  const uint64_t given_up = sender_.Stop();
  if (stats_out != nullptr) Stats(stats_out, n);
  return given_up == 0 ? TM_OK : TM_E_TIMEOUT;
}

int tm_client::Stats(uint64_t* out, size_t n) const {
  if (out == nullptr && n > 0) return TM_E_INVALID;
  const uint64_t dropped =
      counters_.dropped_extra.load(std::memory_order_relaxed) +
      registry_.RingDrops();
  const uint64_t all[TM_STAT_COUNT] = {
      counters_.sent.load(std::memory_order_relaxed),
      dropped,
      counters_.rejected.load(std::memory_order_relaxed),
      counters_.reconnects.load(std::memory_order_relaxed),
      counters_.batches.load(std::memory_order_relaxed),
      counters_.bytes.load(std::memory_order_relaxed),
      counters_.connected.load(std::memory_order_relaxed),
      counters_.connect_failures.load(std::memory_order_relaxed),
  };
  for (size_t i = 0; i < n && i < TM_STAT_COUNT; ++i) out[i] = all[i];
  return TM_OK;
}
