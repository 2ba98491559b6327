#include "daemon/logging/log_text.h"

#include <cstdint>

namespace tokenmeter::daemon {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void AppendByteEscape(uint8_t b, std::string* out) {
  const char e[4] = {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
  out->append(e, 4);
}

void AppendUnicodeEscape(uint32_t cp, std::string* out) {
  const char e[6] = {'\\',
                     'u',
                     kHex[(cp >> 12) & 15],
                     kHex[(cp >> 8) & 15],
                     kHex[(cp >> 4) & 15],
                     kHex[cp & 15]};
  out->append(e, 6);
}

// The length of the valid UTF-8 sequence at s[i] (2 to 4) and its code
// point, or 0 when the bytes there are not one (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF).
size_t DecodeUtf8(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  const auto cont = [&](size_t k) {
    return i + k < s.size() && (b(k) & 0xc0) == 0x80;
  };
  const uint8_t lead = b(0);
  if (lead >= 0xc2 && lead <= 0xdf) {
    if (!cont(1)) return 0;
    *cp = (uint32_t(lead & 0x1f) << 6) | (b(1) & 0x3f);
    return 2;
  }
  if (lead >= 0xe0 && lead <= 0xef) {
    if (!cont(1) || !cont(2)) return 0;
    *cp = (uint32_t(lead & 0x0f) << 12) | (uint32_t(b(1) & 0x3f) << 6) |
          (b(2) & 0x3f);
    if (*cp < 0x800 || (*cp >= 0xd800 && *cp <= 0xdfff)) return 0;
    return 3;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    *cp = (uint32_t(lead & 0x07) << 18) | (uint32_t(b(1) & 0x3f) << 12) |
          (uint32_t(b(2) & 0x3f) << 6) | (b(3) & 0x3f);
    if (*cp < 0x10000 || *cp > 0x10ffff) return 0;
    return 4;
  }
  return 0;
}

}  // namespace

void AppendLogText(std::string_view text, std::string* out) {
  out->reserve(out->size() + text.size());
  size_t i = 0;
  while (i < text.size()) {
    // The common case: a run of printable ASCII, copied at once.
    size_t run = i;
    while (run < text.size() && uint8_t(text[run]) >= 0x20 &&
           uint8_t(text[run]) < 0x7f) {
      ++run;
    }
    out->append(text.data() + i, run - i);
    i = run;
    if (i == text.size()) break;
    const auto c = uint8_t(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '\n':
          out->append("\\n");
          break;
        case '\r':
          out->append("\\r");
          break;
        case '\t':
          out->append("\\t");
          break;
        default:
          AppendByteEscape(c, out);
      }
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = DecodeUtf8(text, i, &cp);
    if (n == 0) {
      AppendByteEscape(c, out);
      ++i;
    } else if (cp <= 0x9f || cp == 0x2028 || cp == 0x2029) {
      AppendUnicodeEscape(cp, out);
      i += n;
    } else {
      out->append(text.data() + i, n);
      i += n;
    }
  }
}

}  // namespace tokenmeter::daemon
