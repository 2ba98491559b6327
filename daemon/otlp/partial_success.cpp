#include "daemon/otlp/partial_success.h"

#include <charconv>

namespace tokenmeter::daemon::otlp {
namespace {

constexpr size_t kMaxMessageBytes = 256;

// A protobuf reader over a byte range: varints and field skipping only.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  bool done() const { return rest_.empty(); }

  bool Varint(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (rest_.empty()) return false;
      const auto b = static_cast<uint8_t>(rest_.front());
      rest_.remove_prefix(1);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *out = v;
        return true;
      }
    }
    return false;
  }

  bool Bytes(std::string_view* out) {
    uint64_t n = 0;
    if (!Varint(&n) || n > rest_.size()) return false;
    *out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return true;
  }

  // Skips a field of wire type `type`; false for groups and bad types.
  bool Skip(uint32_t type) {
    uint64_t ignored = 0;
    std::string_view bytes;
    switch (type) {
      case 0:
        return Varint(&ignored);
      case 1:
        return Fixed(8);
      case 2:
        return Bytes(&bytes);
      case 5:
        return Fixed(4);
      default:
        return false;
    }
  }

 private:
  bool Fixed(size_t n) {
    if (rest_.size() < n) return false;
    rest_.remove_prefix(n);
    return true;
  }
  std::string_view rest_;
};

// The inner ExportXPartialSuccess message.
std::optional<PartialSuccess> ParseInner(std::string_view bytes) {
  PartialSuccess p;
  Reader r(bytes);
  while (!r.done()) {
    uint64_t key = 0;
    if (!r.Varint(&key)) return std::nullopt;
    const uint64_t field = key >> 3;
    const auto type = static_cast<uint32_t>(key & 7);
    if (field == 1 && type == 0) {
      uint64_t v = 0;
      if (!r.Varint(&v)) return std::nullopt;
      p.rejected = static_cast<int64_t>(v);
    } else if (field == 2 && type == 2) {
      std::string_view message;
      if (!r.Bytes(&message)) return std::nullopt;
      p.error_message = std::string(message.substr(0, kMaxMessageBytes));
    } else if (!r.Skip(type)) {
      return std::nullopt;
    }
  }
  return p;
}

// The value after `"key"`, skipping blanks and the colon; empty view when
// the key is absent.
std::string_view ValueAfter(std::string_view body, std::string_view key) {
  // Appended piece by piece: GCC 12's -Wrestrict misreads the operator+
  // chain at -O3 (a false positive in libstdc++'s char_traits).
  std::string quoted;
  quoted.reserve(key.size() + 2);
  quoted += '"';
  quoted += key;
  quoted += '"';
  size_t pos = body.find(quoted);
  if (pos == body.npos) return {};
  pos += quoted.size();
  const auto blank = [&] {
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t' ||
                                 body[pos] == '\n' || body[pos] == '\r')) {
      ++pos;
    }
  };
  blank();
  if (pos >= body.size() || body[pos] != ':') return {};
  ++pos;
  blank();
  return body.substr(pos);
}

std::optional<int64_t> JsonInteger(std::string_view v) {
  const bool quoted = !v.empty() && v.front() == '"';
  if (quoted) v.remove_prefix(1);
  int64_t x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end == v.data()) return std::nullopt;
  if (quoted && (end == v.data() + v.size() || *end != '"')) {
    return std::nullopt;
  }
  return x;
}

// A JSON string's contents up to its closing quote, escapes kept as
// written (the message only goes to a log line).
std::string JsonStringPrefix(std::string_view v) {
  if (v.empty() || v.front() != '"') return "";
  std::string out;
  for (size_t i = 1; i < v.size() && out.size() < kMaxMessageBytes; ++i) {
    if (v[i] == '"') break;
    if (v[i] == '\\' && i + 1 < v.size()) out += v[i++];
    out += v[i];
  }
  return out;
}

// The "errorMessage" (or "error_message") string's prefix; empty when
// there is none.
std::string JsonErrorMessage(std::string_view body) {
  std::string_view message = ValueAfter(body, "errorMessage");
  if (message.empty()) message = ValueAfter(body, "error_message");
  return JsonStringPrefix(message);
}

}  // namespace

std::optional<PartialSuccess> ParseProtobufPartialSuccess(
    std::string_view body) {
  Reader r(body);
  std::optional<PartialSuccess> found;
  while (!r.done()) {
    uint64_t key = 0;
    if (!r.Varint(&key)) return std::nullopt;
    const uint64_t field = key >> 3;
    const auto type = static_cast<uint32_t>(key & 7);
    if (field == 1 && type == 2) {
      std::string_view inner;
      if (!r.Bytes(&inner)) return std::nullopt;
      found = ParseInner(inner);
      if (!found.has_value()) return std::nullopt;
    } else if (!r.Skip(type)) {
      return std::nullopt;
    }
  }
  return found;
}

std::optional<PartialSuccess> ParseJsonPartialSuccess(std::string_view body) {
  static constexpr std::string_view kKeys[] = {
      "rejectedSpans",  "rejectedDataPoints",   "rejectedLogRecords",
      "rejected_spans", "rejected_data_points", "rejected_log_records",
  };
  for (std::string_view key : kKeys) {
    const std::string_view v = ValueAfter(body, key);
    if (v.empty()) continue;
    const std::optional<int64_t> n = JsonInteger(v);
    if (!n.has_value()) continue;
    PartialSuccess p;
    p.rejected = *n;
    p.error_message = JsonErrorMessage(body);
    return p;
  }
  // Proto3 JSON leaves out a zero count: a warning alone (rejected 0 and
  // a message) has only the message.
  if (ValueAfter(body, "partialSuccess").empty() &&
      ValueAfter(body, "partial_success").empty()) {
    return std::nullopt;
  }
  PartialSuccess p;
  p.error_message = JsonErrorMessage(body);
  if (p.error_message.empty()) return std::nullopt;
  return p;
}

}  // namespace tokenmeter::daemon::otlp
