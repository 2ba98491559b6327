#include "daemon/ingest/ingest_server.h"

#include <grp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "daemon/base/state_io.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/lora.h"
#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {
namespace {

// Accepts per loop iteration: the rest wait for the next one (the poll is
// level-triggered), so a connection storm cannot starve scrapes.
constexpr int kAcceptsPerWake = 128;
// How long accepting pauses after an error that retrying at once would
// only repeat (ENOBUFS, ENOMEM, or EMFILE with no spare descriptor).
constexpr uint64_t kAcceptRetryMs = 100;

// Each failure that pauses accepting says so; running out of descriptors
// is said by the fd_limit refusals instead.
void LogAcceptFailure(net::AcceptFailure failure, int err) {
  switch (failure) {
    case net::AcceptFailure::kPoll:
      spdlog::warn("ingest: polling the listener failed: {}; retrying in {} ms",
                   uv_strerror(err), kAcceptRetryMs);
      return;
    case net::AcceptFailure::kAccept:
    case net::AcceptFailure::kSpareNoHelp:
      spdlog::warn("ingest: accept failed: {}; retrying in {} ms",
                   std::strerror(-err), kAcceptRetryMs);
      return;
    case net::AcceptFailure::kOutOfFds:
      return;
  }
}

// "peer#7 pid=4711 uid=1001 gid=1001" (or "peer#7" when SO_PEERCRED
// fails; then *cred is left alone and false returned).
bool NamePeer(int fd, uint64_t id, std::string* name, ucred* cred) {
  ucred c{};
  socklen_t len = sizeof c;
  if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) == 0) {
    *cred = c;
    *name = "peer#" + std::to_string(id) + " pid=" + std::to_string(c.pid) +
            " uid=" + std::to_string(c.uid) + " gid=" + std::to_string(c.gid);
    return true;
  }
  *name = "peer#" + std::to_string(id);
  return false;
}

// Makes room for one more entry in a map of values with `connections`:
// at `cap` entries, erases one that no connection uses. False when all are
// in use.
template <typename Map>
bool MakeRoom(Map& m, size_t cap) {
  if (m.size() < cap) return true;
  auto unused = std::find_if(m.begin(), m.end(), [](const auto& e) {
    return e.second.connections == 0;
  });
  if (unused == m.end()) return false;
  m.erase(unused);
  return true;
}

// MakeRoom() for the sessions: an unused one whose client said GOODBYE
// first (its client closed and never replays), else any unused one (whose
// client may yet come back to replay: forgotten, its replay would be
// applied again).
template <typename Map>
bool MakeSessionRoom(Map& m, size_t cap) {
  if (m.size() < cap) return true;
  auto ended = std::find_if(m.begin(), m.end(), [](const auto& e) {
    return e.second.connections == 0 && e.second.goodbye;
  });
  if (ended == m.end()) return MakeRoom(m, cap);
  m.erase(ended);
  return true;
}

uint64_t SoftFdLimit() {
  rlimit rl{};
  return getrlimit(RLIMIT_NOFILE, &rl) == 0 ? uint64_t(rl.rlim_cur) : 0;
}

}  // namespace

// One engine connection. Owns its uv_pipe_t; freed in the close callback.
class IngestServer::Connection : public FrameSink {
 public:
  Connection(IngestServer& server, uint64_t id)
      : server_(server),
        id_(id),
        decoder_(server.options_.limits),
        shared_space_(server.shared_spaces_.end()),
        session_(server.sessions_.end()) {
    pipe_.data = this;
  }

  uv_pipe_t* pipe() { return &pipe_; }
  bool refused() const { return refused_; }
  // Counted in uid_connections_ under uid().
  bool counts_uid() const { return counts_uid_; }
  uint32_t uid() const { return uid_; }
  // Where this connection is in awaiting_hello_ (valid while awaiting()).
  bool awaiting() const { return awaiting_; }
  std::list<Connection*>::iterator hello_wait() const { return hello_wait_; }
  uint64_t hello_deadline_ms() const { return hello_deadline_ms_; }
  void MarkAwaiting(std::list<Connection*>::iterator it, uint64_t deadline_ms) {
    awaiting_ = true;
    hello_wait_ = it;
    hello_deadline_ms_ = deadline_ms;
  }
  void MarkNotAwaiting() { awaiting_ = false; }
  // The shared request-id space this connection holds, or end().
  SharedSpaces::iterator shared_space() const { return shared_space_; }
  // The ack session this connection is in, or end().
  Sessions::iterator session() const { return session_; }

  // A snapshot that holds more of this connection's session is on disk.
  void OnSnapshotWritten() {
    uint64_t seq;
    if (session_ == server_.sessions_.end() ||
        !session_->second.AckSeq(true, &seq) || (acked_any_ && seq == acked_)) {
      return;
    }
    ack_due_ = true;
    SendAck();
  }

  // over_limit: accepted while max_connections others were open.
  void Start(bool over_limit) {
    const bool known = ReadPeerCredentials();
    const IngestOptions& o = server_.options_;
    if (over_limit) {
      Refuse(IngestError::kConnectionLimit, &server_.limit_logged_,
             fmt::format("{} engine connections open, --max-connections",
                         o.max_connections));
      return;
    }
    if ((!o.allow_uids.empty() || !o.allow_gids.empty()) &&
        !(known && server_.PeerAllowed(uid_, gid_))) {
      Refuse(IngestError::kPeerNotAllowed, nullptr,
             known ? "uid and gid not in --allow-uids/--allow-gids"
                   : "peer credentials unavailable");
      return;
    }
    if (known) {
      auto it = server_.uid_connections_.find(uid_);
      if (it != server_.uid_connections_.end() &&
          it->second >= o.max_connections_per_uid) {
        Refuse(IngestError::kUidConnectionLimit, &server_.uid_limit_logged_,
               fmt::format("{} connections of uid {} open, "
                           "--max-connections-per-uid",
                           it->second, uid_));
        return;
      }
      server_.uid_limit_logged_ = false;
      ++server_.uid_connections_[uid_];
      counts_uid_ = true;
    }
    server_.AwaitHello(this);
    uv_read_start(reinterpret_cast<uv_stream_t*>(&pipe_), OnAlloc, OnRead);
  }

  // The HELLO timer found this connection without a HELLO: close it.
  void HelloTimeout() {
    server_.stats_.CountError(IngestError::kHelloTimeout);
    if (!server_.hello_timeout_logged_) {
      server_.hello_timeout_logged_ = true;
      spdlog::warn(
          "ingest: {}: closing the connection: {} (no HELLO within {} s, "
          "--hello-timeout; {} bytes received); more are counted, not "
          "logged, until a connection sends HELLO",
          peer_, IngestErrorName(IngestError::kHelloTimeout),
          double(server_.options_.hello_timeout_ns) / 1e9,
          decoder_.buffered_bytes());
    }
    Close();
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
      FinalAck(fd);
    }
    Close();
  }

  // At a graceful stop without a state directory: the ACK of what was just
  // drained, so that the client does not replay it to the next daemon
  // (which would apply it again). Best effort, one non-blocking send; not
  // when an ACK is part-written (the stream would interleave). With a state
  // directory the replay is skipped as duplicate by the next daemon, which
  // loads the snapshot written at stop.
  void FinalAck(int fd) {
    if (!ack_due_ || ack_writing_ || server_.options_.ack_after_snapshot) {
      return;
    }
    uint64_t seq;
    if (!session_->second.AckSeq(false, &seq)) return;
    const size_t n = EncodeAck(seq);
    (void)send(fd, ack_buf_, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  // [3, seq] into ack_buf_; returns its size.
  size_t EncodeAck(uint64_t seq) {
    size_t n = 0;
    ack_buf_[n++] = char(0x92);  // fixarray of 2
    ack_buf_[n++] = char(TM_FRAME_ACK);
    if (seq < 0x80) {
      ack_buf_[n++] = char(seq);
    } else {
      ack_buf_[n++] = char(0xcf);  // uint64, big-endian
      for (int shift = 56; shift >= 0; shift -= 8) {
        ack_buf_[n++] = char((seq >> shift) & 0xff);
      }
    }
    return n;
  }

  void Close() {
    if (closing_) return;
    closing_ = true;
    server_.StopAwaitingHello(this);
    uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), [](uv_handle_t* h) {
      auto* c = static_cast<Connection*>(h->data);
      IngestServer& server = c->server_;
      server.Forget(c);
      delete c;
    });
  }

  // A HELLO this daemon cannot take: counted, logged with why, closed.
  void RefuseHello(IngestError reason, std::string_view why) {
    server_.stats_.CountError(reason);
    spdlog::warn("ingest: {}: closing the connection: {} ({})", peer_,
                 IngestErrorName(reason), why);
    Close();
  }

  // FrameSink.
  void OnHello(const Hello& hello) override {
    Registry& reg = server_.registry_;
    server_.stats_.CountFrame();
    server_.StopAwaitingHello(this);
    server_.hello_timeout_logged_ = false;
    const Profile profile =
        !hello.profile.empty()     ? *ParseProfile(hello.profile)
        : server_.options_.profile ? *server_.options_.profile
                                   : AutoProfile(hello.engine);
    SeriesIdentity id{ProfileNamespace(profile, hello.engine,
                                       server_.options_.namespace_override),
                      hello.model, hello.instance, hello.labels, profile};
    if (const std::string_view clash = server_.LabelClash(hello);
        !clash.empty()) {
      RefuseHello(IngestError::kReservedLabel,
                  fmt::format("HELLO label \"{}\" is a label the daemon "
                              "sets on this series",
                              clash));
      return;
    }
    if (reg.NamespaceConflict(id)) {
      RefuseHello(IngestError::kBadHello,
                  fmt::format("profile {} in namespace \"{}\", which holds "
                              "series of another profile; give these "
                              "engines --profile or --namespace apart",
                              ProfileName(profile), id.ns));
      return;
    }
    EngineSeries* series = reg.GetOrCreate(id);
    if (series == nullptr) {
      // The registry counts it in series_rejected too; close this peer only.
      RefuseHello(IngestError::kSeriesLimit,
                  "the engine series limit, --max-engine-series, is reached");
      return;
    }
    uint64_t space = 0;
    if (!server_.SpaceFor(hello, &space, &shared_space_)) {
      RefuseHello(IngestError::kSeriesLimit,
                  fmt::format("{} shared request-id spaces (HELLO scopes) "
                              "are in use",
                              server_.max_shared_spaces_));
      return;
    }
    if (hello.ack && !server_.SessionFor(hello, &session_)) {
      RefuseHello(IngestError::kSeriesLimit,
                  fmt::format("{} acknowledged sessions are open",
                              server_.max_shared_spaces_));
      return;
    }
    // Accepted: its dropped informing fields count (a refused HELLO counts
    // once, under its reason).
    server_.stats_.CountErrors(IngestError::kBadField, hello.bad_fields);
    LogBadFields(hello.bad_fields);
    series->set_hello_engine(hello.engine);
    if (hello.has_cache_config) {
      series->part<CacheConfigPart>().Set(hello.cache_config);
    }
    LoraPart& lora = series->part<LoraPart>();
    if (hello.has_max_lora) lora.SetMaxLora(hello.max_lora);
    lora.InitTime(server_.tracker_.clock().UnixNowS());
    family_ = hello.engine;
    model_ = hello.model;
    instance_ = hello.instance;
    client_key_ = hello.has_pid ? hello.pid : -int64_t(id_);
    source_ = Source{series, space};
    spdlog::info("ingest: {}: hello engine={} model={} instance={}{}{}{}{}",
                 peer_, hello.engine, hello.model, hello.instance,
                 hello.has_scope ? " scope=" : "", hello.scope,
                 hello.has_session ? fmt::format(" session={}", hello.session)
                                   : std::string(),
                 hello.ack ? " ack" : "");
    // ACK at HELLO: answered now, before a BATCH that came in the same read
    // is applied, so that the answer is what the session held at HELLO;
    // those batches are acked after the read.
    if (hello.ack) SendAck();
  }

  void OnBatch(const Batch& batch) override {
    if (closing_) {
      ForgetEventErrors();
      return;
    }
    server_.stats_.CountFrame();
    if (session_ != server_.sessions_.end()) {
      Session& s = session_->second;
      if (s.applied_any && batch.seq <= s.highest_seq) {
        // A replay of what this session already delivered: its skipped
        // events were counted when it was applied.
        server_.stats_.CountDuplicateBatch();
        ForgetEventErrors();
      } else {
        Apply(batch);
        s.highest_seq = batch.seq;
        s.applied_any = true;
      }
      // With a state directory the ACK waits for the snapshot.
      if (!server_.options_.ack_after_snapshot) ack_due_ = true;
    } else {
      Apply(batch);
    }
    if (!drops_resolved_) {
      drops_resolved_ = true;
      drops_ = server_.stats_.DropsFor(family_, model_, instance_);
    }
    server_.stats_.SetClientDropped(drops_, client_key_, batch.dropped_total);
  }

  void OnGoodbye() override {
    server_.stats_.CountFrame();
    // The client closes: it replays nothing more in this session, which
    // is the first to go when the sessions are at their cap.
    if (session_ != server_.sessions_.end()) session_->second.goodbye = true;
  }

  // Applies a batch; counts the events the decoder skipped and the tracker
  // the optional fields it dropped from the events it applies (once per
  // batch applied: not again for a replay already applied).
  void Apply(const Batch& batch) {
    CountEventErrors();
    LogBadFields(batch.bad_fields);
    server_.tracker_.ApplyBatch(source_, batch);
  }

  // The events of the BATCH being decoded that the decoder skipped
  // (OnEventError(), which comes before its OnBatch()): counted when the
  // batch is applied, forgotten when it is not (a replay, a closing
  // connection). One line per connection, not per event: a broken client
  // can send millions.
  void CountEventErrors() {
    if (!batch_has_errors_) return;
    batch_has_errors_ = false;
    for (size_t e = 0; e < batch_errors_.size(); ++e) {
      if (batch_errors_[e] == 0) continue;
      const IngestError error = IngestError(e);
      server_.stats_.CountErrors(error, batch_errors_[e]);
      batch_errors_[e] = 0;
      if (!logged_event_error_) {
        logged_event_error_ = true;
        spdlog::warn(
            "ingest: {}: skipped an invalid event ({}); further "
            "skips on this connection are only counted",
            peer_, IngestErrorName(error));
      }
    }
  }
  void ForgetEventErrors() {
    if (!batch_has_errors_) return;
    batch_has_errors_ = false;
    batch_errors_.fill(0);
  }

  // Optional fields the decoder dropped (partial acceptance): logged once
  // per connection.
  void LogBadFields(uint32_t n) {
    if (n != 0 && !logged_bad_field_) {
      logged_bad_field_ = true;
      spdlog::warn(
          "ingest: {}: dropped an optional field with a wrong type or out of "
          "its range ({}); further drops on this connection are only counted",
          peer_, IngestErrorName(IngestError::kBadField));
    }
  }

  void OnEventError(IngestError error) override {
    ++batch_errors_[size_t(error)];
    batch_has_errors_ = true;
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
    if (!c->decoder_.Commit(size_t(nread), *c)) {
      c->FrameError();
      return;
    }
    c->SendAck();
  }

  // Writes [3, highest applied seq] if an ACK is due and none is being
  // written; what the socket does not take at once goes out with
  // uv_write, and the next ACK waits for it. The first ACK of an `ack`
  // connection answers its HELLO (protocol 1.2, "ACK at HELLO"), sent from
  // OnHello(), before any BATCH after the HELLO is applied: [3, seq] as
  // AckSeq() says (with a state directory, what a snapshot on disk holds),
  // else [3, nil].
  void SendAck() {
    const bool answer = !answered_ && session_ != server_.sessions_.end();
    if ((!ack_due_ && !answer) || ack_writing_ || closing_) return;
    uint64_t seq;
    const bool any =
        session_->second.AckSeq(server_.options_.ack_after_snapshot, &seq);
    if (!any && !answer) return;
    answered_ = true;
    ack_due_ = false;
    size_t n = 3;
    if (any) {
      acked_ = seq;
      acked_any_ = true;
      n = EncodeAck(seq);
    } else {
      // [3, nil]: fixarray of 2, the frame type, nil.
      ack_buf_[0] = char(0x92);
      ack_buf_[1] = char(TM_FRAME_ACK);
      ack_buf_[2] = char(0xc0);
    }
    uv_buf_t buf = uv_buf_init(ack_buf_, unsigned(n));
    auto* stream = reinterpret_cast<uv_stream_t*>(&pipe_);
    const int wrote = uv_try_write(stream, &buf, 1);
    if (wrote == int(n)) return;
    if (wrote < 0 && wrote != UV_EAGAIN) {
      spdlog::info("ingest: {}: cannot send an ACK: {}", peer_,
                   uv_strerror(wrote));
      Close();
      return;
    }
    if (wrote > 0)
      buf = uv_buf_init(ack_buf_ + wrote, unsigned(n) - unsigned(wrote));
    ack_writing_ = true;
    ack_req_.data = this;
    const int rc =
        uv_write(&ack_req_, stream, &buf, 1, [](uv_write_t* req, int status) {
          auto* c = static_cast<Connection*>(req->data);
          c->ack_writing_ = false;
          if (status < 0) {
            if (status != UV_ECANCELED && !c->closing_) {
              spdlog::info("ingest: {}: cannot send an ACK: {}", c->peer_,
                           uv_strerror(status));
              c->Close();
            }
            return;
          }
          c->SendAck();  // one that came due meanwhile
        });
    if (rc != 0) {
      ack_writing_ = false;
      spdlog::info("ingest: {}: cannot send an ACK: {}", peer_,
                   uv_strerror(rc));
      Close();
    }
  }

  // Closes a connection at accept, before any byte is read. `logged`: the
  // server's once-per-burst flag for this reason (nullptr: log each).
  void Refuse(IngestError reason, bool* logged, const std::string& why) {
    refused_ = true;
    ++server_.refused_open_;
    server_.stats_.CountError(reason);
    if (logged == nullptr) {
      spdlog::warn("ingest: {}: closing the connection: {} ({})", peer_,
                   IngestErrorName(reason), why);
    } else if (!*logged) {
      *logged = true;
      spdlog::warn(
          "ingest: {}: closing the connection: {} ({}); more refusals are "
          "counted, not logged, until one is accepted",
          peer_, IngestErrorName(reason), why);
    }
    Close();
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
    uv_os_fd_t fd = -1;
    ucred cred{};
    uv_fileno(reinterpret_cast<uv_handle_t*>(&pipe_), &fd);
    if (!NamePeer(fd, id_, &peer_, &cred)) return false;
    uid_ = cred.uid;
    gid_ = cred.gid;
    return true;
  }

  IngestServer& server_;
  const uint64_t id_;
  uv_pipe_t pipe_{};
  FrameDecoder decoder_;
  bool closing_ = false;
  // The current BATCH's skipped events by error (CountEventErrors()).
  std::array<uint32_t, size_t(IngestError::kCount)> batch_errors_{};
  bool batch_has_errors_ = false;
  bool logged_event_error_ = false;
  bool logged_bad_field_ = false;
  bool refused_ = false;  // closed at accept (a limit, the allow-list)
  bool counts_uid_ = false;
  bool awaiting_ = false;
  std::list<Connection*>::iterator hello_wait_;
  uint64_t hello_deadline_ms_ = 0;  // uv_now() scale
  std::string peer_;
  uint32_t uid_ = 0;
  uint32_t gid_ = 0;
  Source source_{nullptr, 0};
  std::string family_, model_, instance_;
  int64_t client_key_ = 0;
  // Where this connection's drop reports go (resolved at its first BATCH:
  // an identity appears in the exposition once it has reported).
  IngestStats::Drops* drops_ = nullptr;
  bool drops_resolved_ = false;
  SharedSpaces::iterator shared_space_;
  Sessions::iterator session_;
  // ACKs: one is due (batches applied or skipped since the last), one is
  // being written (ack_buf_ and ack_req_ in use).
  bool ack_due_ = false;
  bool ack_writing_ = false;
  bool answered_ = false;  // the HELLO answer was sent (the first ACK)
  uint64_t acked_ = 0;     // the seq of the latest ACK, when acked_any_
  bool acked_any_ = false;
  uv_write_t ack_req_{};
  char ack_buf_[16];
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

IngestServer::~IngestServer() {
  // Close() has run (the contract); this only matters after a failed
  // Listen() that was never followed by Close().
  if (listen_fd_ >= 0) close(listen_fd_);
}

Status IngestServer::Listen(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return Status::Error("ingest socket path \"" + path + "\" is empty or " +
                         "longer than " +
                         std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::Error("ingest socket path \"" + path +
                           "\" exists and is not a socket");
    }
    // A socket file: live if someone accepts on it, stale otherwise.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
  const auto failed = [&path](const char* what) {
    return Status::Error("cannot listen on ingest socket \"" + path +
                         "\": " + what + ": " + std::strerror(errno));
  };
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return failed("socket");
  // Created 0660 from the start (no window where others could connect).
  const mode_t old_mask = umask(0117);
  const int rc =
      bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old_mask);
  if (rc != 0) {
    const int err = errno;
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "."
                            : slash == 0               ? "/"
                                                       : path.substr(0, slash);
    // The usual two, said in the operator's terms.
    if (err == ENOENT) {
      const bool default_dir = dir == "/run/tokenmeter";
      return Status::Error("cannot listen on ingest socket \"" + path +
                           "\": its directory \"" + dir +
                           "\" does not exist (" +
                           (default_dir ? "tokenmeterd.socket and tokenmeter's "
                                          "tmpfiles.d entry create it; "
                                        : "") +
                           "create it, or choose another path with --ingest)");
    }
    if (err == EACCES) {
      return Status::Error("cannot listen on ingest socket \"" + path +
                           "\": permission denied: this user (uid " +
                           std::to_string(geteuid()) +
                           ") cannot create a file in \"" + dir + "\"");
    }
    return failed("bind");
  }
  unlink_path_ = path;
  // The group is set between bind and listen: nobody can connect before.
  if (!options_.group.empty() && chown(path.c_str(), uid_t(-1), gid) != 0) {
    return Status::Error("--ingest-group: cannot give ingest socket \"" + path +
                         "\" the group \"" + options_.group + "\" (gid " +
                         std::to_string(gid) + "): " + std::strerror(errno));
  }
  if (listen(listen_fd_, 512) != 0) return failed("listen");
  chmod(path.c_str(), 0660);
  return StartListening(listen_fd_);
}

Status IngestServer::Adopt(int fd) {
  if (!options_.group.empty()) {
    spdlog::warn(
        "--ingest-group {} is not applied to an inherited ingest "
        "socket (set SocketGroup= in the socket unit)",
        options_.group);
  }
  listen_fd_ = fd;
  // Already listening under socket activation; listen() again only sets
  // the backlog (and makes a bound socket listen).
  if (listen(fd, 512) != 0) {
    return Status::Error(std::string("cannot use the inherited ingest "
                                     "socket: ") +
                         std::strerror(errno));
  }
  return StartListening(fd);
}

Status IngestServer::StartListening(int fd) {
  net::Acceptor::Callbacks callbacks;
  callbacks.accepted = [this](int connection_fd) {
    fd_limit_logged_ = false;
    Accept(connection_fd);
  };
  callbacks.shed = [this](int connection_fd, int err) {
    RefuseForFdLimit(connection_fd, err);
  };
  callbacks.failed = &LogAcceptFailure;
  net::AcceptorOptions acceptor_options;
  acceptor_options.max_accepts_per_wake = kAcceptsPerWake;
  acceptor_options.retry_ms = kAcceptRetryMs;
  auto acceptor = std::make_unique<net::Acceptor>(loop_, acceptor_options,
                                                  std::move(callbacks));
  if (const int rc = acceptor->OpenSpare(); rc != 0) {
    return Status::Error(std::string("cannot open /dev/null (the ingest "
                                     "listener's spare descriptor): ") +
                         std::strerror(-rc));
  }
  listen_fd_ = -1;  // The acceptor's from here on, closed on failure too.
  const int rc = acceptor->Start(fd);
  if (rc != 0) {
    return Status::Error(std::string("cannot poll the ingest socket: ") +
                         uv_strerror(rc));
  }
  acceptor_ = std::move(acceptor);
  uv_timer_init(loop_, &hello_timer_);
  hello_timer_.data = this;
  handles_open_ = true;
  return Status::Ok();
}

void IngestServer::RefuseForFdLimit(int fd, int err) {
  std::string peer;
  ucred cred{};
  NamePeer(fd, next_connection_id_++, &peer, &cred);
  stats_.CountError(IngestError::kFdLimit);
  if (!fd_limit_logged_) {
    fd_limit_logged_ = true;
    spdlog::warn(
        "ingest: {}: closing the connection: {} (accept: {}; the soft "
        "RLIMIT_NOFILE is {}); more refusals are counted, not logged, until "
        "an accept succeeds",
        peer, IngestErrorName(IngestError::kFdLimit), std::strerror(-err),
        SoftFdLimit());
  }
}

void IngestServer::Accept(int fd) {
  auto* c = new Connection(*this, next_connection_id_++);
  uv_pipe_init(loop_, c->pipe(), 0);
  connections_.insert(c);
  stats_.SetConnections(stats_.connections() + 1);
  if (uv_pipe_open(c->pipe(), fd) != 0) {
    close(fd);
    c->Close();
    return;
  }
  // Refused connections still closing do not take a place.
  const bool over_limit =
      connections_.size() - refused_open_ > options_.max_connections;
  if (!over_limit) limit_logged_ = false;
  c->Start(over_limit);
}

void IngestServer::AwaitHello(Connection* c) {
  const uint64_t timeout_ms =
      std::max<uint64_t>(1, (options_.hello_timeout_ns + 999'999) / 1'000'000);
  const bool was_empty = awaiting_hello_.empty();
  awaiting_hello_.push_back(c);
  c->MarkAwaiting(std::prev(awaiting_hello_.end()), uv_now(loop_) + timeout_ms);
  if (was_empty) ArmHelloTimer();
}

void IngestServer::StopAwaitingHello(Connection* c) {
  if (!c->awaiting()) return;
  awaiting_hello_.erase(c->hello_wait());
  c->MarkNotAwaiting();
  // The timer may fire early for a connection no longer waiting; it then
  // re-arms for the next one.
}

void IngestServer::ArmHelloTimer() {
  if (closing_ || !handles_open_) return;
  if (awaiting_hello_.empty()) {
    uv_timer_stop(&hello_timer_);
    return;
  }
  const uint64_t deadline = awaiting_hello_.front()->hello_deadline_ms();
  const uint64_t now = uv_now(loop_);
  uv_timer_start(&hello_timer_, OnHelloTimer,
                 deadline > now ? deadline - now : 0, 0);
}

void IngestServer::OnHelloTimer(uv_timer_t* timer) {
  auto* self = static_cast<IngestServer*>(timer->data);
  const uint64_t now = uv_now(self->loop_);
  while (!self->awaiting_hello_.empty() &&
         self->awaiting_hello_.front()->hello_deadline_ms() <= now) {
    // HelloTimeout() closes it, which takes it off the list.
    self->awaiting_hello_.front()->HelloTimeout();
  }
  self->ArmHelloTimer();
}

void IngestServer::Forget(Connection* c) {
  if (c->refused()) --refused_open_;
  if (c->counts_uid()) {
    auto it = uid_connections_.find(c->uid());
    if (it != uid_connections_.end() && --it->second == 0) {
      uid_connections_.erase(it);
    }
  }
  if (c->shared_space() != shared_spaces_.end()) {
    --c->shared_space()->second.connections;
  }
  if (c->session() != sessions_.end()) --c->session()->second.connections;
  connections_.erase(c);
  stats_.SetConnections(stats_.connections() - 1);
  MaybeDone();
}

std::string_view IngestServer::LabelClash(const Hello& hello) const {
  for (const auto& [name, value] : hello.labels) {
    for (const std::string& r : registry_.request_labels().names()) {
      if (name == r) return name;
    }
    for (const auto& e : hello.cache_config) {
      if (name == e.key) return name;
    }
  }
  return {};
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
  if (!hello.has_scope && !hello.has_session) {
    *space = next_space_++;
    return true;
  }
  auto key =
      std::make_tuple(hello.engine, hello.model,
                      hello.has_scope ? "s:" + hello.scope
                                      : "n:" + std::to_string(hello.session));
  auto it = shared_spaces_.find(key);
  if (it == shared_spaces_.end()) {
    // Forget a scope no connection uses (its requests stay tracked until
    // retired; a later HELLO with it gets a new space).
    if (!MakeRoom(shared_spaces_, max_shared_spaces_)) return false;
    it = shared_spaces_.emplace(std::move(key), SharedSpace{next_space_++, 0})
             .first;
  }
  ++it->second.connections;
  *space = it->second.space;
  *shared = it;
  return true;
}

bool IngestServer::SessionFor(const Hello& hello, Sessions::iterator* out) {
  auto key = std::make_tuple(hello.engine, hello.model, hello.session);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) {
    // Forget a session no connection uses: a replay of it, should one ever
    // come, would be applied again (one that said GOODBYE first).
    if (!MakeSessionRoom(sessions_, max_shared_spaces_)) return false;
    it = sessions_.emplace(std::move(key), Session{}).first;
  }
  it->second.goodbye = false;
  ++it->second.connections;
  *out = it;
  return true;
}

void IngestServer::SaveState(StateWriter& w) {
  w.U64(next_space_);
  w.U64(shared_spaces_.size());
  for (const auto& [key, shared] : shared_spaces_) {
    w.Str(std::get<0>(key));
    w.Str(std::get<1>(key));
    w.Str(std::get<2>(key));
    w.U64(shared.space);
  }
  w.U64(sessions_.size());
  for (auto& [key, s] : sessions_) {
    w.Str(std::get<0>(key));
    w.Str(std::get<1>(key));
    w.U64(std::get<2>(key));
    w.U64(s.highest_seq);
    w.Bool(s.applied_any);
    s.saved_seq = s.highest_seq;
    s.saved_any = s.applied_any;
  }
}

void IngestServer::LoadState(StateReader& r) {
  next_space_ = r.U64();
  const size_t spaces = r.Count(max_shared_spaces_, 20);
  for (size_t i = 0; i < spaces && r.ok(); ++i) {
    std::string engine = r.Str(TM_MAX_STRING_BYTES);
    std::string model = r.Str(TM_MAX_STRING_BYTES);
    std::string scope = r.Str(TM_MAX_STRING_BYTES + 2);
    const uint64_t space = r.U64();
    if (space >= next_space_) r.Fail();
    shared_spaces_.emplace(
        std::make_tuple(std::move(engine), std::move(model), std::move(scope)),
        SharedSpace{space, 0});
  }
  const size_t sessions = r.Count(max_shared_spaces_, 25);
  for (size_t i = 0; i < sessions && r.ok(); ++i) {
    std::string engine = r.Str(TM_MAX_STRING_BYTES);
    std::string model = r.Str(TM_MAX_STRING_BYTES);
    const uint64_t session = r.U64();
    Session s;
    s.highest_seq = s.durable_seq = s.saved_seq = r.U64();
    s.applied_any = s.durable_any = s.saved_any = r.Bool();
    sessions_.emplace(
        std::make_tuple(std::move(engine), std::move(model), session), s);
  }
}

void IngestServer::SnapshotWritten() {
  for (auto& [key, s] : sessions_) {
    if (!s.saved_any) continue;
    s.durable_seq = s.saved_seq;
    s.durable_any = true;
  }
  for (Connection* c : connections_) c->OnSnapshotWritten();
}

void IngestServer::Close(std::function<void()> done) {
  closing_ = true;
  done_ = std::move(done);
  if (handles_open_) {
    handles_open_ = false;
    closing_handles_ += 2;
    // Both close asynchronously (a started acceptor has handles open).
    acceptor_->Close([this] {
      --closing_handles_;
      MaybeDone();
    });
    uv_close(reinterpret_cast<uv_handle_t*>(&hello_timer_), [](uv_handle_t* h) {
      auto* self = static_cast<IngestServer*>(h->data);
      --self->closing_handles_;
      self->MaybeDone();
    });
  } else if (listen_fd_ >= 0) {
    close(listen_fd_);  // a Listen() that failed before the acceptor took it
    listen_fd_ = -1;
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
  if (closing_ && closing_handles_ == 0 && connections_.empty() && done_) {
    auto done = std::move(done_);
    done_ = nullptr;
    done();
  }
}

}  // namespace tokenmeter::daemon
