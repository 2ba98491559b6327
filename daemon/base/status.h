// Status: the result of an operation that can fail because of the
// environment (a bad flag, an address in use, a permission). Carries one
// human-readable line for main() to print. Untrusted input never produces a
// Status; it is counted and logged where it is read.
#ifndef TOKENMETER_DAEMON_BASE_STATUS_H_
#define TOKENMETER_DAEMON_BASE_STATUS_H_

#include <string>
#include <utility>

namespace tokenmeter::daemon {

class [[nodiscard]] Status {
 public:
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  bool ok_ = true;
  std::string message_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_BASE_STATUS_H_
