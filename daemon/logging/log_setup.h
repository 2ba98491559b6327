// Logging set-up: spdlog to stderr. Under journald (JOURNAL_STREAM names
// stderr's device and inode) every line starts with the syslog priority
// prefix "<N>" and carries no timestamp, since journald adds one; otherwise
// lines are human-readable with a timestamp. Either way the message is
// escaped (log_text.h): one call, one line, whatever it quotes.
#ifndef TOKENMETER_DAEMON_LOGGING_LOG_SETUP_H_
#define TOKENMETER_DAEMON_LOGGING_LOG_SETUP_H_

#include <string_view>

#include "daemon/base/status.h"

namespace tokenmeter::daemon {

// True when JOURNAL_STREAM ("DEV:INODE") matches file descriptor 2.
bool StderrIsJournal();

// Installs the default logger. `level`: trace, debug, info, warn, error.
Status SetUpLogging(std::string_view level);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_LOGGING_LOG_SETUP_H_
