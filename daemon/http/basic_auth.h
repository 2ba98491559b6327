// HTTP basic authentication (RFC 7617) against bcrypt hashes, as the
// exporter-toolkit web configuration's basic_auth_users.
//
// BasicAuth decides what a request's Authorization header is worth;
// BasicAuthVerifier runs the bcrypt checks it asks for on libuv's thread
// pool, so that the server's loop never waits for one.
//
// The cache (as exporter-toolkit's web/handler.go, keyed by user, hash and
// password): credentials that passed bcrypt are remembered as the
// HMAC-SHA256 of user, hash and password (each after its length) under a
// per-process random key, so a hit proves the password (another password,
// user or hash is another MAC) and a scraper pays bcrypt once per daemon
// start. At most Options::cache_entries are kept, the least recently used
// evicted first. Unlike exporter-toolkit, a failed check is never cached
// (wrong passwords could otherwise push the scrapers' entries out), so
// every wrong or unknown one costs a bcrypt (tens of milliseconds of CPU at
// cost 10, twice that per step up).
#ifndef TOKENMETER_DAEMON_HTTP_BASIC_AUTH_H_
#define TOKENMETER_DAEMON_HTTP_BASIC_AUTH_H_

#include <uv.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "daemon/base/status.h"

namespace tokenmeter::daemon::http {

class BasicAuth {
 public:
  // 32 bytes each, plus the map's and list's nodes: about 10 KiB when full.
  static constexpr size_t kDefaultCacheEntries = 64;

  struct Options {
    size_t cache_entries = kDefaultCacheEntries;  // At least 1.
  };

  // One request's credentials, parsed by Decide(): all that a bcrypt check
  // needs, owned, so that Run() may happen on another thread. The password
  // is wiped on destruction. Not copyable or movable (a moved short string
  // would leave the password behind).
  class Attempt {
   public:
    Attempt() = default;
    Attempt(const Attempt&) = delete;
    Attempt& operator=(const Attempt&) = delete;
    ~Attempt();

    // The bcrypt check (crypt_r): any thread, one at a time per Attempt;
    // tens of milliseconds of CPU at cost 10; reads only this object. True when
    // the password matches the user's hash; an unknown user is checked against
    // a dummy hash (the same cost, so timing does not tell users apart)
    // and is false.
    bool Run() const;

   private:
    friend class BasicAuth;
    using Mac = std::array<uint8_t, 32>;
    std::string password_;
    std::string hash_;
    bool known_user_ = false;
    Mac key_{};  // The cache key of these credentials.
  };

  // users: name -> bcrypt hash ($2a$, $2b$ or $2y$, 60 characters). A hash
  // crypt_r does not accept is an error naming the user.
  static Status Create(std::map<std::string, std::string> users,
                       std::unique_ptr<BasicAuth>* out);
  static Status Create(std::map<std::string, std::string> users,
                       const Options& options, std::unique_ptr<BasicAuth>* out);
  BasicAuth(const BasicAuth&) = delete;
  BasicAuth& operator=(const BasicAuth&) = delete;

  enum class Decision {
    kAllowed,      // A cache hit: these credentials passed bcrypt before.
    kDenied,       // No credential at all (missing, not Basic, malformed).
    kNeedsBcrypt,  // *attempt is filled: Run() it, then Remember() if true.
  };
  // Parses `authorization` (the Authorization header's value, "Basic
  // base64(user:password)") and looks it up in the cache. Microseconds (an
  // HMAC); no bcrypt. The thread that owns this object (the loop's).
  Decision Decide(std::string_view authorization, Attempt* attempt);

  // Caches `attempt`, whose Run() returned true, evicting the least
  // recently used entry when full. Same thread as Decide().
  void Remember(const Attempt& attempt);

  // Decide(), Run() on the calling thread, Remember(): true when
  // `authorization` holds a configured user and password. Blocks for a
  // bcrypt on a cache miss; for tests and tools (the server verifies
  // through BasicAuthVerifier). Same thread as Decide().
  bool Check(std::string_view authorization);

  // Credentials cached now (at most Options::cache_entries).
  size_t cached() const { return lru_.size(); }

  // True for a string crypt_r accepts as a bcrypt hash.
  static bool IsBcryptHash(const std::string& hash);

 private:
  using Mac = Attempt::Mac;
  struct MacHash {
    size_t operator()(const Mac& mac) const;
  };

  BasicAuth(std::map<std::string, std::string> users, const Options& options);
  Mac MacOf(std::string_view user, std::string_view hash,
            std::string_view password) const;

  const Options options_;
  std::map<std::string, std::string, std::less<>> users_;
  // Per-process random key of the cache's HMAC.
  std::array<uint8_t, 32> key_{};
  // The cached MACs, most recently used first, and an index into them.
  std::list<Mac> lru_;
  std::unordered_map<Mac, std::list<Mac>::iterator, MacHash> cache_;
};

// Runs the bcrypt checks BasicAuth asks for on libuv's thread pool
// (uv_queue_work), first come first served: at most
// Options::max_in_flight at once (by default 1, as exporter-toolkit runs one
// bcrypt at a time: a flood of wrong passwords takes at most one core, and
// libuv's other pool threads, 4 in all by default, stay free for snapshot
// writes); the others wait, at most Options::max_waiting of them; beyond
// that a check is answered kBusy at once (the server answers 503).
//
// Threads: the loop's thread only; only Attempt::Run() runs on the pool.
// Ownership: the verifier owns every job; a job is freed once its work is
// off the pool (in libuv's after-work callback), whether or not its caller
// still wants the answer.
class BasicAuthVerifier {
 public:
  enum class Result { kAllowed, kDenied, kBusy };
  // Called on the loop thread with a pending check's result.
  using Done = std::function<void(Result)>;
  class Job;

  struct Options {
    size_t max_in_flight = 1;  // At least 1.
    size_t max_waiting = 256;  // Beyond: kBusy.
  };

  // Borrows the loop, which must outlive the verifier.
  BasicAuthVerifier(uv_loop_t* loop, std::shared_ptr<BasicAuth> auth,
                    Options options);
  BasicAuthVerifier(const BasicAuthVerifier&) = delete;
  BasicAuthVerifier& operator=(const BasicAuthVerifier&) = delete;
  // Aborts while a job is on the pool (Close() and wait for drained()).
  ~BasicAuthVerifier();

  // The result of `authorization` when it is known at once (no credential:
  // kDenied; a cache hit: kAllowed; the queue full or the verifier closed:
  // kBusy); `done` is then never called. Otherwise nullopt and *job set:
  // the check waits or runs on the pool, and done(result) runs later on the
  // loop thread, exactly once, unless Abandon(*job) came first. The job
  // pointer is valid until done runs or Abandon() returns.
  std::optional<Result> Check(std::string_view authorization, Done done,
                              Job** job);

  // The caller no longer wants `job`'s result (its connection closed):
  // done is never called. A waiting job is freed at once; one handed to the
  // pool is left to finish (a password that passes is still cached, for
  // the caller's next try) and freed when it does.
  void Abandon(Job* job);

  // Frees every waiting job without calling its done (their callers must
  // not touch them again), asks libuv to cancel those on the pool, and
  // answers later checks kBusy. Returns true when no job is on the pool;
  // otherwise drained() runs on the loop thread once the last one is off
  // it. Call once.
  bool Close(std::function<void()> drained);

  size_t in_flight() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }

 private:
  static void Work(uv_work_t* work);
  static void AfterWork(uv_work_t* work, int status);
  void StartWaiting();
  void Finished(Job* job, int status);

  uv_loop_t* loop_;
  const std::shared_ptr<BasicAuth> auth_;
  const Options options_;
  // Jobs not yet handed to the pool, oldest first, and those on it; a job
  // moves from one list to the other by splice, keeping its iterator.
  std::list<std::unique_ptr<Job>> waiting_;
  std::list<std::unique_ptr<Job>> running_;
  bool closing_ = false;
  std::function<void()> drained_;
};

}  // namespace tokenmeter::daemon::http

#endif  // TOKENMETER_DAEMON_HTTP_BASIC_AUTH_H_
