// The byte codec of state snapshots (daemon/state/snapshot.h): a writer that
// appends fixed-width little-endian fields to a string, and a reader that
// takes them back with every read bounds-checked. A reader that runs past
// its end, or that a component finds out of range (Fail()), stays failed and
// returns zeros from then on, so a corrupt snapshot is detected once, at the
// end of a load, and never read past its bytes.
//
// Each component that keeps state across a restart writes it with
// SaveState(StateWriter&) and takes it back with LoadState(StateReader&),
// next to the members it saves (registry, tracker, ingest stats, ingest
// server, HTTP counters), so that a new member is saved where it is
// declared. Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_BASE_STATE_IO_H_
#define TOKENMETER_DAEMON_BASE_STATE_IO_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tokenmeter::daemon {

// The layout SaveState() writes now (the snapshot's format version). 2:
// each histogram also holds its native buckets. 3: an engine series'
// features are parts, each saved by itself (store/part.h). 4: the ingest
// counters per event kind and per error reason are saved with their number,
// so that kinds and reasons added later load (IngestStats::LoadState()). A
// StateReader
// says which layout its bytes have, so that a component whose layout grew
// can still read the older one (Histogram::LoadState(), MoePart::LoadState(),
// EngineSeries::LoadState(), IngestStats::LoadState()). 4 also: an MoE
// layer saves its expert count and its per-expert counts only when it
// keeps them (MoePart::SaveState()). 5 (protocol 1.2): an engine series'
// values are saved with their number of metrics and histograms
// (SeriesValues::LoadState() maps formats 1 to 4 onto the grown catalog with
// Format4Metric()), and a tracked request saves its 1.2 extras. 6: the
// registry saves when its state began and each engine series its start
// time (Unix ns), the OTLP metrics' start times across restarts, and a
// tracked request its finish reason (for its timeline). 7: the tracker
// saves the KV wait's incomplete and negative counts (a ninth interval)
// and whether a finished request's KV wait is still open.
inline constexpr uint32_t kStateFormatVersion = 7;
inline constexpr uint32_t kOldestStateFormatVersion = 1;

class StateWriter {
 public:
  explicit StateWriter(std::string& out) : out_(out) {}

  void U8(uint8_t v) { out_.push_back(char(v)); }
  void U16(uint16_t v) { Fixed(v); }
  void U32(uint32_t v) { Fixed(v); }
  void U64(uint64_t v) { Fixed(v); }
  void I64(int64_t v) { Fixed(uint64_t(v)); }
  void F64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    Fixed(bits);
  }
  void Bool(bool v) { U8(v ? 1 : 0); }
  // A length (u32) and the bytes.
  void Str(std::string_view s) {
    U32(uint32_t(s.size()));
    out_.append(s.data(), s.size());
  }
  // A count (u64) and the values.
  void U64s(const std::vector<uint64_t>& v) {
    U64(v.size());
    for (uint64_t x : v) U64(x);
  }
  size_t size() const { return out_.size(); }

 private:
  template <typename T>
  void Fixed(T v) {
    char b[sizeof(T)];
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(b, &v, sizeof(T));
    } else {
      for (size_t i = 0; i < sizeof(T); ++i) b[i] = char((v >> (8 * i)) & 0xff);
    }
    out_.append(b, sizeof(T));
  }
  std::string& out_;
};

class StateReader {
 public:
  // `version`: the layout the bytes were written in
  // (kOldestStateFormatVersion..kStateFormatVersion).
  StateReader(const char* data, size_t size,
              uint32_t version = kStateFormatVersion)
      : p_(data), end_(data + size), version_(version) {}

  uint32_t version() const { return version_; }
  void set_version(uint32_t version) { version_ = version; }

  uint8_t U8() { return uint8_t(Fixed<uint8_t>()); }
  uint16_t U16() { return Fixed<uint16_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  uint64_t U64() { return Fixed<uint64_t>(); }
  int64_t I64() { return int64_t(Fixed<uint64_t>()); }
  double F64() {
    const uint64_t bits = Fixed<uint64_t>();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  bool Bool() {
    const uint8_t v = U8();
    if (v > 1) Fail();
    return v == 1;
  }
  // A string of at most `max` bytes (a longer one fails the reader).
  std::string Str(size_t max = 4096) {
    const uint32_t n = U32();
    if (n > max || size_t(end_ - p_) < n) {
      Fail();
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  // A count of elements that each take at least `min_bytes` (>= 1) bytes,
  // at most `max`: a count the remaining bytes cannot hold fails the reader,
  // so a corrupt count never makes a load reserve memory.
  size_t Count(size_t max, size_t min_bytes = 1) {
    const uint64_t n = U64();
    if (n > max || n > uint64_t(end_ - p_) / min_bytes) {
      Fail();
      return 0;
    }
    return size_t(n);
  }
  // A count of at most `max` (Count()) and as many values, into *v.
  void U64s(size_t max, std::vector<uint64_t>* v) {
    v->assign(Count(max, 8), 0);
    for (uint64_t& x : *v) x = U64();
  }
  // Marks the input bad (a value out of range); reads return 0 from now on.
  void Fail() {
    ok_ = false;
    p_ = end_;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  template <typename T>
  T Fixed() {
    if (size_t(end_ - p_) < sizeof(T)) {
      Fail();
      return 0;
    }
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      v |= T(T(uint8_t(p_[i])) << (8 * i));
    }
    p_ += sizeof(T);
    return v;
  }
  const char* p_;
  const char* end_;
  uint32_t version_;
  bool ok_ = true;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_BASE_STATE_IO_H_
