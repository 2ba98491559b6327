// The ingest server's options (the socket, its connection caps and peers,
// naming, the decoder's limits, ACK timing).
#ifndef TOKENMETER_DAEMON_INGEST_INGEST_OPTIONS_H_
#define TOKENMETER_DAEMON_INGEST_INGEST_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/ingest/decoder_limits.h"
#include "daemon/store/profile.h"

namespace tokenmeter::daemon {

struct IngestOptions {
  DecoderLimits limits;
  std::string namespace_override;  // --namespace; empty: from HELLO engine
  // --profile: the naming profile of a HELLO without `profile`; nullopt is
  // auto (AutoProfile() of the HELLO engine).
  std::optional<Profile> profile;
  uint32_t max_connections = 1024;
  // --max-connections-per-uid: connections one peer uid (SO_PEERCRED) may
  // have open at once; the next is closed at accept, before any byte is
  // read, as uid_connection_limit. A peer whose credentials cannot be read
  // counts against no uid. At least 1; max_connections or more turns it
  // off.
  uint32_t max_connections_per_uid = 256;
  // --hello-timeout: a connection whose HELLO frame is not complete this
  // long after accept is closed as hello_timeout. Rounded up to whole
  // milliseconds (the loop's timer resolution), at least 1 ms.
  uint64_t hello_timeout_ns = 10'000'000'000;
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
  // --state-dir: an ACK carries the highest seq of a snapshot on disk
  // (SnapshotWritten()), not the highest applied.
  bool ack_after_snapshot = false;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_INGEST_INGEST_OPTIONS_H_
