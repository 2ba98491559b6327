// Ingest throughput of tokenmeterd on one core (docs/performance.md,
// "tokenmeterd" / "Ingest").
//
// A sender process, pinned to one CPU, connects to a Unix socket, sends a
// HELLO and ARRIVED events for `--requests` request ids (untimed), waits
// for the receiver to have applied them, then streams `--events` TOKENS
// events in BATCH frames of `--batch` events as fast as the socket takes
// them. The request ids cycle over the arrived requests, so every TOKENS
// event is a real tracker lookup and, after each request's first token, an
// inter-token-latency observation. The frames are encoded up front with
// msgpack-c's packer (one cycle of batches that covers every request a whole
// number of times); only the 8-byte timestamps (and seq) are rewritten before
// each write, with the sender's CLOCK_MONOTONIC, so that they pass the
// daemon's +1 s / -1 h check and every inter-token interval is positive.
//
// Receivers, pinned to the other CPU (one at a time, runs interleaved):
//   ceiling  read() + msgpack-c's unpacker (msgpack_unpacker_next), counting
//            the events of each frame: what reading the socket and a generic
//            msgpack decode cost, with no tracking at all.
//   daemon   the real tokenmeterd binary (--ingest on a temp socket, --listen
//            127.0.0.1:0, --log-interval 0). Events are counted from its
//            /metrics, scraped only after the sender has written everything.
//   inproc   IngestServer + Tracker + Registry from tokenmeterd_core on a uv
//            loop in a child process, timed from inside the loop (a check on
//            the daemon figure that does not depend on scraping).
//
// Timing: from the moment the sender is told to go (the receiver having
// applied every ARRIVED) until the receiver has applied the last TOKENS
// event. For `daemon` the end is when a scrape that shows every event has
// returned (polled every 0.5 ms once the sender is done), so the figure is
// if anything pessimistic by one scrape.
//
// Two figures per run: events per second of wall clock over that span, and
// events per CPU-second of the receiver (its run time from
// /proc/PID/schedstat over the same span). On a machine shared with other
// work the receiver spends part of the run runnable but not running (the
// schedstat wait time, printed): the wall-clock figure then measures the
// share of the core it got, while the CPU-second figure is what one core
// does with the data. The two agree when the receiver has its core to itself
// and never idles waiting for the sender (idle = wall - run - wait, printed).
//
// Verification: a run counts only if the receiver applied exactly the events
// sent. For daemon and inproc that is tokenmeter_ingest_events_total by kind,
// no ingest error of any reason, the engine series' generation_tokens equal
// to the TOKENS events sent, every inter-token interval observed (or counted
// negative; reported), and every request still tracked. A run that fails is
// reported VOID and the program exits 1.
//
// --string-ids sends every request id as a 39-byte string shaped like
// vLLM's ("cmpl-" + 32 hex digits + "-0"), the tracker's string path.
// --profile NAME sends HELLO profile NAME (the verification reads that
// profile's names); --label-values N gives each ARRIVED the request label
// tenant="t<id % N>" and starts the daemon with --request-label tenant, so
// every TOKENS lands in one of N label cells (issue 14's cost check).
// --daemon-arg ARG (repeatable) appends ARG to the daemon's command line,
// e.g. the tracing flags (issue 30's cost check: the requests never finish
// here, so that measures what tracing adds to every event, the timeline's
// capture; a span's build and encoding per request is trace_bench's).
//
// Output: one line per run, then the medians, then "RESULT key=value" lines
// for bench/daemon/run_daemon_bench.sh.
#include <arpa/inet.h>
#include <fcntl.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/ingest/ingest_server.h"
#include "daemon/ingest/tracker.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/requests/request_keeper.h"
#include "daemon/store/registry.h"
#include "spdlog/spdlog.h"

namespace {

namespace td = tokenmeter::daemon;

constexpr int kTimeoutMs = 300'000;  // any one phase of a run

struct Options {
  std::string tokenmeterd;
  uint64_t events = 20'000'000;
  uint32_t requests = 10'000;
  uint32_t batch = 512;
  int reps = 5;
  std::vector<std::string> receivers = {"ceiling", "daemon", "inproc"};
  int receiver_cpu = 0;
  int sender_cpu = 1;
  // --profile: HELLO profile (empty: not sent, the vllm profile).
  std::string profile;
  // --label-values N: each ARRIVED carries request label tenant="t<i % N>"
  // and the daemon runs with --request-label tenant (0: no labels).
  uint32_t label_values = 0;
  // --daemon-arg ARG (repeatable): appended to tokenmeterd's command line
  // (e.g. --otlp-endpoint URL --trace-ratio 1 for the tracing cost).
  std::vector<std::string> daemon_args;
  // --inproc-keep-requests N: the inproc receiver's tracker gets the
  // requests API's keeper as the daemon's --keep-requests N adds it (0:
  // none, as PipelineOptions{} has it), so that an instruction-count run
  // (cachegrind on the inproc child) sees what the API adds per event.
  uint64_t inproc_keep_requests = 0;
  // --string-ids: request ids are 39-byte strings shaped like vLLM's
  // ("cmpl-" + 32 hex digits + "-0") instead of integers.
  bool string_ids = false;
};

// The metric prefix and the names the verification reads, per profile.
struct ProfileNames {
  std::string generation_tokens;  // counted per TOKENS ("" : not checked)
  std::string itl_count;          // one per TOKENS after the first
};
ProfileNames NamesFor(const std::string& profile) {
  if (profile == "sglang") {
    // SGLang counts tokens at FINISHED (none here); its ITL counts tokens,
    // one per TOKENS of n = 1.
    return {"", "sglang:inter_token_latency_seconds_count"};
  }
  if (profile == "lmdeploy") {
    return {"lmdeploy:generation_tokens_total",
            "lmdeploy:iter_token_latency_count"};
  }
  return {"bench:generation_tokens_total",
          "bench:inter_token_latency_seconds_count"};
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "ingest_bench: %s: %s\n", what, std::strerror(errno));
  std::fflush(stderr);
  _exit(2);
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) Die("sched_setaffinity");
}

void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      Die("write");
    }
    p += k;
    n -= size_t(k);
  }
}

void WriteAllV(int fd, iovec* iov, int cnt) {
  while (cnt > 0) {
    ssize_t k = writev(fd, iov, cnt);
    if (k < 0) {
      if (errno == EINTR) continue;
      Die("writev");
    }
    while (cnt > 0 && size_t(k) >= iov->iov_len) {
      k -= ssize_t(iov->iov_len);
      ++iov;
      --cnt;
    }
    if (cnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + k;
      iov->iov_len -= size_t(k);
    }
  }
}

// Reads exactly n bytes, waiting at most kTimeoutMs. False on EOF/timeout.
bool ReadMsg(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int r = poll(&pfd, 1, kTimeoutMs);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

// What a receiver reports at the end of a run.
struct Report {
  uint64_t end_ns = 0;  // the last TOKENS event applied
  uint64_t tokens = 0;  // TOKENS events applied
  uint64_t arrived = 0;
  uint64_t other_events = 0;
  uint64_t errors = 0;  // ingest errors of any reason
  uint64_t generation_tokens = 0;
  uint64_t itl_observed = 0;
  uint64_t itl_negative = 0;
  uint64_t tracked = 0;
  // The receiver's time on a CPU, and waiting for one (runnable but not
  // running: what other processes on its CPU cost it), during the run.
  uint64_t run_ns = 0;
  uint64_t wait_ns = 0;
  int ok = 0;  // the receiver saw the stream end cleanly
};

// Run and runqueue-wait nanoseconds of a process's main thread, from
// /proc/PID/schedstat ("self" for the caller).
struct Sched {
  uint64_t run_ns = 0;
  uint64_t wait_ns = 0;
};

Sched ReadSched(const std::string& pid) {
  Sched s;
  std::ifstream in("/proc/" + pid + "/schedstat");
  in >> s.run_ns >> s.wait_ns;
  return s;
}

void SetSchedDelta(const Sched& a, const Sched& b, Report* rep) {
  rep->run_ns = b.run_ns - a.run_ns;
  rep->wait_ns = b.wait_ns - a.wait_ns;
}

// ---------------------------------------------------------------------------
// Sender.

void PackStr(msgpack_packer* pk, std::string_view s) {
  msgpack_pack_str(pk, s.size());
  msgpack_pack_str_body(pk, s.data(), s.size());
}

// Request `id`'s id on the wire: the integer, or with --string-ids a
// 39-byte string shaped like vLLM's.
void PackRid(msgpack_packer* pk, const Options& o, uint64_t id) {
  if (!o.string_ids) {
    msgpack_pack_uint64(pk, id);
    return;
  }
  char buf[48];
  const int n = std::snprintf(buf, sizeof buf, "cmpl-%016llx%016llx-0",
                              0x5eed0000ull + (unsigned long long)(id),
                              (unsigned long long)(id * 0x9e3779b97f4a7c15ull));
  PackStr(pk, std::string_view(buf, size_t(n)));
}

void PutBe64(char* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

// One cycle of TOKENS batches, encoded once; timestamps and seq patched.
struct TokenCycle {
  std::vector<char> bytes;
  std::vector<size_t> batch_begin;  // per batch, and the end
  std::vector<uint32_t> t_off;      // every event's 8-byte t
  std::vector<size_t> t_begin;      // per batch into t_off, and the end
  std::vector<uint32_t> seq_off;    // per batch
};

int ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  for (int i = 0; i < 2000; ++i) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) Die("socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return fd;
    }
    close(fd);
    usleep(5000);
  }
  Die("connect to the ingest socket");
}

// The sender process. ctl_out: 'R' once HELLO and the arrivals are written,
// then 'D' once every TOKENS frame is written and the socket closed.
// ctl_in: 'G' starts the stream.
[[noreturn]] void RunSender(const Options& o, const std::string& path,
                            int ctl_in, int ctl_out) {
  Pin(o.sender_cpu);
  signal(SIGPIPE, SIG_IGN);
  const int fd = ConnectUnix(path);

  msgpack_sbuffer sbuf;
  msgpack_sbuffer_init(&sbuf);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);

  // HELLO, then the arrivals (batches of o.batch).
  msgpack_pack_array(&pk, 2);
  msgpack_pack_uint64(&pk, 0);
  msgpack_pack_map(&pk, o.profile.empty() ? 5 : 6);
  if (!o.profile.empty()) {
    PackStr(&pk, "profile");
    PackStr(&pk, o.profile.c_str());
  }
  PackStr(&pk, "proto");
  msgpack_pack_uint64(&pk, 1);
  PackStr(&pk, "engine");
  PackStr(&pk, "bench");
  PackStr(&pk, "model");
  PackStr(&pk, "m");
  PackStr(&pk, "instance");
  PackStr(&pk, "0");
  PackStr(&pk, "pid");
  msgpack_pack_int64(&pk, getpid());
  uint64_t seq = 0;
  const uint64_t t_arrived = NowNs();
  for (uint32_t first = 0; first < o.requests; first += o.batch) {
    const uint32_t n = std::min(o.batch, o.requests - first);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_uint64(&pk, seq++);
    msgpack_pack_uint64(&pk, 0);
    msgpack_pack_array(&pk, n);
    for (uint32_t i = 0; i < n; ++i) {
      msgpack_pack_array(&pk, o.label_values > 0 ? 5 : 4);
      msgpack_pack_uint64(&pk, 1);  // ARRIVED
      msgpack_pack_fix_uint64(&pk, t_arrived);
      PackRid(&pk, o, first + i);
      msgpack_pack_uint64(&pk, 100);  // prompt tokens
      if (o.label_values > 0) {
        msgpack_pack_map(&pk, 1);
        PackStr(&pk, "labels");
        msgpack_pack_map(&pk, 1);
        PackStr(&pk, "tenant");
        // Formatted in place: "t" + std::to_string() trips GCC 12's
        // -Wrestrict at -O3 (a false positive that -Dwerror=true fails on).
        char tenant[16];
        std::snprintf(tenant, sizeof tenant, "t%" PRIu32,
                      (first + i) % o.label_values);
        PackStr(&pk, tenant);
      }
    }
  }
  WriteAll(fd, sbuf.data, sbuf.size);
  msgpack_sbuffer_clear(&sbuf);

  // The TOKENS cycle: lcm(requests, batch) events.
  uint64_t g = o.requests, b = o.batch;
  while (b != 0) {
    const uint64_t r = g % b;
    g = b;
    b = r;
  }
  const uint64_t cycle = o.requests / g;  // batches per cycle
  TokenCycle tc;
  for (uint64_t c = 0; c < cycle; ++c) {
    tc.batch_begin.push_back(sbuf.size);
    tc.t_begin.push_back(tc.t_off.size());
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint64(&pk, 1);  // BATCH
    tc.seq_off.push_back(uint32_t(sbuf.size + 1));
    msgpack_pack_fix_uint64(&pk, 0);
    msgpack_pack_uint64(&pk, 0);  // dropped_total
    msgpack_pack_array(&pk, o.batch);
    for (uint32_t i = 0; i < o.batch; ++i) {
      msgpack_pack_array(&pk, 4);
      msgpack_pack_uint64(&pk, 4);  // TOKENS
      tc.t_off.push_back(uint32_t(sbuf.size + 1));
      msgpack_pack_fix_uint64(&pk, 0);
      PackRid(&pk, o, (c * o.batch + i) % o.requests);
      msgpack_pack_uint64(&pk, 1);  // n
    }
  }
  tc.batch_begin.push_back(sbuf.size);
  tc.t_begin.push_back(tc.t_off.size());
  tc.bytes.assign(sbuf.data, sbuf.data + sbuf.size);
  msgpack_sbuffer_destroy(&sbuf);

  WriteAll(ctl_out, "R", 1);
  char go;
  if (!ReadMsg(ctl_in, &go, 1) || go != 'G') _exit(3);

  // Several batches per writev, each patched just before.
  const uint64_t total = o.events / o.batch;
  const uint64_t chunk = std::min<uint64_t>(8, cycle);
  iovec iov[8];
  char* base = tc.bytes.data();
  for (uint64_t done = 0; done < total;) {
    const uint64_t k = std::min(chunk, total - done);
    const uint64_t now = NowNs();
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t c = (done + i) % cycle;
      PutBe64(base + tc.seq_off[c], seq + done + i);
      for (size_t j = tc.t_begin[c]; j < tc.t_begin[c + 1]; ++j) {
        PutBe64(base + tc.t_off[j], now);
      }
      iov[i].iov_base = base + tc.batch_begin[c];
      iov[i].iov_len = tc.batch_begin[c + 1] - tc.batch_begin[c];
    }
    WriteAllV(fd, iov, int(k));
    done += k;
  }
  close(fd);
  WriteAll(ctl_out, "D", 1);
  _exit(0);
}

// ---------------------------------------------------------------------------
// Receiver: the ceiling (read + msgpack-c).

[[noreturn]] void RunCeiling(const Options& o, int listen_fd, int ctl_out) {
  Pin(o.receiver_cpu);
  const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) Die("accept");
  constexpr size_t kRead = 64 * 1024;  // libuv's suggested read size
  msgpack_unpacker u;
  if (!msgpack_unpacker_init(&u, 1 << 20)) Die("msgpack_unpacker_init");
  msgpack_unpacked result;
  msgpack_unpacked_init(&result);
  Report rep;
  bool notified = false;
  Sched sched0;
  const uint64_t want = o.events / o.batch * o.batch;
  for (;;) {
    if (!msgpack_unpacker_reserve_buffer(&u, kRead)) Die("reserve_buffer");
    const ssize_t n = read(fd, msgpack_unpacker_buffer(&u),
                           msgpack_unpacker_buffer_capacity(&u));
    if (n < 0) {
      if (errno == EINTR) continue;
      Die("read");
    }
    if (n == 0) break;
    msgpack_unpacker_buffer_consumed(&u, size_t(n));
    msgpack_unpack_return ret;
    while ((ret = msgpack_unpacker_next(&u, &result)) ==
           MSGPACK_UNPACK_SUCCESS) {
      const msgpack_object& f = result.data;
      if (f.type != MSGPACK_OBJECT_ARRAY || f.via.array.size < 4 ||
          f.via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
          f.via.array.ptr[0].via.u64 != 1 ||
          f.via.array.ptr[3].type != MSGPACK_OBJECT_ARRAY) {
        continue;  // HELLO
      }
      const msgpack_object_array& evs = f.via.array.ptr[3].via.array;
      for (uint32_t i = 0; i < evs.size; ++i) {
        const msgpack_object& e = evs.ptr[i];
        if (e.type != MSGPACK_OBJECT_ARRAY || e.via.array.size < 4 ||
            e.via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
          ++rep.errors;
          continue;
        }
        switch (e.via.array.ptr[0].via.u64) {
          case 4:
            ++rep.tokens;
            break;
          case 1:
            ++rep.arrived;
            break;
          default:
            ++rep.other_events;
        }
      }
    }
    if (ret != MSGPACK_UNPACK_CONTINUE) Die("msgpack_unpacker_next");
    if (!notified && rep.arrived >= o.requests) {
      notified = true;
      sched0 = ReadSched("self");
      WriteAll(ctl_out, "A", 1);
    }
    if (rep.end_ns == 0 && rep.tokens >= want) {
      rep.end_ns = NowNs();
      SetSchedDelta(sched0, ReadSched("self"), &rep);
    }
  }
  msgpack_unpacked_destroy(&result);
  msgpack_unpacker_destroy(&u);
  close(fd);
  rep.ok = 1;
  WriteAll(ctl_out, "E", 1);
  WriteAll(ctl_out, &rep, sizeof rep);
  _exit(0);
}

// ---------------------------------------------------------------------------
// Receiver: tokenmeterd_core in process.

struct Inproc {
  const Options* o = nullptr;
  td::Registry* registry = nullptr;
  td::IngestStats* stats = nullptr;
  td::IngestServer* ingest = nullptr;
  int ctl_out = -1;
  uint64_t want = 0;
  bool notified = false;
  bool saw_connection = false;
  bool closing = false;
  uint64_t end_ns = 0;
  Sched sched0, sched1;
  uv_prepare_t prepare{};
};

// Runs before each poll: after the reads (and closes) of the iteration
// before.
void InprocPrepare(uv_prepare_t* h) {
  auto* s = static_cast<Inproc*>(h->data);
  const uint64_t arrived = s->stats->events(td::EventKind::kArrived);
  const uint64_t tokens = s->stats->events(td::EventKind::kTokens);
  if (!s->notified && arrived >= s->o->requests) {
    s->notified = true;
    s->sched0 = ReadSched("self");
    WriteAll(s->ctl_out, "A", 1);
  }
  if (s->end_ns == 0 && tokens >= s->want) {
    s->end_ns = NowNs();
    s->sched1 = ReadSched("self");
  }
  if (s->ingest->connections() > 0) s->saw_connection = true;
  if (s->saw_connection && s->ingest->connections() == 0 && !s->closing) {
    s->closing = true;
    s->ingest->Close([] {});
    uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
  }
}

[[noreturn]] void RunInproc(const Options& o, const std::string& path,
                            int ctl_out) {
  Pin(o.receiver_cpu);
  spdlog::set_level(spdlog::level::warn);
  uv_loop_t loop;
  if (uv_loop_init(&loop) != 0) Die("uv_loop_init");
  td::SystemClock clock;
  std::unique_ptr<td::Pipeline> pipeline;
  if (!td::Pipeline::Create(&loop, clock, td::PipelineOptions{}, &pipeline)
           .ok()) {
    Die("Pipeline::Create");
  }
  std::unique_ptr<td::requests::RequestKeeper> keeper;
  if (o.inproc_keep_requests != 0) {
    td::requests::RequestKeeperOptions keep;
    keep.keep = o.inproc_keep_requests;
    keeper = std::make_unique<td::requests::RequestKeeper>(keep);
    pipeline->tracker().AddTimelineSink(keeper.get());
  }
  td::IngestStats& stats = pipeline->stats();
  td::IngestServer& ingest = pipeline->server();
  const td::Status st = ingest.Listen(path);
  if (!st.ok()) {
    std::fprintf(stderr, "ingest_bench: %s\n", st.message().c_str());
    _exit(2);
  }
  Inproc s;
  s.o = &o;
  s.registry = &pipeline->registry();
  s.stats = &stats;
  s.ingest = &ingest;
  s.ctl_out = ctl_out;
  s.want = o.events / o.batch * o.batch;
  uv_prepare_init(&loop, &s.prepare);
  s.prepare.data = &s;
  uv_prepare_start(&s.prepare, InprocPrepare);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0) {
    std::fprintf(stderr, "ingest_bench: uv_loop_close: handles left\n");
    _exit(2);
  }

  Report rep;
  rep.end_ns = s.end_ns;
  SetSchedDelta(s.sched0, s.sched1, &rep);
  for (int k = 0; k < td::kNumEventKinds; ++k) {
    const uint64_t v = stats.events(td::EventKind(k + 1));
    if (k == int(td::EventKind::kTokens) - 1) {
      rep.tokens = v;
    } else if (k == int(td::EventKind::kArrived) - 1) {
      rep.arrived = v;
    } else {
      rep.other_events += v;
    }
  }
  for (size_t e = 0; e < size_t(td::IngestError::kCount); ++e) {
    rep.errors += stats.errors(td::IngestError(e));
  }
  pipeline->registry().ForEachSeries([&](td::EngineSeries& series) {
    rep.generation_tokens += series.count(td::kGenerationTokens);
    rep.itl_observed += series.hist(td::kInterTokenLatency).count();
  });
  rep.itl_negative = pipeline->tracker().negative(td::Interval::kItl);
  rep.tracked = uint64_t(pipeline->tracker().size());
  rep.ok = 1;
  WriteAll(ctl_out, "E", 1);
  WriteAll(ctl_out, &rep, sizeof rep);
  _exit(0);
}

// ---------------------------------------------------------------------------
// Receiver: the tokenmeterd binary, and its /metrics.

// GET /metrics over HTTP/1.0; the sample lines as "name{labels}" -> value.
bool Scrape(int port, std::map<std::string, double>* out) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return false;
  }
  static const char kRequest[] =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  WriteAll(fd, kRequest, sizeof kRequest - 1);
  std::string resp;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    resp.append(buf, size_t(n));
  }
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (resp.compare(0, 12, "HTTP/1.1 200") != 0 || body == std::string::npos) {
    return false;
  }
  out->clear();
  std::istringstream in(resp.substr(body + 4));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    (*out)[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return true;
}

double Get(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? -1 : it->second;
}

// A count from a scrape; a missing sample reads as 0 (and fails the
// verification, which wants exact counts).
uint64_t GetCount(const std::map<std::string, double>& m,
                  const std::string& key) {
  return uint64_t(std::max(0.0, Get(m, key)));
}

const std::string kArrived = "tokenmeter_ingest_events_total{kind=\"arrived\"}";
const std::string kTokens = "tokenmeter_ingest_events_total{kind=\"tokens\"}";

uint64_t EventsOfKind(const std::map<std::string, double>& m,
                      const char* kind) {
  return GetCount(
      m, std::string("tokenmeter_ingest_events_total{kind=\"") + kind + "\"}");
}

// Fills a Report from a scrape.
void ReportFromMetrics(const std::map<std::string, double>& m,
                       const std::string& profile, Report* rep) {
  static const char* const kOther[] = {"queued", "scheduled", "finished",
                                       "preempted", "step"};
  rep->tokens = EventsOfKind(m, "tokens");
  rep->arrived = EventsOfKind(m, "arrived");
  rep->other_events = 0;
  for (const char* k : kOther) rep->other_events += EventsOfKind(m, k);
  rep->errors = 0;
  for (const auto& [key, v] : m) {
    if (key.starts_with("tokenmeter_ingest_errors_total{")) {
      rep->errors += uint64_t(v);
    }
  }
  // Summed over the series' samples: request labels split them.
  const auto sum = [&](const std::string& name) {
    uint64_t n = 0;
    for (const auto& [key, v] : m) {
      if (key.starts_with(name + "{")) n += uint64_t(v);
    }
    return n;
  };
  const ProfileNames names = NamesFor(profile);
  rep->generation_tokens = names.generation_tokens.empty()
                               ? rep->tokens
                               : sum(names.generation_tokens);
  rep->itl_observed = sum(names.itl_count);
  rep->itl_negative = GetCount(
      m,
      "tokenmeter_negative_intervals_total{interval=\"inter_token_latency\"}");
  rep->tracked = GetCount(m, "tokenmeter_tracked_requests");
}

int WaitForPort(const std::string& log_path, pid_t pid) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in(log_path);
    std::string line;
    while (std::getline(in, line)) {
      const size_t at = line.find("http port ");
      if (at != std::string::npos) return std::atoi(line.c_str() + at + 10);
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return -1;
    usleep(5000);
  }
  return -1;
}

// ---------------------------------------------------------------------------
// One run.

struct RunResult {
  bool ok = false;
  double seconds = 0;
  double cpu_seconds = 0;   // the receiver's, see Report::run_ns
  double wait_seconds = 0;  // the receiver's runqueue wait
  uint64_t events = 0;
  std::string detail;
};

bool Verify(const Options& o, const std::string& receiver, const Report& r,
            std::string* why) {
  const uint64_t want = o.events / o.batch * o.batch;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "tokens=%" PRIu64 " arrived=%" PRIu64 " other=%" PRIu64
                " errors=%" PRIu64,
                r.tokens, r.arrived, r.other_events, r.errors);
  *why = buf;
  bool ok = r.ok && r.end_ns != 0 && r.tokens == want &&
            r.arrived == o.requests && r.other_events == 0 && r.errors == 0;
  if (receiver != "ceiling") {
    std::snprintf(buf, sizeof buf,
                  " generation_tokens=%" PRIu64 " itl_observed=%" PRIu64
                  " itl_negative=%" PRIu64 " tracked=%" PRIu64,
                  r.generation_tokens, r.itl_observed, r.itl_negative,
                  r.tracked);
    *why += buf;
    ok = ok && r.generation_tokens == want &&
         r.itl_observed + r.itl_negative == want - o.requests &&
         r.tracked == o.requests;
  }
  return ok;
}

RunResult RunOnce(const Options& o, const std::string& receiver,
                  const std::string& dir) {
  RunResult res;
  const std::string path = dir + "/i.sock";
  unlink(path.c_str());
  int to_sender[2], from_sender[2], from_receiver[2];
  if (pipe2(to_sender, O_CLOEXEC) != 0 || pipe2(from_sender, O_CLOEXEC) != 0 ||
      pipe2(from_receiver, O_CLOEXEC) != 0) {
    Die("pipe2");
  }
  std::fflush(stdout);
  std::fflush(stderr);

  pid_t receiver_pid = -1;
  int port = -1;
  if (receiver == "ceiling") {
    const int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) ||
        listen(lfd, 4)) {
      Die("listen");
    }
    receiver_pid = fork();
    if (receiver_pid == 0) RunCeiling(o, lfd, from_receiver[1]);
    close(lfd);
  } else if (receiver == "inproc") {
    receiver_pid = fork();
    if (receiver_pid == 0) RunInproc(o, path, from_receiver[1]);
  } else {
    const std::string log_path = dir + "/daemon.log";
    unlink(log_path.c_str());  // WaitForPort must not read an older run's
    receiver_pid = fork();
    if (receiver_pid == 0) {
      Pin(o.receiver_cpu);
      const int log =
          open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log < 0) Die("open log");
      dup2(log, 2);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      std::vector<std::string> args = {
          o.tokenmeterd, "--ingest",       path, "--listen",
          "127.0.0.1:0", "--log-interval", "0"};
      if (o.label_values > 0) {
        args.insert(args.end(), {"--request-label", "tenant"});
      }
      args.insert(args.end(), o.daemon_args.begin(), o.daemon_args.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(o.tokenmeterd.c_str(), argv.data());
      Die("exec tokenmeterd");
    }
    port = WaitForPort(log_path, receiver_pid);
    if (port <= 0) {
      res.detail = "tokenmeterd did not start (see " + log_path + ")";
      return res;
    }
  }
  if (receiver_pid < 0) Die("fork");
  close(from_receiver[1]);

  const pid_t sender_pid = fork();
  if (sender_pid < 0) Die("fork");
  if (sender_pid == 0) RunSender(o, path, to_sender[0], from_sender[1]);
  close(to_sender[0]);
  close(from_sender[1]);

  Report rep;
  char c = 0;
  const char* stage = "waiting for the sender to connect and send ARRIVED";
  bool ok = ReadMsg(from_sender[0], &c, 1) && c == 'R';
  // Wait for the receiver to have applied every ARRIVED.
  if (ok && port > 0) {
    stage = "scraping until every ARRIVED is applied";
    std::map<std::string, double> m;
    ok = false;
    for (int i = 0; i < 60'000 && !ok; ++i) {
      ok = Scrape(port, &m) && Get(m, kArrived) >= o.requests;
      if (!ok) usleep(2000);
    }
  } else if (ok) {
    stage = "waiting for the receiver to apply every ARRIVED";
    ok = ReadMsg(from_receiver[0], &c, 1) && c == 'A';
  }
  uint64_t start_ns = 0;
  Sched sched0;
  const std::string receiver_pid_text = std::to_string(receiver_pid);
  if (ok) {
    if (port > 0) sched0 = ReadSched(receiver_pid_text);
    start_ns = NowNs();
    WriteAll(to_sender[1], "G", 1);
    stage = "waiting for the sender to write every TOKENS frame";
    ok = ReadMsg(from_sender[0], &c, 1) && c == 'D';
  }
  if (ok && port > 0) {
    stage = "scraping until every TOKENS event is applied";
    // Every frame is written; scrape until the daemon shows them all.
    const uint64_t want = o.events / o.batch * o.batch;
    std::map<std::string, double> m;
    ok = false;
    const uint64_t deadline = NowNs() + uint64_t(kTimeoutMs) * 1'000'000;
    while (NowNs() < deadline) {
      if (Scrape(port, &m) && Get(m, kTokens) >= double(want)) {
        rep.end_ns = NowNs();
        SetSchedDelta(sched0, ReadSched(receiver_pid_text), &rep);
        ok = true;
        break;
      }
      usleep(500);
    }
    // Let the daemon see the end of the stream, then take the final figures.
    if (ok) {
      for (int i = 0; i < 1000; ++i) {
        if (Scrape(port, &m) && Get(m, "tokenmeter_ingest_connections") == 0) {
          break;
        }
        usleep(2000);
      }
      ReportFromMetrics(m, o.profile, &rep);
      rep.ok = Get(m, "tokenmeter_ingest_connections") == 0;
    }
    kill(receiver_pid, SIGTERM);
  } else if (ok) {
    stage = "waiting for the receiver's report";
    ok = ReadMsg(from_receiver[0], &c, 1) && c == 'E' &&
         ReadMsg(from_receiver[0], &rep, sizeof rep);
  }
  if (!ok) {
    kill(sender_pid, SIGKILL);
    kill(receiver_pid, SIGKILL);
  }
  int sender_status = 0, receiver_status = 0;
  waitpid(sender_pid, &sender_status, 0);
  const bool sender_ok =
      WIFEXITED(sender_status) && WEXITSTATUS(sender_status) == 0;
  waitpid(receiver_pid, &receiver_status, 0);
  const bool receiver_ok =
      WIFEXITED(receiver_status) && WEXITSTATUS(receiver_status) == 0;
  close(to_sender[1]);
  close(from_sender[0]);
  close(from_receiver[0]);
  unlink(path.c_str());

  res.events = o.events / o.batch * o.batch;
  if (!ok || !sender_ok || !receiver_ok) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "run failed %s%s; sender wait status 0x%x, receiver 0x%x",
                  ok ? "after " : "", stage, unsigned(sender_status),
                  unsigned(receiver_status));
    res.detail = buf;
    if (port > 0) {
      // Keep the daemon's log for a look.
      static int failures = 0;
      const std::string kept =
          dir + "/daemon-failed-" + std::to_string(++failures) + ".log";
      rename((dir + "/daemon.log").c_str(), kept.c_str());
      res.detail += " (log: " + kept + ")";
    }
    return res;
  }
  if (port > 0) unlink((dir + "/daemon.log").c_str());
  res.ok = Verify(o, receiver, rep, &res.detail);
  res.seconds = double(rep.end_ns - start_ns) / 1e9;
  res.cpu_seconds = double(rep.run_ns) / 1e9;
  res.wait_seconds = double(rep.wait_ns) / 1e9;
  return res;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int Usage() {
  std::fprintf(
      stderr,
      "usage: daemon_ingest_bench [--tokenmeterd PATH] [--events N]\n"
      "         [--requests N] [--batch N] [--reps N]\n"
      "         [--receivers ceiling,daemon,inproc] [--receiver-cpu N]\n"
      "         [--sender-cpu N] [--profile vllm|sglang|lmdeploy]\n"
      "         [--label-values N] [--daemon-arg ARG]...\n"
      "         [--inproc-keep-requests N] [--string-ids]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--string-ids") {
      o.string_ids = true;
      continue;
    }
    if (i + 1 >= argc) return Usage();
    const char* v = argv[++i];
    if (a == "--tokenmeterd") {
      o.tokenmeterd = v;
    } else if (a == "--events") {
      o.events = std::strtoull(v, nullptr, 10);
    } else if (a == "--requests") {
      o.requests = uint32_t(std::strtoul(v, nullptr, 10));
    } else if (a == "--batch") {
      o.batch = uint32_t(std::strtoul(v, nullptr, 10));
    } else if (a == "--reps") {
      o.reps = std::atoi(v);
    } else if (a == "--receiver-cpu") {
      o.receiver_cpu = std::atoi(v);
    } else if (a == "--sender-cpu") {
      o.sender_cpu = std::atoi(v);
    } else if (a == "--profile") {
      o.profile = v;
      if (o.profile != "vllm" && o.profile != "sglang" &&
          o.profile != "lmdeploy") {
        return Usage();
      }
    } else if (a == "--label-values") {
      o.label_values = uint32_t(std::strtoul(v, nullptr, 10));
    } else if (a == "--inproc-keep-requests") {
      o.inproc_keep_requests = std::strtoull(v, nullptr, 10);
    } else if (a == "--daemon-arg") {
      o.daemon_args.emplace_back(v);
    } else if (a == "--receivers") {
      o.receivers.clear();
      std::string s = v;
      size_t start = 0;
      for (;;) {
        const size_t comma = s.find(',', start);
        o.receivers.push_back(s.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      return Usage();
    }
  }
  for (const std::string& r : o.receivers) {
    if (r != "ceiling" && r != "daemon" && r != "inproc") return Usage();
    if (r == "inproc" && (o.label_values > 0 || !o.profile.empty())) {
      std::fprintf(stderr,
                   "ingest_bench: --profile and --label-values need "
                   "--receivers daemon (or ceiling)\n");
      return 2;
    }
    if (r == "daemon" && o.tokenmeterd.empty()) {
      std::fprintf(stderr,
                   "ingest_bench: --receivers daemon needs "
                   "--tokenmeterd PATH\n");
      return 2;
    }
  }
  if (o.batch == 0 || o.requests == 0 || o.events < o.batch || o.reps < 1 ||
      o.events / o.batch * o.batch <= o.requests) {
    return Usage();
  }
  // The coordinator shares the sender's CPU (it sleeps while they run).
  Pin(o.sender_cpu);
  signal(SIGPIPE, SIG_IGN);

  char tmpl[] = "/tmp/tm-ingest-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  const std::string dir = tmpl;

  const uint64_t events = o.events / o.batch * o.batch;
  std::printf("ingest: %" PRIu64
              " TOKENS events per run in batches of %u, "
              "request ids cycling over %u arrived requests; receiver on "
              "CPU %d, sender on CPU %d; %d runs per receiver\n",
              events, o.batch, o.requests, o.receiver_cpu, o.sender_cpu,
              o.reps);
  std::map<std::string, std::vector<double>> rates, cpu_rates;
  bool all_ok = true;
  for (int rep = 1; rep <= o.reps; ++rep) {
    for (const std::string& r : o.receivers) {
      const RunResult res = RunOnce(o, r, dir);
      if (!res.ok) {
        std::printf("run %d %-8s VOID: %s\n", rep, r.c_str(),
                    res.detail.c_str());
        all_ok = false;
        continue;
      }
      const double rate = double(res.events) / res.seconds;
      const double cpu_rate = double(res.events) / res.cpu_seconds;
      rates[r].push_back(rate);
      cpu_rates[r].push_back(cpu_rate);
      std::printf(
          "run %d %-8s %" PRIu64
          " events in %.3f s = %6.2f M "
          "events/s; receiver on a CPU %.3f s = %6.2f M events per "
          "CPU-second, runnable but waiting %.3f s, idle %.3f s  "
          "[%s]\n",
          rep, r.c_str(), res.events, res.seconds, rate / 1e6, res.cpu_seconds,
          cpu_rate / 1e6, res.wait_seconds,
          std::max(0.0, res.seconds - res.cpu_seconds - res.wait_seconds),
          res.detail.c_str());
      std::fflush(stdout);
    }
  }
  if (rmdir(dir.c_str()) != 0) std::printf("(kept %s)\n", dir.c_str());

  std::printf(
      "\nmedians over %d runs (wall clock; per CPU-second of the "
      "receiver):\n",
      o.reps);
  std::map<std::string, double> med, cpu_med;
  for (const std::string& r : o.receivers) {
    if (rates[r].empty()) continue;
    med[r] = Median(rates[r]);
    cpu_med[r] = Median(cpu_rates[r]);
    std::printf(
        "  %-8s %6.2f M events/s (min %.2f, max %.2f); %6.2f M "
        "events per CPU-second\n",
        r.c_str(), med[r] / 1e6,
        *std::min_element(rates[r].begin(), rates[r].end()) / 1e6,
        *std::max_element(rates[r].begin(), rates[r].end()) / 1e6,
        cpu_med[r] / 1e6);
  }
  for (const char* r : {"daemon", "inproc"}) {
    if (med.count(r) && med.count("ceiling")) {
      std::printf("  %s / ceiling = %.2f (per CPU-second: %.2f)\n", r,
                  med[r] / med["ceiling"], cpu_med[r] / cpu_med["ceiling"]);
    }
  }
  for (const auto& [r, m] : med) {
    std::printf("RESULT ingest_%s_events_per_s=%.0f\n", r.c_str(), m);
    std::printf("RESULT ingest_%s_events_per_cpu_s=%.0f\n", r.c_str(),
                cpu_med[r]);
  }
  std::printf("RESULT ingest_runs_void=%d\n", all_ok ? 0 : 1);
  return all_ok ? 0 : 1;
}
