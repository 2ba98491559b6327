// The ingest listener and its connections: a Unix stream socket that
// engines connect to, one Connection per peer owning its uv_pipe_t, each
// with its own FrameDecoder feeding the shared Tracker.
//
// Untrusted input: a frame-level error is counted, logged once with the
// peer named, and closes that connection only. Reading is synchronous with
// applying (a read callback decodes and applies what it read), so a
// connection is read only as fast as the daemon applies its events; the
// decoder holds at most one incomplete frame (max_frame_bytes).
//
// Acknowledged delivery (protocol 1.1): a HELLO with `session` and `ack`
// makes the connection part of that client's session, whose highest
// applied BATCH seq the server keeps; a BATCH at or below it (a replay
// after a reconnect) is skipped and counted as a duplicate, and after each
// read that applied or skipped batches the connection writes one ACK
// [3, highest seq] (a non-blocking write; with a write still pending the
// next ACK waits for it and carries the latest seq). Nothing is ever
// written to a connection without `ack`. An unscoped connection with a
// session takes its session's request-id space, so that a request in
// flight across a reconnect keeps its earlier events.
//
// Slots are bounded three ways, each refusal counted in
// tokenmeter_ingest_errors_total and logged once per burst: at most
// max_connections at once (connection_limit), at most
// max_connections_per_uid of one peer uid (uid_connection_limit), and a
// connection that has not sent HELLO within hello_timeout_ns is closed
// (hello_timeout). When accept() fails for lack of file descriptors
// (EMFILE, ENFILE), a spare descriptor kept for the purpose is closed, the
// pending connection accepted and closed at once (fd_limit), and the spare
// reopened, so the listener never spins on a connection it cannot take.
#ifndef TOKENMETER_DAEMON_INGEST_INGEST_SERVER_H_
#define TOKENMETER_DAEMON_INGEST_INGEST_SERVER_H_

#include <uv.h>

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/base/status.h"
#include "daemon/ingest/frame_decoder.h"
#include "daemon/ingest/ingest_options.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/tracker.h"
#include "daemon/net/acceptor.h"
#include "daemon/store/profile.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

class IngestServer {
 public:
  // `stats` receives the connection, frame, error and client-drop counts.
  IngestServer(uv_loop_t* loop, Registry& registry, Tracker& tracker,
               IngestStats& stats, IngestOptions options);
  IngestServer(const IngestServer&) = delete;
  IngestServer& operator=(const IngestServer&) = delete;
  ~IngestServer();  // requires Close() to have completed

  // Binds `path` (mode 0660, group options.group when set), replacing a
  // stale socket file nobody listens on; a live socket, a non-socket file,
  // a path too long for sun_path, or a group that does not exist or that
  // the daemon may not give the file is an error naming the path or group.
  // The group is set before listen(), so no one connects before it is.
  // Also opens the spare descriptor (/dev/null) for EMFILE; failing to is
  // an error. Call Listen() or Adopt() once.
  Status Listen(const std::string& path);
  // Uses an inherited, already listening Unix socket (socket activation);
  // takes ownership of `fd` (closed by Close()). The daemon then does not
  // unlink the socket file at exit.
  Status Adopt(int fd);

  // Stops accepting, reads what every connection has already sent, closes
  // them, unlinks the socket file it created, then calls done().
  void Close(std::function<void()> done);

  size_t connections() const { return connections_.size(); }

  // Snapshots (daemon/base/state_io.h): the shared request-id spaces, the
  // next space id and every session's highest applied seq. SaveState() also
  // remembers, per session, the seq it wrote, which SnapshotWritten() (the
  // snapshot is on disk) makes what the session's ACKs carry, sending them.
  // LoadState() fills a server that has no connection yet; what it loads
  // counts as on disk. O(spaces + sessions), SnapshotWritten() also
  // O(connections).
  void SaveState(StateWriter& w);
  void LoadState(StateReader& r);
  void SnapshotWritten();

  class Connection;

 private:
  friend class Connection;
  // Accepts on `fd` (a listening socket, owned from now on) through
  // acceptor_, at most kAcceptsPerWake per loop iteration.
  Status StartListening(int fd);
  void Accept(int fd);
  // A pending connection the acceptor shed for lack of descriptors (err:
  // UV_EMFILE or UV_ENFILE; the acceptor closes fd): counted as fd_limit.
  void RefuseForFdLimit(int fd, int err);
  void AwaitHello(Connection* c);
  void StopAwaitingHello(Connection* c);
  static void OnHelloTimer(uv_timer_t* timer);
  void ArmHelloTimer();
  void Forget(Connection* c);
  void MaybeDone();
  struct SharedSpace {
    uint64_t space;
    size_t connections;  // open connections in it
  };
  // (engine, model, "s:" scope or "n:" session in decimal).
  using SharedSpaces =
      std::map<std::tuple<std::string, std::string, std::string>, SharedSpace>;
  // The request-id space of a HELLO: its scope's, else its session's, else
  // a new private one (joined: *shared names it). False when the cap on
  // shared spaces is reached.
  bool SpaceFor(const Hello& hello, uint64_t* space,
                SharedSpaces::iterator* shared);
  // An ack session's delivery state.
  struct Session {
    uint64_t highest_seq = 0;  // of the batches applied, when applied_any
    bool applied_any = false;
    size_t connections = 0;  // open connections in it
    // Its last connection ended with GOODBYE (not saved in snapshots: a
    // restored session counts as one whose client may come back).
    bool goodbye = false;
    // With ack_after_snapshot: the highest seq in a snapshot on disk (when
    // durable_any), and in the snapshot being written (when saved_any).
    uint64_t durable_seq = 0;
    bool durable_any = false;
    uint64_t saved_seq = 0;
    bool saved_any = false;
    // What an ACK to this session carries now; false: nothing to ack.
    bool AckSeq(bool after_snapshot, uint64_t* seq) const {
      *seq = after_snapshot ? durable_seq : highest_seq;
      return after_snapshot ? durable_any : applied_any;
    }
  };
  using Sessions =
      std::map<std::tuple<std::string, std::string, uint64_t>, Session>;
  // The session of an `ack` HELLO (engine, model, session), made if new.
  // False when max_shared_spaces sessions are known and all have open
  // connections (otherwise one without is forgotten).
  bool SessionFor(const Hello& hello, Sessions::iterator* out);
  bool PeerAllowed(uint32_t uid, uint32_t gid) const;
  // The first HELLO label that a series of this HELLO would show twice:
  // one named like a --request-label or a cache_config key. Empty: none.
  std::string_view LabelClash(const Hello& hello) const;

  uv_loop_t* loop_;
  Registry& registry_;
  Tracker& tracker_;
  IngestStats& stats_;
  const IngestOptions options_;
  const size_t max_shared_spaces_;
  // The listening socket until StartListening() hands it to acceptor_.
  int listen_fd_ = -1;
  // The acceptor (with the spare descriptor for EMFILE) and the HELLO
  // timer: started together by StartListening(), closed by Close().
  std::unique_ptr<net::Acceptor> acceptor_;
  uv_timer_t hello_timer_{};
  bool handles_open_ = false;
  int closing_handles_ = 0;  // of those two, closes to complete
  bool closing_ = false;
  std::string unlink_path_;  // the socket file this process created
  std::unordered_set<Connection*> connections_;
  std::function<void()> done_;
  uint64_t next_connection_id_ = 1;
  // A refusal of that kind was logged; reset by the next connection that
  // passes that check (a HELLO for hello_timeout, an accept for fd_limit),
  // so that a burst of refusals logs once.
  bool limit_logged_ = false;
  bool uid_limit_logged_ = false;
  bool hello_timeout_logged_ = false;
  bool fd_limit_logged_ = false;
  // Connections in connections_ refused at accept and not yet freed.
  size_t refused_open_ = 0;
  // Accepted connections by peer uid (those whose credentials were read);
  // at most max_connections entries, a uid with none is erased.
  std::unordered_map<uint32_t, uint32_t> uid_connections_;
  // Connections without a HELLO yet, oldest first (the timeout is the
  // same for all, so this is also deadline order).
  std::list<Connection*> awaiting_hello_;
  // (engine, model, scope) -> shared request-id space.
  SharedSpaces shared_spaces_;
  uint64_t next_space_ = 1;
  Sessions sessions_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_INGEST_SERVER_H_
