// The ingest listener and its connections: a Unix stream socket that
// engines connect to, one Connection per peer owning its uv_pipe_t, each
// with its own FrameDecoder feeding the shared Tracker.
//
// Untrusted input: a frame-level error is counted, logged once with the
// peer named, and closes that connection only. Reading is synchronous with
// applying (a read callback decodes and applies what it read), so a
// connection is read only as fast as the daemon applies its events; the
// decoder holds at most one incomplete frame (max_frame_bytes).
#ifndef TOKENMETER_DAEMON_INGEST_INGEST_SERVER_H_
#define TOKENMETER_DAEMON_INGEST_INGEST_SERVER_H_

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "daemon/ingest/frame_decoder.h"
#include "daemon/ingest/ingest_stats.h"
#include "daemon/ingest/tracker.h"
#include "daemon/metrics/registry.h"
#include "daemon/status.h"

namespace tokenmeter::daemon {

struct IngestOptions {
  DecoderLimits limits;
  std::string namespace_override;  // --namespace; empty: from HELLO engine
  uint32_t max_connections = 1024;
  // --ingest-group: the group given to the socket file Listen() creates
  // (a name, or a number when no group has that name); empty: the
  // daemon's own group. Not applied to an adopted socket (the socket unit
  // sets SocketGroup=).
  std::string group;
  // --allow-uids / --allow-gids: when either is non-empty, a peer is
  // accepted only if its SO_PEERCRED uid is in allow_uids or its gid (the
  // peer's effective gid, not its supplementary groups) in allow_gids;
  // others are counted as peer_not_allowed, logged and closed at accept.
  // Both empty: everyone who can open the socket is accepted.
  std::vector<uint32_t> allow_uids;
  std::vector<uint32_t> allow_gids;
  // Shared request-id spaces (distinct HELLO engine, model and scope) kept
  // at once; 0: four times the registry's series cap. Past it a scope no
  // open connection uses is forgotten, and with none, the HELLO is refused
  // as series_limit.
  size_t max_shared_spaces = 0;
};

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
  Status Listen(const std::string& path);
  // Uses an inherited, already listening Unix socket (socket activation).
  // The daemon then does not unlink it at exit.
  Status Adopt(int fd);

  // Stops accepting, reads what every connection has already sent, closes
  // them, unlinks the socket file it created, then calls done().
  void Close(std::function<void()> done);

  size_t connections() const { return connections_.size(); }

  class Connection;

 private:
  friend class Connection;
  static void OnConnection(uv_stream_t* server, int status);
  void Accept();
  void Forget(Connection* c);
  void MaybeDone();
  struct SharedSpace {
    uint64_t space;
    size_t connections;  // open connections in it
  };
  using SharedSpaces =
      std::map<std::tuple<std::string, std::string, std::string>, SharedSpace>;
  // The request-id space of a HELLO: a new private one, or its scope's
  // (joined: *shared names it). False when the scope cap is reached.
  bool SpaceFor(const Hello& hello, uint64_t* space,
                SharedSpaces::iterator* shared);
  bool PeerAllowed(uint32_t uid, uint32_t gid) const;

  uv_loop_t* loop_;
  Registry& registry_;
  Tracker& tracker_;
  IngestStats& stats_;
  const IngestOptions options_;
  const size_t max_shared_spaces_;
  uv_pipe_t listener_{};
  bool listening_ = false;
  bool closing_ = false;
  bool listener_closed_ = true;
  std::string unlink_path_;  // the socket file this process created
  std::unordered_set<Connection*> connections_;
  std::function<void()> done_;
  uint64_t next_connection_id_ = 1;
  // A connection-limit refusal was logged; reset by the next accepted one,
  // so that a burst of refusals logs once.
  bool limit_logged_ = false;
  // Connections in connections_ refused for the limit and not yet freed.
  size_t refused_open_ = 0;
  // (engine, model, scope) -> shared request-id space.
  SharedSpaces shared_spaces_;
  uint64_t next_space_ = 1;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_INGEST_SERVER_H_
