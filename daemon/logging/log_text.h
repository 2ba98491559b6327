// Log text that cannot forge a log line: every line the daemon writes goes
// through AppendLogText() (log_setup.cpp installs it as the pattern's
// message flag), so a string that came from a peer (a HELLO's model,
// instance or scope, a label value, a request id, an HTTP target) can
// neither end the line nor start a new one with its own journald priority
// prefix ("<0>"), nor reach a terminal as a control sequence.
//
// Escapes: \n, \r, \t; other C0 controls and DEL as \xNN; C1 controls
// (U+0080..U+009F) and the Unicode line and paragraph separators (U+2028,
// U+2029) as \uNNNN; every byte that is not part of valid UTF-8 (overlong
// forms, surrogates, above U+10FFFF, truncated sequences) as \xNN. Other
// bytes, backslash included, are copied, so text without such characters
// reads exactly as written. Pure function, any thread, O(length).
#ifndef TOKENMETER_DAEMON_LOGGING_LOG_TEXT_H_
#define TOKENMETER_DAEMON_LOGGING_LOG_TEXT_H_

#include <string>
#include <string_view>

namespace tokenmeter::daemon {

void AppendLogText(std::string_view text, std::string* out);

inline std::string LogText(std::string_view text) {
  std::string out;
  AppendLogText(text, &out);
  return out;
}

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_LOGGING_LOG_TEXT_H_
