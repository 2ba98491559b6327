#include "daemon/ingest/ingest_server.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {

// One engine connection. Owns its uv_pipe_t; freed in the close callback.
class IngestServer::Connection : public FrameSink {
 public:
  Connection(IngestServer& server, uint64_t id)
      : server_(server),
        id_(id),
        decoder_(server.options_.limits),
        shared_space_(server.shared_spaces_.end()) {
    pipe_.data = this;
  }

  uv_pipe_t* pipe() { return &pipe_; }
  bool refused() const { return refused_; }
  // The shared request-id space this connection holds, or end().
  SharedSpaces::iterator shared_space() const { return shared_space_; }

  // over_limit: accepted while max_connections others were open.
  void Start(bool over_limit) {
    const bool known = ReadPeerCredentials();
    const IngestOptions& o = server_.options_;
    if (over_limit) {
      refused_ = true;
      ++server_.refused_open_;
      server_.stats_.CountError(IngestError::kConnectionLimit);
      if (!server_.limit_logged_) {
        spdlog::warn(
            "ingest: {}: closing the connection: {} ({} engine connections "
            "open, --max-connections); more refusals are counted, not "
            "logged, until one is accepted",
            peer_, IngestErrorName(IngestError::kConnectionLimit),
            o.max_connections);
        server_.limit_logged_ = true;
      }
      Close();
      return;
    }
    if ((!o.allow_uids.empty() || !o.allow_gids.empty()) &&
        !(known && server_.PeerAllowed(uid_, gid_))) {
      server_.stats_.CountError(IngestError::kPeerNotAllowed);
      spdlog::warn("ingest: {}: closing the connection: {} ({})", peer_,
                   IngestErrorName(IngestError::kPeerNotAllowed),
                   known ? "uid and gid not in --allow-uids/--allow-gids"
                         : "peer credentials unavailable");
      Close();
      return;
    }
    uv_read_start(reinterpret_cast<uv_stream_t*>(&pipe_), OnAlloc, OnRead);
  }

  // Reads whatever the peer has already sent, without waiting, then closes.
  // SHUT_RD first: from then on the peer's writes fail (EPIPE) instead of
  // landing in a buffer nobody reads, so every write the peer saw succeed
  // is read here, and a batch cut short is one the client knows to resend.
  void Drain() {
    if (closing_) return;
    uv_os_fd_t fd;
    if (uv_fileno(reinterpret_cast<uv_handle_t*>(&pipe_), &fd) == 0) {
      shutdown(fd, SHUT_RD);
      for (;;) {
        std::span<char> buf = decoder_.Prepare(64 * 1024);
        if (buf.empty()) break;
        const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n <= 0) break;
        if (!decoder_.Commit(size_t(n), *this)) {
          FrameError();
          return;
        }
      }
    }
    Close();
  }

  void Close() {
    if (closing_) return;
    closing_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), [](uv_handle_t* h) {
      auto* c = static_cast<Connection*>(h->data);
      IngestServer& server = c->server_;
      server.Forget(c);
      delete c;
    });
  }

  // FrameSink.
  void OnHello(const Hello& hello) override {
    Registry& reg = server_.registry_;
    server_.stats_.CountFrame();
    SeriesIdentity id{server_.options_.namespace_override.empty()
                          ? SanitizeNamespace(hello.engine)
                          : server_.options_.namespace_override,
                      hello.model, hello.instance, hello.labels};
    EngineSeries* series = reg.GetOrCreate(id);
    if (series == nullptr) {
      // The registry counts it in series_rejected too; close this peer only.
      server_.stats_.CountError(IngestError::kSeriesLimit);
      spdlog::warn(
          "ingest: {}: closing the connection: {} (the engine "
          "series limit, --max-engine-series, is reached)",
          peer_, IngestErrorName(IngestError::kSeriesLimit));
      Close();
      return;
    }
    uint64_t space = 0;
    if (!server_.SpaceFor(hello, &space, &shared_space_)) {
      server_.stats_.CountError(IngestError::kSeriesLimit);
      spdlog::warn(
          "ingest: {}: closing the connection: {} ({} shared request-id "
          "spaces (HELLO scopes) are in use)",
          peer_, IngestErrorName(IngestError::kSeriesLimit),
          server_.max_shared_spaces_);
      Close();
      return;
    }
    family_ = hello.engine;
    model_ = hello.model;
    instance_ = hello.instance;
    client_key_ = hello.has_pid ? hello.pid : -int64_t(id_);
    source_ = Source{series, space};
    spdlog::info("ingest: {}: hello engine={} model={} instance={}{}{}", peer_,
                 hello.engine, hello.model, hello.instance,
                 hello.has_scope ? " scope=" : "", hello.scope);
  }

  void OnBatch(const Batch& batch) override {
    if (closing_) return;
    server_.stats_.CountFrame();
    server_.tracker_.ApplyBatch(source_, batch);
    server_.stats_.SetClientDropped(family_, model_, instance_, client_key_,
                                    batch.dropped_total);
  }

  void OnGoodbye() override { server_.stats_.CountFrame(); }

  void OnEventError(IngestError error) override {
    server_.stats_.CountError(error);
    // One line per connection, not per event: a broken client can send
    // millions.
    if (!logged_event_error_) {
      logged_event_error_ = true;
      spdlog::warn(
          "ingest: {}: skipped an invalid event ({}); further "
          "skips on this connection are only counted",
          peer_, IngestErrorName(error));
    }
  }

 private:
  static void OnAlloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
    auto* c = static_cast<Connection*>(h->data);
    std::span<char> space = c->decoder_.Prepare(suggested);
    *buf = uv_buf_init(space.data(), unsigned(space.size()));
  }

  static void OnRead(uv_stream_t* s, ssize_t nread, const uv_buf_t*) {
    auto* c = static_cast<Connection*>(s->data);
    if (nread < 0) {
      if (nread != UV_EOF) {
        spdlog::info("ingest: {}: read error: {}", c->peer_,
                     uv_strerror(int(nread)));
      } else if (c->decoder_.buffered_bytes() > 0) {
        spdlog::warn(
            "ingest: {}: closed in the middle of a frame ({} bytes "
            "discarded)",
            c->peer_, c->decoder_.buffered_bytes());
      }
      c->Close();
      return;
    }
    if (nread == 0 || c->closing_) return;
    if (!c->decoder_.Commit(size_t(nread), *c)) c->FrameError();
  }

  void FrameError() {
    const IngestError e = decoder_.error();
    server_.stats_.CountError(e);
    spdlog::warn("ingest: {}: closing the connection: {}", peer_,
                 IngestErrorName(e));
    Close();
  }

  // Names the peer for log lines; false when SO_PEERCRED failed.
  bool ReadPeerCredentials() {
    uv_os_fd_t fd;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (uv_fileno(reinterpret_cast<uv_handle_t*>(&pipe_), &fd) == 0 &&
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      uid_ = cred.uid;
      gid_ = cred.gid;
      peer_ = "peer#" + std::to_string(id_) +
              " pid=" + std::to_string(cred.pid) +
              " uid=" + std::to_string(cred.uid) +
              " gid=" + std::to_string(cred.gid);
      return true;
    }
    peer_ = "peer#" + std::to_string(id_);
    return false;
  }

  IngestServer& server_;
  const uint64_t id_;
  uv_pipe_t pipe_{};
  FrameDecoder decoder_;
  bool closing_ = false;
  bool logged_event_error_ = false;
  bool refused_ = false;  // closed at accept for the connection limit
  std::string peer_;
  uint32_t uid_ = 0;
  uint32_t gid_ = 0;
  Source source_{nullptr, 0};
  std::string family_, model_, instance_;
  int64_t client_key_ = 0;
  SharedSpaces::iterator shared_space_;
};

namespace {

// Resolves --ingest-group: a group name, or a number when no group has that
// name.
Status LookUpGroup(const std::string& name, gid_t* gid) {
  group grp{};
  group* found = nullptr;
  std::vector<char> buf(16 * 1024);
  int rc;
  while ((rc = getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(),
                          &found)) == ERANGE &&
         buf.size() < (1u << 20)) {
    buf.resize(buf.size() * 2);
  }
  if (rc == 0 && found != nullptr) {
    *gid = found->gr_gid;
    return Status::Ok();
  }
  uint32_t number = 0;
  auto [end, ec] =
      std::from_chars(name.data(), name.data() + name.size(), number);
  if (!name.empty() && ec == std::errc() && end == name.data() + name.size()) {
    *gid = number;
    return Status::Ok();
  }
  return Status::Error("--ingest-group: no group named \"" + name + "\"" +
                       (rc != 0 ? std::string(": ") + std::strerror(rc) : ""));
}

}  // namespace

IngestServer::IngestServer(uv_loop_t* loop, Registry& registry,
                           Tracker& tracker, IngestStats& stats,
                           IngestOptions options)
    : loop_(loop),
      registry_(registry),
      tracker_(tracker),
      stats_(stats),
      options_(std::move(options)),
      max_shared_spaces_(options_.max_shared_spaces != 0
                             ? options_.max_shared_spaces
                             : 4 * registry.options().max_engine_series) {}

IngestServer::~IngestServer() = default;

Status IngestServer::Listen(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return Status::Error("ingest socket path \"" + path + "\" is empty or " +
                         "longer than " +
                         std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::Error("ingest socket path \"" + path +
                           "\" exists and is not a socket");
    }
    // A socket file: live if someone accepts on it, stale otherwise.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    const bool live =
        probe >= 0 &&
        connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      return Status::Error("ingest socket \"" + path +
                           "\" is in use by a running process");
    }
    if (unlink(path.c_str()) != 0) {
      return Status::Error("cannot replace stale ingest socket \"" + path +
                           "\": " + std::strerror(errno));
    }
  }
  gid_t gid = 0;
  if (!options_.group.empty()) {
    if (Status s = LookUpGroup(options_.group, &gid); !s.ok()) return s;
  }
  int rc = uv_pipe_init(loop_, &listener_, 0);
  if (rc != 0)
    return Status::Error(std::string("uv_pipe_init: ") + uv_strerror(rc));
  listener_.data = this;
  listener_closed_ = false;
  // Created 0660 from the start (no window where others could connect).
  const mode_t old_mask = umask(0117);
  rc = uv_pipe_bind(&listener_, path.c_str());
  umask(old_mask);
  if (rc == 0) unlink_path_ = path;
  // The group is set between bind and listen: nobody can connect before.
  if (rc == 0 && !options_.group.empty() &&
      chown(path.c_str(), uid_t(-1), gid) != 0) {
    return Status::Error("--ingest-group: cannot give ingest socket \"" + path +
                         "\" the group \"" + options_.group + "\" (gid " +
                         std::to_string(gid) + "): " + std::strerror(errno));
  }
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 512,
                   OnConnection);
  }
  if (rc != 0) {
    return Status::Error("cannot listen on ingest socket \"" + path +
                         "\": " + uv_strerror(rc));
  }
  chmod(path.c_str(), 0660);
  listening_ = true;
  return Status::Ok();
}

Status IngestServer::Adopt(int fd) {
  if (!options_.group.empty()) {
    spdlog::warn(
        "--ingest-group {} is not applied to an inherited ingest "
        "socket (set SocketGroup= in the socket unit)",
        options_.group);
  }
  int rc = uv_pipe_init(loop_, &listener_, 0);
  if (rc == 0) {
    listener_.data = this;
    listener_closed_ = false;
    rc = uv_pipe_open(&listener_, fd);
  }
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 512,
                   OnConnection);
  }
  if (rc != 0) {
    return Status::Error(std::string("cannot use the inherited ingest "
                                     "socket: ") +
                         uv_strerror(rc));
  }
  listening_ = true;
  return Status::Ok();
}

void IngestServer::OnConnection(uv_stream_t* server, int status) {
  auto* self = static_cast<IngestServer*>(server->data);
  if (status != 0) {
    spdlog::warn("ingest: accept failed: {}", uv_strerror(status));
    return;
  }
  self->Accept();
}

void IngestServer::Accept() {
  auto* c = new Connection(*this, next_connection_id_++);
  uv_pipe_init(loop_, c->pipe(), 0);
  connections_.insert(c);
  stats_.SetConnections(stats_.connections() + 1);
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener_),
                reinterpret_cast<uv_stream_t*>(c->pipe())) != 0 ||
      closing_) {
    c->Close();
    return;
  }
  // Refused connections still closing do not take a place.
  const bool over_limit =
      connections_.size() - refused_open_ > options_.max_connections;
  if (!over_limit) limit_logged_ = false;
  c->Start(over_limit);
}

void IngestServer::Forget(Connection* c) {
  if (c->refused()) --refused_open_;
  if (c->shared_space() != shared_spaces_.end()) {
    --c->shared_space()->second.connections;
  }
  connections_.erase(c);
  stats_.SetConnections(stats_.connections() - 1);
  MaybeDone();
}

bool IngestServer::PeerAllowed(uint32_t uid, uint32_t gid) const {
  const auto& u = options_.allow_uids;
  const auto& g = options_.allow_gids;
  return std::find(u.begin(), u.end(), uid) != u.end() ||
         std::find(g.begin(), g.end(), gid) != g.end();
}

bool IngestServer::SpaceFor(const Hello& hello, uint64_t* space,
                            SharedSpaces::iterator* shared) {
  *shared = shared_spaces_.end();
  if (!hello.has_scope) {
    *space = next_space_++;
    return true;
  }
  auto key = std::make_tuple(hello.engine, hello.model, hello.scope);
  auto it = shared_spaces_.find(key);
  if (it == shared_spaces_.end()) {
    if (shared_spaces_.size() >= max_shared_spaces_) {
      // Make room: forget a scope no connection uses (its requests stay
      // tracked until retired; a later HELLO with it gets a new space).
      auto unused =
          std::find_if(shared_spaces_.begin(), shared_spaces_.end(),
                       [](const auto& e) { return e.second.connections == 0; });
      if (unused == shared_spaces_.end()) return false;
      shared_spaces_.erase(unused);
    }
    it = shared_spaces_.emplace(std::move(key), SharedSpace{next_space_++, 0})
             .first;
  }
  ++it->second.connections;
  *space = it->second.space;
  *shared = it;
  return true;
}

void IngestServer::Close(std::function<void()> done) {
  closing_ = true;
  done_ = std::move(done);
  if (!listener_closed_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), [](uv_handle_t* h) {
      auto* self = static_cast<IngestServer*>(h->data);
      self->listener_closed_ = true;
      self->MaybeDone();
    });
  }
  if (!unlink_path_.empty()) {
    unlink(unlink_path_.c_str());
    unlink_path_.clear();
  }
  // Copy: Drain() may close (and, later, erase) connections.
  std::vector<Connection*> open(connections_.begin(), connections_.end());
  for (Connection* c : open) c->Drain();
  MaybeDone();
}

void IngestServer::MaybeDone() {
  if (closing_ && listener_closed_ && connections_.empty() && done_) {
    auto done = std::move(done_);
    done_ = nullptr;
    done();
  }
}

}  // namespace tokenmeter::daemon
