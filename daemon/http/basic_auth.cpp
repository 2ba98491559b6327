#include "daemon/http/basic_auth.h"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

namespace tokenmeter::daemon::http {
namespace {

// A valid bcrypt hash of a random string: unknown users cost the same
// bcrypt check as known ones, so timing does not tell them apart.
constexpr const char* kDummyHash =
    "$2y$10$r/EnNjlHT2US6RvnESfW9uGtTl84pXp.J7DhHkjXHdmTqiByfuw1.";

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; nullopt on anything else.
std::optional<std::string> DecodeBase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      char c = in[i + j];
      if (c == '=' && i + 4 == in.size() && j >= 2) {
        v[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after '='
      v[j] = Base64Value(c);
      if (v[j] < 0) return std::nullopt;
    }
    uint32_t word = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) |
                    (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += static_cast<char>(word >> 16);
    if (pad < 2) out += static_cast<char>((word >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(word & 0xff);
  }
  return out;
}

bool StartsWithBasic(std::string_view s) {
  if (s.size() < 6) return false;
  static constexpr char kBasic[] = "basic";
  for (size_t i = 0; i < 5; ++i) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kBasic[i]) return false;
  }
  return s[5] == ' ';
}

}  // namespace

bool BasicAuth::IsBcryptHash(const std::string& hash) {
  if (hash.size() != 60 ||
      (hash.compare(0, 4, "$2a$") != 0 && hash.compare(0, 4, "$2b$") != 0 &&
       hash.compare(0, 4, "$2y$") != 0)) {
    return false;
  }
  // libxcrypt's own check of the setting (cost, salt). It also keeps
  // libcrypt linked under ASan, whose crypt_r interceptor would otherwise
  // satisfy the linker and leave the real crypt_r unloaded.
  if (crypt_checksalt(hash.c_str()) != CRYPT_SALT_OK) return false;
  // crypt_r accepts the setting only if it is well formed.
  auto data = std::make_unique<crypt_data>();
  const char* r = crypt_r("", hash.c_str(), data.get());
  return r != nullptr && r[0] == '$' && std::strlen(r) == hash.size();
}

BasicAuth::Attempt::~Attempt() {
  OPENSSL_cleanse(password_.data(), password_.size());
}

bool BasicAuth::Attempt::Run() const {
  auto data = std::make_unique<crypt_data>();  // about 32 KiB
  const char* r = crypt_r(password_.c_str(), hash_.c_str(), data.get());
  const bool matches = r != nullptr && std::strlen(r) == hash_.size() &&
                       CRYPTO_memcmp(r, hash_.data(), hash_.size()) == 0;
  OPENSSL_cleanse(data.get(), sizeof(crypt_data));
  return known_user_ && matches;
}

Status BasicAuth::Create(std::map<std::string, std::string> users,
                         std::unique_ptr<BasicAuth>* out) {
  return Create(std::move(users), Options(), out);
}

Status BasicAuth::Create(std::map<std::string, std::string> users,
                         const Options& options,
                         std::unique_ptr<BasicAuth>* out) {
  for (const auto& [user, hash] : users) {
    if (!IsBcryptHash(hash)) {
      return Status::Error(fmt::format(
          "basic_auth_users: the password of \"{}\" is not a bcrypt hash "
          "($2a$, $2b$ or $2y$; make one with htpasswd -nbBC 10 USER PASS)",
          user));
    }
    if (user.find(':') != std::string::npos) {
      return Status::Error(
          fmt::format("basic_auth_users: user name \"{}\" contains ':'", user));
    }
  }
  if (options.cache_entries == 0) std::abort();  // A caller's bug.
  out->reset(new BasicAuth(std::move(users), options));
  return Status::Ok();
}

BasicAuth::BasicAuth(std::map<std::string, std::string> users,
                     const Options& options)
    : options_(options), users_(users.begin(), users.end()) {
  if (RAND_bytes(key_.data(), static_cast<int>(key_.size())) != 1) {
    std::abort();  // No randomness: nothing secure can run.
  }
}

size_t BasicAuth::MacHash::operator()(const Mac& mac) const {
  // The MAC is keyed and uniform: any 8 of its bytes are a good hash.
  uint64_t h = 0;
  std::memcpy(&h, mac.data(), sizeof(h));
  return static_cast<size_t>(h);
}

BasicAuth::Mac BasicAuth::MacOf(std::string_view user, std::string_view hash,
                                std::string_view password) const {
  // Each part after its length (8 bytes): one message per (user, hash,
  // password), whatever bytes the parts hold.
  std::string message;
  message.reserve(3 * sizeof(uint64_t) + user.size() + hash.size() +
                  password.size());
  for (std::string_view part : {user, hash, password}) {
    const uint64_t size = part.size();
    message.append(reinterpret_cast<const char*>(&size), sizeof(size));
    message.append(part);
  }
  Mac mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac.data(), &len);
  OPENSSL_cleanse(message.data(), message.size());
  return mac;
}

BasicAuth::Decision BasicAuth::Decide(std::string_view authorization,
                                      Attempt* attempt) {
  while (!authorization.empty() && authorization.front() == ' ') {
    authorization.remove_prefix(1);
  }
  if (!StartsWithBasic(authorization)) return Decision::kDenied;
  std::string_view encoded = authorization.substr(6);
  while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
  while (!encoded.empty() && encoded.back() == ' ') encoded.remove_suffix(1);
  std::optional<std::string> decoded = DecodeBase64(encoded);
  if (!decoded) return Decision::kDenied;
  const std::string_view user_pass = *decoded;
  const size_t colon = user_pass.find(':');
  // crypt_r reads a C string: a NUL inside would cut the password short.
  if (colon == std::string_view::npos ||
      user_pass.find('\0', colon) != std::string_view::npos) {
    OPENSSL_cleanse(decoded->data(), decoded->size());
    return Decision::kDenied;
  }
  const std::string_view user = user_pass.substr(0, colon);
  const std::string_view password = user_pass.substr(colon + 1);
  auto it = users_.find(user);
  attempt->known_user_ = it != users_.end();
  attempt->hash_ = attempt->known_user_ ? it->second : kDummyHash;
  attempt->password_.assign(password);
  attempt->key_ = MacOf(user, attempt->hash_, password);
  OPENSSL_cleanse(decoded->data(), decoded->size());
  if (attempt->known_user_) {
    auto cached = cache_.find(attempt->key_);
    if (cached != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, cached->second);
      return Decision::kAllowed;
    }
  }
  return Decision::kNeedsBcrypt;
}

void BasicAuth::Remember(const Attempt& attempt) {
  if (!attempt.known_user_) return;
  auto cached = cache_.find(attempt.key_);
  if (cached != cache_.end()) {
    lru_.splice(lru_.begin(), lru_, cached->second);
    return;
  }
  if (lru_.size() >= options_.cache_entries) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(attempt.key_);
  cache_.emplace(attempt.key_, lru_.begin());
}

bool BasicAuth::Check(std::string_view authorization) {
  Attempt attempt;
  switch (Decide(authorization, &attempt)) {
    case Decision::kAllowed:
      return true;
    case Decision::kDenied:
      return false;
    case Decision::kNeedsBcrypt:
      break;
  }
  if (!attempt.Run()) return false;
  Remember(attempt);
  return true;
}

// One check: its Attempt, its caller's callback (empty once abandoned) and
// the libuv request that carries it to the pool.
class BasicAuthVerifier::Job {
 public:
  explicit Job(BasicAuthVerifier* verifier) : verifier(verifier) {
    work.data = this;
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  BasicAuthVerifier* const verifier;
  uv_work_t work{};
  BasicAuth::Attempt attempt;
  Done done;
  bool running = false;
  // Written on the pool thread; read in the after-work callback, which
  // libuv runs on the loop thread after the work callback returned.
  bool matched = false;
  std::list<std::unique_ptr<Job>>::iterator self;
};

BasicAuthVerifier::BasicAuthVerifier(uv_loop_t* loop,
                                     std::shared_ptr<BasicAuth> auth,
                                     Options options)
    : loop_(loop), auth_(std::move(auth)), options_(options) {
  if (auth_ == nullptr || options_.max_in_flight == 0) std::abort();
}

BasicAuthVerifier::~BasicAuthVerifier() {
  if (!running_.empty()) {
    spdlog::critical(
        "HTTP: basic auth verifier destroyed with {} checks "
        "on the thread pool",
        running_.size());
    std::abort();
  }
}

std::optional<BasicAuthVerifier::Result> BasicAuthVerifier::Check(
    std::string_view authorization, Done done, Job** job) {
  if (closing_) return Result::kBusy;
  auto owned = std::make_unique<Job>(this);
  switch (auth_->Decide(authorization, &owned->attempt)) {
    case BasicAuth::Decision::kAllowed:
      return Result::kAllowed;
    case BasicAuth::Decision::kDenied:
      return Result::kDenied;
    case BasicAuth::Decision::kNeedsBcrypt:
      break;
  }
  if (running_.size() >= options_.max_in_flight &&
      waiting_.size() >= options_.max_waiting) {
    return Result::kBusy;
  }
  owned->done = std::move(done);
  *job = owned.get();
  waiting_.push_back(std::move(owned));
  (*job)->self = std::prev(waiting_.end());
  StartWaiting();
  return std::nullopt;
}

void BasicAuthVerifier::StartWaiting() {
  while (!closing_ && running_.size() < options_.max_in_flight &&
         !waiting_.empty()) {
    auto it = waiting_.begin();
    Job* job = it->get();
    running_.splice(running_.end(), waiting_, it);  // `self` stays valid.
    job->running = true;
    if (uv_queue_work(loop_, &job->work, &BasicAuthVerifier::Work,
                      &BasicAuthVerifier::AfterWork) != 0) {
      std::abort();  // Only for a null work callback.
    }
  }
}

void BasicAuthVerifier::Work(uv_work_t* work) {
  auto* job = static_cast<Job*>(work->data);
  job->matched = job->attempt.Run();
}

void BasicAuthVerifier::AfterWork(uv_work_t* work, int status) {
  auto* job = static_cast<Job*>(work->data);
  job->verifier->Finished(job, status);
}

void BasicAuthVerifier::Finished(Job* job, int status) {
  // UV_ECANCELED: cancelled before a pool thread took it; never ran.
  const bool allowed = status == 0 && job->matched;
  if (allowed) auth_->Remember(job->attempt);
  Done done = std::move(job->done);
  running_.erase(job->self);  // Frees the job, wiping the password.
  StartWaiting();
  std::function<void()> drained;
  if (closing_ && running_.empty()) drained = std::move(drained_);
  // Either callback may end in the server's destruction: nothing after.
  if (done) done(allowed ? Result::kAllowed : Result::kDenied);
  if (drained) drained();
}

void BasicAuthVerifier::Abandon(Job* job) {
  if (!job->running) {
    waiting_.erase(job->self);  // Frees the job.
    return;
  }
  // Not cancelled: it takes at most one bcrypt, and a password that
  // passes is cached for the caller's next try.
  job->done = nullptr;
}

bool BasicAuthVerifier::Close(std::function<void()> drained) {
  closing_ = true;
  waiting_.clear();
  for (auto& job : running_) {
    job->done = nullptr;
    uv_cancel(reinterpret_cast<uv_req_t*>(&job->work));
  }
  if (running_.empty()) return true;
  drained_ = std::move(drained);
  return false;
}

}  // namespace tokenmeter::daemon::http
