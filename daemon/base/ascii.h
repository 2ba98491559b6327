// ASCII case-insensitive comparison, as HTTP compares header names, media
// types, parameters and schemes (RFC 9110 5.1, 8.3.1): only A-Z fold;
// independent of the C locale. Pure functions, any thread, O(length).
#ifndef TOKENMETER_DAEMON_BASE_ASCII_H_
#define TOKENMETER_DAEMON_BASE_ASCII_H_

#include <string_view>

namespace tokenmeter::daemon {

constexpr char AsciiToLower(char c) {
  return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
}

constexpr bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (AsciiToLower(a[i]) != AsciiToLower(b[i])) return false;
  }
  return true;
}

constexpr bool StartsWithIgnoreCase(std::string_view s,
                                    std::string_view prefix) {
  return s.size() >= prefix.size() &&
         EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
}

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_BASE_ASCII_H_
