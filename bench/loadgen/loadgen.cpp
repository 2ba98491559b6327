// tokenmeter-loadgen: a steady stream of engine-like events through
// libtokenmeter, at a set rate, for the fault tests (tests/faults/) and the
// soak (bench/soak/soak.py).
//
// Each thread plays an engine with 64 running requests: every step it
// sends one TOKENS per running request, ARRIVED + SCHEDULED for a request
// that just started, FINISHED for one that reached 32 tokens, and one STEP;
// about 68 events a step. Steps are paced so that the events appended
// follow --rate (events per second, all threads together), checked every
// step against the time since the start; timestamps are "now".
//
// At the end it closes the client (which sends what is buffered) and
// prints one JSON line: events appended (TM_OK), refused by a full buffer
// (TM_E_DROPPED at the call), and the client's final counters.
//
// Usage: tokenmeter-loadgen --socket PATH [--rate N] [--duration S]
//          [--threads N] [--buffer EVENTS] [--model NAME] [--instance ID]
//          [--close-timeout-ms MS] [--flush-ms MS] [--ack on|off]
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tokenmeter/client.hpp"

namespace {

struct Args {
  std::string socket_path;
  double rate = 100000;
  double duration_s = 10;
  unsigned threads = 1;
  size_t buffer = 1 << 18;
  std::string model = "loadgen";
  std::string instance = "0";
  uint32_t close_timeout_ms = 5000;
  uint32_t flush_ms = 20;
  bool ack = true;  // the library's default
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "tokenmeter-loadgen: %s\n"
               "usage: tokenmeter-loadgen --socket PATH [--rate EVENTS_PER_S] "
               "[--duration S] [--threads N] [--buffer EVENTS] [--model NAME] "
               "[--instance ID] [--close-timeout-ms MS] [--flush-ms MS] "
               "[--ack on|off]\n",
               why);
  std::exit(2);
}

double Number(const char* flag, const char* v, double lo, double hi) {
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(x >= lo && x <= hi)) {
    std::string why = std::string(flag) + " wants a number in range";
    Usage(why.c_str());
  }
  return x;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view f = argv[i];
    if (i + 1 >= argc) Usage("a flag without its value");
    const char* v = argv[++i];
    if (f == "--socket") {
      a.socket_path = v;
    } else if (f == "--rate") {
      a.rate = Number("--rate", v, 1, 1e9);
    } else if (f == "--duration") {
      a.duration_s = Number("--duration", v, 0.01, 86400);
    } else if (f == "--threads") {
      a.threads = unsigned(Number("--threads", v, 1, 64));
    } else if (f == "--buffer") {
      a.buffer = size_t(Number("--buffer", v, 1024, 1 << 26));
    } else if (f == "--model") {
      a.model = v;
    } else if (f == "--instance") {
      a.instance = v;
    } else if (f == "--flush-ms") {
      a.flush_ms = uint32_t(Number("--flush-ms", v, 1, 10000));
    } else if (f == "--ack") {
      if (std::strcmp(v, "on") != 0 && std::strcmp(v, "off") != 0) {
        Usage("--ack wants on or off");
      }
      a.ack = std::strcmp(v, "on") == 0;
    } else if (f == "--close-timeout-ms") {
      a.close_timeout_ms = uint32_t(Number("--close-timeout-ms", v, 0, 6e5));
    } else {
      Usage("unknown flag");
    }
  }
  if (a.socket_path.empty()) Usage("--socket is required");
  return a;
}

struct Counts {
  std::atomic<uint64_t> ok{0}, dropped{0}, other{0};
};

void Tally(int rc, uint64_t* ok, uint64_t* dropped, uint64_t* other) {
  if (rc == TM_OK) {
    ++*ok;
  } else if (rc == TM_E_DROPPED) {
    ++*dropped;
  } else {
    ++*other;
  }
}

void Run(tokenmeter::Client* c, unsigned thread, double rate,
         std::chrono::steady_clock::time_point start, double duration_s,
         Counts* counts) {
  constexpr int kSlots = 64;
  constexpr uint32_t kTokensPerRequest = 32;
  uint64_t next_rid = uint64_t{thread} << 48;
  uint64_t rid[kSlots];
  uint32_t tokens[kSlots] = {};
  for (uint64_t& r : rid) r = next_rid++;
  uint64_t ok = 0, dropped = 0, other = 0;
  const auto end = start + std::chrono::duration<double>(duration_s);
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) break;
    const double due =
        rate * std::chrono::duration<double>(now - start).count();
    if (double(ok + dropped + other) >= due) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    // One step.
    for (int s = 0; s < kSlots; ++s) {
      if (tokens[s] == 0) {
        Tally(c->Arrived(rid[s], 512, kTokensPerRequest), &ok, &dropped,
              &other);
        Tally(c->Scheduled(rid[s]), &ok, &dropped, &other);
      }
      Tally(c->Tokens(rid[s], 1), &ok, &dropped, &other);
      if (++tokens[s] == kTokensPerRequest) {
        Tally(c->Finished(rid[s], tokenmeter::FinishReason::kLength), &ok,
              &dropped, &other);
        rid[s] = next_rid++;
        tokens[s] = 0;
      }
    }
    tokenmeter::StepStats st;
    st.Running(kSlots).Waiting(0).KvUsage(0.5).GenerationTokens(kSlots);
    Tally(c->Step(st), &ok, &dropped, &other);
  }
  counts->ok += ok;
  counts->dropped += dropped;
  counts->other += other;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  tokenmeter::Options o;
  o.socket_path = a.socket_path;
  o.engine = "loadgen";
  o.model = a.model;
  o.instance = a.instance;
  o.buffer_capacity = a.buffer;
  o.close_timeout_ms = a.close_timeout_ms;
  o.flush_interval_ms = a.flush_ms;
  o.ack = a.ack;
  std::unique_ptr<tokenmeter::Client> client;
  const int rc = tokenmeter::Client::Create(o, &client);
  if (rc != TM_OK) {
    std::fprintf(stderr, "tokenmeter-loadgen: cannot create the client: %s\n",
                 tm_strerror(rc));
    return 1;
  }
  Counts counts;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < a.threads; ++t) {
    threads.emplace_back(Run, client.get(), t, a.rate / a.threads, start,
                         a.duration_s, &counts);
  }
  for (std::thread& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const tokenmeter::Stats s = client->Close();
  std::printf(
      "{\"appended\": %llu, \"refused_full\": %llu, \"rejected\": %llu, "
      "\"duration_s\": %.3f, \"events_sent\": %llu, \"events_dropped\": "
      "%llu, \"reconnects\": %llu, \"batches_sent\": %llu, \"bytes_sent\": "
      "%llu, \"batches_replayed\": %llu, \"events_unacked\": %llu}\n",
      (unsigned long long)counts.ok.load(),
      (unsigned long long)counts.dropped.load(),
      (unsigned long long)counts.other.load(), elapsed,
      (unsigned long long)s.events_sent, (unsigned long long)s.events_dropped,
      (unsigned long long)s.reconnects, (unsigned long long)s.batches_sent,
      (unsigned long long)s.bytes_sent, (unsigned long long)s.batches_replayed,
      (unsigned long long)s.events_unacked);
  return counts.other.load() == 0 ? 0 : 1;
}
