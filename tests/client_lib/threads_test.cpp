// Many producer threads, the max_threads cap, and threads that exit.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "client_fixture.h"
#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {
namespace {

using ThreadsTest = ClientFixture;

constexpr uint64_t kRidRange = 1000000;  // thread k uses [k * range, +range)

TEST_F(ThreadsTest, DeliversEveryEventOfConcurrentProducersOnceInOrder) {
  StartServer();
  NewClient();
  constexpr int kThreads = 4;
  constexpr uint32_t kPerThread = 20000;
  std::atomic<bool> go{false};
  std::atomic<uint32_t> failures{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      while (!go.load()) {
      }
      for (uint32_t i = 0; i < kPerThread; ++i) {
        // Ids cycle inside the thread's range; n counts up per thread.
        const uint64_t rid = k * kRidRange + i % 97;
        if (tm_tokens(client_, 0, rid, i + 1) != TM_OK) ++failures;
      }
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0u);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  ASSERT_TRUE(WaitForEvents(kThreads * kPerThread));

  const TestServer::Connections conns = server_->Snapshot();
  ASSERT_EQ(conns.size(), 1u);
  ASSERT_TRUE(IsWellFormed(conns[0]));  // every event well-formed
  std::map<uint64_t, std::vector<uint32_t>> counts_by_thread;
  std::map<uint64_t, uint64_t> last_t;
  for (const Value& ev : EventsOf(conns[0])) {
    ASSERT_EQ(ev.array[0].uint, 4u);
    const uint64_t rid = ev.array[2].uint;
    const uint64_t k = rid / kRidRange;
    ASSERT_LT(k, uint64_t{kThreads}) << ev.ToString();
    std::vector<uint32_t>& counts = counts_by_thread[k];
    // Per-thread order: the rid and n this thread sent next.
    ASSERT_EQ(rid % kRidRange, counts.size() % 97) << ev.ToString();
    ASSERT_EQ(ev.array[3].uint, counts.size() + 1) << ev.ToString();
    ASSERT_GE(ev.array[1].uint, last_t[k]) << ev.ToString();
    last_t[k] = ev.array[1].uint;
    counts.push_back(uint32_t(ev.array[3].uint));
  }
  ASSERT_EQ(counts_by_thread.size(), size_t{kThreads});
  for (const auto& [k, counts] : counts_by_thread) {
    EXPECT_EQ(counts.size(), kPerThread) << "thread " << k;
  }
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
}

TEST_F(ThreadsTest, DropsEventsOfThreadsBeyondMaxThreads) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_max_threads(opts.get(), 1), TM_OK);
  StartServer();
  NewClient(opts.get());
  ASSERT_EQ(tm_thread_attach(client_), TM_OK);  // this thread has the slot
  int attach_rc = 0;
  int tokens_rc = 0;
  std::thread other([&] {
    attach_rc = tm_thread_attach(client_);
    tokens_rc = tm_tokens(client_, 1, 2, 1);
  });
  other.join();
  EXPECT_EQ(attach_rc, TM_E_DROPPED);
  EXPECT_EQ(tokens_rc, TM_E_DROPPED);
  // A failed attach drops no event; the failed event is counted.
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_DROPPED], 1u);
  EXPECT_EQ(tm_tokens(client_, 2, 1, 1), TM_OK);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  ASSERT_TRUE(WaitForEvents(1));
  const std::vector<Value> events = EventsOf(server_->Snapshot());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].ToString(), "[4,2,1,1]");
  EXPECT_EQ(BatchesOf(server_->Snapshot()[0])[0]->value.array[2].uint, 1u);
}

using ThreadExitTest = ClientFixture;

// Reports from a thread of its own and returns once that thread has exited.
void ReportFromThread(tm_client* c, uint64_t rid, uint32_t events,
                      std::vector<int>* results) {
  std::thread t([&] {
    results->push_back(tm_arrived(c, 0, rid, 10, 0, 0));
    for (uint32_t i = 1; i <= events; ++i) {
      results->push_back(tm_tokens(c, 0, rid, i));
    }
  });
  t.join();
}

TEST_F(ThreadExitTest, DeliversEventsOfExitedThread) {
  NewClient();  // the daemon is away while the thread reports and exits
  std::vector<int> results;
  ReportFromThread(client_, 42, 3, &results);
  EXPECT_EQ(results, std::vector<int>(4, TM_OK));
  StartServer();
  ASSERT_TRUE(WaitForEvents(4));
  const std::vector<Value> events = EventsOf(server_->Snapshot());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].array[0].uint, 1u);
  for (uint32_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(events[i].array[2].uint, 42u);
    EXPECT_EQ(events[i].array[3].uint, i);
  }
}

TEST_F(ThreadExitTest, ReusesSlotOfExitedThread) {
  OptionsPtr opts = DefaultOptions();
  ASSERT_EQ(tm_options_set_max_threads(opts.get(), 1), TM_OK);
  StartServer();
  NewClient(opts.get());
  // One slot, taken by each short-lived thread in turn once the previous
  // one has exited and its events have reached the daemon.
  constexpr uint32_t kThreads = 5;
  for (uint32_t k = 0; k < kThreads; ++k) {
    std::vector<int> results;
    ReportFromThread(client_, 100 + k, 2, &results);
    EXPECT_EQ(results, std::vector<int>(3, TM_OK)) << "thread " << k;
    ASSERT_TRUE(WaitForEvents(3 * (k + 1))) << "thread " << k;
  }
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);  // counters settled
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], 3 * kThreads);
  const std::vector<Value> events = EventsOf(server_->Snapshot());
  ASSERT_EQ(events.size(), 3 * kThreads);
  for (uint32_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].array[2].uint, 100 + i / 3) << events[i].ToString();
  }
}

// What pthread_self() says a thread is: glibc's struct pthread, the TCB the
// thread pointer points at. A thread that gets an exited thread's value
// also has its thread pointer, which is what the library's slot cache is
// keyed by (thread_registry.h).
uintptr_t ThreadIdentity() { return uintptr_t(pthread_self()); }

// Checks that `events` holds, for each thread k < threads, exactly
// `per_thread` TOKENS with rid k * kRidRange and n = 1, 2, ... in order.
void ExpectEveryThreadsEventsInOrder(const std::vector<Value>& events,
                                     uint64_t threads, uint32_t per_thread) {
  std::map<uint64_t, uint64_t> next_n;
  for (const Value& ev : events) {
    ASSERT_EQ(ev.array[0].uint, 4u) << ev.ToString();
    const uint64_t k = ev.array[2].uint / kRidRange;
    ASSERT_LT(k, threads) << ev.ToString();
    ASSERT_EQ(ev.array[2].uint % kRidRange, 0u) << ev.ToString();
    ASSERT_EQ(ev.array[3].uint, ++next_n[k]) << ev.ToString();
  }
  ASSERT_EQ(next_n.size(), threads);
  for (const auto& [k, n] : next_n) {
    EXPECT_EQ(n, per_thread) << "thread " << k;
  }
}

// Threads created and joined one after another: glibc hands each the
// stack, and so the TCB and thread pointer, of the one before. Each finds
// its own ring, never a ring of the thread whose thread pointer it has.
TEST_F(ThreadExitTest, ThreadsCreatedAndJoinedInALoopKeepEveryEvent) {
  constexpr uint32_t kThreads = 200;
  constexpr uint32_t kPerThread = 50;
  OptionsPtr opts = DefaultOptions();
  // A slot for each thread, so that none waits for the sender to drain an
  // exited thread's ring (small rings: 200 of them).
  ASSERT_EQ(tm_options_set_max_threads(opts.get(), kThreads), TM_OK);
  ASSERT_EQ(tm_options_set_buffer_capacity(opts.get(), 1024), TM_OK);
  StartServer();
  NewClient(opts.get());
  std::set<uintptr_t> identities;
  uint32_t failures = 0;
  for (uint32_t k = 0; k < kThreads; ++k) {
    std::thread t([&, k] {
      identities.insert(ThreadIdentity());
      for (uint32_t i = 1; i <= kPerThread; ++i) {
        failures += tm_tokens(client_, 0, k * kRidRange, i) != TM_OK;
      }
    });
    t.join();
  }
  // Not a check of the library: that the loop made the case it is about.
  ASSERT_LT(identities.size(), size_t{kThreads})
      << "no thread got the TCB of one before it";
  EXPECT_EQ(failures, 0u);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  ASSERT_TRUE(WaitForEvents(kThreads * kPerThread));
  ExpectEveryThreadsEventsInOrder(EventsOf(server_->Snapshot()), kThreads,
                                  kPerThread);
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
}

// The case a cache keyed by the thread pointer must not get wrong: thread
// A exits, a live thread B adopts A's drained slot, then a new thread C
// gets A's thread pointer. C must attach a slot of its own: were it handed
// A's old slot, B and C would both write one ring. B and C then report at
// once; every event of each arrives once, in its thread's order.
TEST_F(ThreadExitTest, ThreadWithAnExitedThreadsPointerGetsItsOwnSlot) {
  constexpr uint32_t kRounds = 20;
  constexpr uint32_t kPerThread = 2000;
  StartServer();
  NewClient();
  uint32_t reused = 0;
  std::atomic<uint32_t> failures{0};
  for (uint32_t round = 0; round < kRounds; ++round) {
    const uint64_t base = uint64_t{round} * 3;  // A, B, C: base + 0, 1, 2
    auto report = [&](uint64_t k, uint32_t from, uint32_t to) {
      for (uint32_t i = from; i <= to; ++i) {
        if (tm_tokens(client_, 0, k * kRidRange, i) != TM_OK) ++failures;
      }
    };
    // B starts first (a TCB of its own), and waits, unattached, while A
    // reports and exits.
    std::atomic<int> step{0};
    std::thread b([&] {
      while (step.load() < 1) std::this_thread::yield();
      report(base + 1, 1, kPerThread / 2);  // attaches: A's slot
      step = 2;
      while (step.load() < 3) std::this_thread::yield();
      report(base + 1, kPerThread / 2 + 1, kPerThread);
    });
    uintptr_t a_identity = 0;
    std::thread a([&] {
      a_identity = ThreadIdentity();
      report(base, 1, kPerThread);
    });
    a.join();
    // A's events sent: its slot is drained, free for the next attach.
    ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
    step = 1;
    while (step.load() < 2) std::this_thread::yield();
    std::thread c([&] {
      reused += ThreadIdentity() == a_identity;
      step = 3;
      report(base + 2, 1, kPerThread);
    });
    c.join();
    b.join();
    // Every slot drained: the next round's A takes the first, B after it.
    ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  }
  ASSERT_GT(reused, 0u) << "no thread C got thread A's TCB";
  EXPECT_EQ(failures.load(), 0u);
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  ASSERT_TRUE(WaitForEvents(size_t{kRounds} * 3 * kPerThread));
  ExpectEveryThreadsEventsInOrder(EventsOf(server_->Snapshot()), kRounds * 3,
                                  kPerThread);
  const StatsArray s = Stats();
  EXPECT_EQ(s[TM_STAT_EVENTS_SENT], uint64_t{kRounds} * 3 * kPerThread);
  EXPECT_EQ(s[TM_STAT_EVENTS_DROPPED], 0u);
}

// Threads whose thread pointers share a bucket of the client's slot cache
// (thread_registry.h: the bucket is the TCB's page number modulo 16): on
// stacks of our own, 1 MiB apart (ThreadSanitizer refuses 256 KiB ones with
// EINVAL), glibc puts each TCB at the same offset from its stack's top. All
// attach before any reports and none exits before all have reported, so that
// four find their slots through the bucket's entries and the others through
// their thread_local tables.
TEST_F(ThreadsTest, ThreadsSharingACacheBucketKeepEveryEvent) {
  constexpr uint32_t kThreads = 8;
  constexpr uint32_t kPerThread = 5000;
  constexpr size_t kStack = size_t{1} << 20;
  StartServer();
  NewClient();
  void* stacks = mmap(nullptr, kThreads * kStack, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(stacks, MAP_FAILED);
  struct Producer {
    tm_client* client;
    uint64_t k;
    std::atomic<uint32_t>* attached;
    std::atomic<uint32_t>* done;
    uintptr_t identity;
    uint32_t failures;
  };
  std::atomic<uint32_t> attached{0};
  std::atomic<uint32_t> done{0};
  std::vector<Producer> producers(kThreads);
  std::vector<pthread_t> threads(kThreads);
  for (uint32_t k = 0; k < kThreads; ++k) {
    producers[k] = Producer{client_, k, &attached, &done, 0, 0};
    pthread_attr_t attr;
    ASSERT_EQ(pthread_attr_init(&attr), 0);
    ASSERT_EQ(pthread_attr_setstack(
                  &attr, static_cast<char*>(stacks) + k * kStack, kStack),
              0);
    ASSERT_EQ(pthread_create(
                  &threads[k], &attr,
                  [](void* arg) -> void* {
                    auto* p = static_cast<Producer*>(arg);
                    p->identity = ThreadIdentity();
                    p->failures += tm_thread_attach(p->client) != TM_OK;
                    ++*p->attached;
                    while (p->attached->load() < kThreads) sched_yield();
                    for (uint32_t i = 1; i <= kPerThread; ++i) {
                      p->failures +=
                          tm_tokens(p->client, 0, p->k * kRidRange, i) != TM_OK;
                    }
                    ++*p->done;
                    while (p->done->load() < kThreads) sched_yield();
                    return nullptr;
                  },
                  &producers[k]),
              0);
    pthread_attr_destroy(&attr);
  }
  for (pthread_t t : threads) pthread_join(t, nullptr);
  munmap(stacks, kThreads * kStack);
  for (const Producer& p : producers) {
    EXPECT_EQ(p.failures, 0u) << "thread " << p.k;
    // Not a check of the library: that the threads share a bucket.
    EXPECT_EQ((p.identity - producers[0].identity) % (16 * 4096), 0u)
        << "thread " << p.k;
  }
  ASSERT_EQ(tm_client_flush(client_, 5000), TM_OK);
  ASSERT_TRUE(WaitForEvents(kThreads * kPerThread));
  ExpectEveryThreadsEventsInOrder(EventsOf(server_->Snapshot()), kThreads,
                                  kPerThread);
  EXPECT_EQ(Stats()[TM_STAT_EVENTS_DROPPED], 0u);
}

// A thread may report to several clients; each has its own buffer.
TEST_F(ThreadExitTest, ThreadReportsToTwoClients) {
  StartServer();
  NewClient();
  tm_client* second = nullptr;
  ASSERT_EQ(tm_client_new(DefaultOptions().get(), &second), TM_OK);
  std::thread t([&] {
    EXPECT_EQ(tm_tokens(client_, 1, 1, 1), TM_OK);
    EXPECT_EQ(tm_tokens(second, 2, 2, 1), TM_OK);
    EXPECT_EQ(tm_tokens(client_, 3, 1, 2), TM_OK);
  });
  t.join();
  EXPECT_EQ(tm_client_close(second, nullptr, 0), TM_OK);
  ASSERT_EQ(CloseClient(), TM_OK);
  ASSERT_TRUE(server_->WaitUntil([](const TestServer::Connections& c) {
    return c.size() == 2 && c[0].eof && c[1].eof;
  }));
  std::vector<std::string> all;
  for (const Value& ev : EventsOf(server_->Snapshot())) {
    all.push_back(ev.ToString());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all,
            (std::vector<std::string>{"[4,1,1,1]", "[4,2,2,1]", "[4,3,1,2]"}));
}

}  // namespace
}  // namespace tokenmeter::testing
