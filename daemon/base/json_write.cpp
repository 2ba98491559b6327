#include "daemon/base/json_write.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tokenmeter::daemon::json_write {
namespace {

// The index of the first byte of [p, p + n) that JSON must escape (a
// control character, '"' or '\\'), or n. Eight bytes at a time: each test
// below is exact as a yes/no for the whole word (Anderson's "bit twiddling
// hacks", hasless() and haszero()); bytes of 0x80 and up never match.
size_t FirstToEscape(const char* p, size_t n) {
  constexpr uint64_t k01 = 0x0101010101010101ULL;
  constexpr uint64_t k80 = 0x8080808080808080ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    const uint64_t quote = v ^ (k01 * '"');
    const uint64_t backslash = v ^ (k01 * '\\');
    const uint64_t hit = ((v - k01 * 0x20) & ~v & k80) |
                         ((quote - k01) & ~quote & k80) |
                         ((backslash - k01) & ~backslash & k80);
    if (hit) break;
  }
  for (; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c < 0x20 || c == '"' || c == '\\') return i;
  }
  return n;
}

}  // namespace

void JsonEscaped(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  const char* p = s.data();
  size_t n = s.size();
  while (true) {
    const size_t plain = FirstToEscape(p, n);
    out->append(p, plain);
    if (plain == n) return;
    const unsigned char c = static_cast<unsigned char>(p[plain]);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default: {
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
        out->append(esc, 6);
      }
    }
    p += plain + 1;
    n -= plain + 1;
  }
}

void JsonDouble(std::string* out, double v) {
  if (std::isnan(v)) {
    out->append("\"NaN\"");
  } else if (std::isinf(v)) {
    out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  } else {
    char buf[32];
    // Shortest text that reads back as exactly v; locale-independent.
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out->append(buf, end);
  }
}

}  // namespace tokenmeter::daemon::json_write
