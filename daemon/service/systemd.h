// systemd integration: sockets inherited through socket activation
// (LISTEN_FDS / LISTEN_FDNAMES) and the notify protocol (NOTIFY_SOCKET).
// Uses libsystemd when the build has it; otherwise speaks both protocols
// itself (they are a few environment variables and one datagram).
// Loop thread only.
#ifndef TOKENMETER_DAEMON_SERVICE_SYSTEMD_H_
#define TOKENMETER_DAEMON_SERVICE_SYSTEMD_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace tokenmeter::daemon {

// Listening sockets passed by the service manager, by FileDescriptorName=
// ("ingest", "http"). Empty when the process was not socket-activated (or
// LISTEN_PID names another process). Unsets the variables so that child
// processes do not inherit them. The descriptors are set close-on-exec.
std::map<std::string, int> TakeInheritedSockets();

// The protocol pieces used when the build has no libsystemd, exposed so that
// tests exercise them in every build. ParseListenFds maps LISTEN_* values
// to descriptors (3, 4, ...) when listen_pid equals self_pid.
std::map<std::string, int> ParseListenFds(const char* listen_pid,
                                          const char* listen_fds,
                                          const char* listen_fdnames,
                                          int64_t self_pid);
// One datagram to NOTIFY_SOCKET's path ('@' prefix: abstract namespace).
bool SendNotifyDatagram(const std::string& socket_path,
                        const std::string& message);

// The notify protocol. Every call is a no-op when NOTIFY_SOCKET is unset.
class Notifier {
 public:
  Notifier();  // reads NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID
  bool enabled() const { return !socket_path_.empty(); }
  // Microseconds between watchdog pings systemd expects (0: no watchdog).
  uint64_t watchdog_usec() const { return watchdog_usec_; }

  void Ready() { Send("READY=1"); }
  void Stopping() { Send("STOPPING=1"); }
  void Watchdog() { Send("WATCHDOG=1"); }
  void Status(std::string_view status) {
    Send("STATUS=" + std::string(status));
  }
  // Sends one notify datagram; returns false when it could not be sent.
  bool Send(const std::string& message);

 private:
  std::string socket_path_;  // '@' prefix: abstract namespace
  uint64_t watchdog_usec_ = 0;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_SERVICE_SYSTEMD_H_
