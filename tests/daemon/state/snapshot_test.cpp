// State snapshots (daemon/state/): the components' SaveState() / LoadState()
// round trip (the restored daemon shows the same exposition and goes on as
// the original would), and a load of every truncation and of random
// corruptions of a valid payload, which must fail or succeed without
// touching memory it should not (run under ASan/UBSan in CI's sanitizer
// tree), plus the file-level helpers.
#include "daemon/state/snapshot.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/config.h"
#include "daemon/exposition/exposition.h"
#include "daemon/exposition/proto_writer.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/store/parts/cache_config.h"
#include "daemon/store/parts/lora.h"
#include "daemon/store/parts/moe.h"
#include "daemon/store/registry.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon {
namespace {

constexpr uint64_t kMs = 1'000'000;

class FixedClock : public Clock {
 public:
  uint64_t NowNs() const override { return now; }
  double UnixNowS() const override { return 1'700'000'000; }
  uint64_t now = 100'000 * kMs * 1000;
};

// The components a snapshot holds, wired as the daemon wires them.
struct Components {
  uv_loop_t loop{};
  Config config;
  FixedClock clock;
  std::unique_ptr<Pipeline> pipeline;
  Registry* reg = nullptr;
  IngestStats* stats = nullptr;
  Tracker* tracker = nullptr;
  IngestServer* server = nullptr;

  explicit Components(int native_schema = 3) {
    uv_loop_init(&loop);
    config.registry.native_histogram_schema = native_schema;
    config.registry.request_labels = {"tenant"};
    config.registry.moe_expert_series = true;
    EXPECT_TRUE(Pipeline::Create(
                    &loop, clock,
                    {config.registry, config.tracker, config.ingest}, &pipeline)
                    .ok());
    reg = &pipeline->registry();
    stats = &pipeline->stats();
    tracker = &pipeline->tracker();
    server = &pipeline->server();
  }
  ~Components() {
    pipeline.reset();
    uv_loop_close(&loop);
  }

  std::string Save() {
    std::string out;
    StateWriter w(out);
    pipeline->SaveState(w);
    return out;
  }
  bool Load(const std::string& bytes) {
    StateReader r(bytes.data(), bytes.size());
    pipeline->LoadState(r);
    return r.ok() && r.at_end();
  }
  std::string Exposition() const {
    std::string out;
    Render(*reg, ExpositionFormat::kText004, out);
    return out;
  }
  // The protobuf exposition: the native buckets too.
  std::string Protobuf() const {
    std::string out;
    ProtoWriter w(out);
    Render(*reg, w);
    return out;
  }
  EngineSeries* Series(const std::string& instance) {
    return reg->GetOrCreate(
        SeriesIdentity{"vllm", "m", instance, {{"zone", "b"}, {"dc", "a"}}});
  }
};

Event Ev(EventKind kind, uint64_t t, uint64_t id, uint64_t count = 0) {
  Event ev{};
  ev.kind = kind;
  ev.t_ns = t;
  ev.rid.number = id;
  ev.count = count;
  return ev;
}

// Requests in every state (waiting, running, finished in grace), string
// and integer ids, per-request labels and adapters, MoE, cache_config and
// client drops.
void Fill(Components& c) {
  const uint64_t t0 = c.clock.now - 1000 * kMs;
  for (int s = 0; s < 3; ++s) {
    EngineSeries* series = c.Series("dp" + std::to_string(s));
    ASSERT_NE(series, nullptr);
    series->part<CacheConfigPart>().Set({{"block_size", "16", 16}});
    series->part<LoraPart>().SetMaxLora(4);
    const uint64_t load[4] = {1, 2, 3, uint64_t(s)};
    // As the tracker applies a first EXPERT_LOAD: the layer's places first.
    ASSERT_TRUE(c.reg->ReserveMoeLayer(4));
    ASSERT_TRUE(series->part<MoePart>().Add(
        0, std::span<const uint64_t>(load, 4), true));
    const Source src{series, uint64_t(10 + s)};
    for (uint64_t i = 0; i < 40; ++i) {
      ArrivedExtras x;
      x.lora = i % 3 == 0 ? "adapter-a" : "";
      x.num_labels = 1;
      x.labels[0] = {"tenant", i % 2 ? "t1" : "t2"};
      const std::string name = "req-" + std::to_string(i);
      Event ev = Ev(EventKind::kArrived, t0 + i * kMs, i, 10 + i);
      if (i % 2 == 0) {
        ev.rid.is_string = true;
        ev.rid.text = name;
      }
      ev.extras = 0;
      c.tracker->Apply(src, ev, nullptr, c.clock.now, std::span(&x, 1));
      ev.extras = Event::kNoExtras;
      if (i % 4 == 0) continue;  // waiting
      ev.kind = EventKind::kScheduled;
      ev.t_ns += 2 * kMs;
      c.tracker->Apply(src, ev, nullptr, c.clock.now);
      ev.kind = EventKind::kTokens;
      ev.t_ns += 3 * kMs;
      ev.count = 2;
      c.tracker->Apply(src, ev, nullptr, c.clock.now);
      if (i % 4 == 1) continue;  // running
      ev.kind = EventKind::kFinished;
      ev.t_ns += 5 * kMs;
      ev.reason = FinishReason::kLength;
      c.tracker->Apply(src, ev, nullptr, c.clock.now);
    }
    // Decode-side requests (protocol 1.2): a KV wait still open at the
    // save (finished, SCHEDULED not yet in), and a negative one.
    for (uint64_t i = 100; i < 102; ++i) {
      Event kv = Ev(EventKind::kKvTransfer, t0 + 20 * kMs, i);
      kv.kv_transfer.role = KvRole::kRecv;
      kv.kv_transfer.ok = true;
      kv.kv_transfer.start_ns = t0 + 10 * kMs;
      c.tracker->Apply(src, kv, nullptr, c.clock.now);
      if (i == 101) {
        c.tracker->Apply(src, Ev(EventKind::kScheduled, t0 + 30 * kMs, i),
                         nullptr, c.clock.now);
      }
      c.tracker->Apply(src, Ev(EventKind::kTokens, t0 + 40 * kMs, i, 1),
                       nullptr, c.clock.now);
      c.tracker->Apply(src, Ev(EventKind::kFinished, t0 + 50 * kMs, i), nullptr,
                       c.clock.now);
    }
    c.stats->SetClientDropped("vllm", "m", "dp" + std::to_string(s), 42 + s, 7);
  }
}

TEST(StateTest, RoundTripShowsTheSameAndGoesOnTheSame) {
  Components a;
  Fill(a);
  const std::string bytes = a.Save();
  Components b;
  ASSERT_TRUE(b.Load(bytes));
  EXPECT_EQ(b.tracker->size(), a.tracker->size());
  EXPECT_EQ(b.Exposition(), a.Exposition());
  EXPECT_TRUE(b.Protobuf() == a.Protobuf());
  EXPECT_TRUE(b.Save() == bytes);  // (not EXPECT_EQ: 58 kB of bytes)
  // The same later events (tokens and finishes of restored requests, new
  // ones) give the same exposition in both.
  for (Components* c : {&a, &b}) {
    EngineSeries* s = c->Series("dp1");
    const Source src{s, 11};
    const uint64_t t = c->clock.now;
    for (uint64_t i = 0; i < 40; ++i) {
      const std::string name = "req-" + std::to_string(i);
      Event ev = Ev(EventKind::kTokens, t - 100 * kMs, i, 1);
      if (i % 2 == 0) {
        ev.rid.is_string = true;
        ev.rid.text = name;
      }
      c->tracker->Apply(src, ev, nullptr, t);
      ev.kind = EventKind::kFinished;
      ev.t_ns += kMs;
      ev.reason = FinishReason::kStop;
      c->tracker->Apply(src, ev, nullptr, t);
    }
    // The open KV wait closes with its SCHEDULED, restored or not.
    c->tracker->Apply(src, Ev(EventKind::kScheduled, t - 990 * kMs, 100),
                      nullptr, t);
    c->clock.now += 700'000 * kMs;  // past every grace and idle timeout
    c->tracker->Sweep();
  }
  EXPECT_EQ(b.Exposition(), a.Exposition());
  EXPECT_TRUE(b.Protobuf() == a.Protobuf());
  EXPECT_EQ(b.tracker->size(), 0u);
  // dp1's open wait was observed after the load (10 ms), the others' left
  // incomplete; each series' recv before SCHEDULED counted negative.
  EXPECT_EQ(b.Series("dp1")->hist(kRequestKvWaitTime).count(), 1u);
  EXPECT_EQ(b.Series("dp0")->hist(kRequestKvWaitTime).count(), 0u);
  EXPECT_EQ(b.tracker->negative(Interval::kKvWait), 3u);
  EXPECT_EQ(b.tracker->incomplete(Interval::kKvWait), 2u);
}

// Format 1 (before native buckets) holds a histogram as its counts, count
// and raw sum: it loads with the native buckets empty and the classic
// figures kept, and the same bytes read as format 2 fail.
TEST(StateTest, HistogramFromFormatOneLoadsWithEmptyNativeBuckets) {
  const HistogramLayout layout({0.01, 0.1, 1}, 1e9);
  std::string v1;
  StateWriter w(v1);
  w.U64(4);  // bucket counts: 0.01, 0.1, 1, +Inf
  for (uint64_t c : {3, 0, 2, 1}) w.U64(c);
  w.U64(6);
  w.F64(4.5e9);
  Histogram h(&layout);
  h.Observe(5e7);  // replaced by the load
  StateReader r(v1.data(), v1.size(), 1);
  h.LoadState(r);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.at_end());
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{3, 0, 2, 1}));
  EXPECT_EQ(h.count(), 6u);
  EXPECT_EQ(h.sum(), 4.5);
  EXPECT_EQ(h.native().populated(), 0u);
  EXPECT_EQ(h.native().zero_count(), 0u);
  h.Observe(2e8);  // goes on from there
  EXPECT_EQ(h.count(), 7u);
  EXPECT_EQ(h.native().populated(), 1u);
  Histogram again(&layout);
  StateReader as_v2(v1.data(), v1.size());
  again.LoadState(as_v2);
  EXPECT_FALSE(as_v2.ok() && as_v2.at_end());
}

// A snapshot of a daemon with another --native-histogram-schema loads: a
// finer schema is reduced to the configured one, a coarser one stays (the
// schema only ever decreases); the classic buckets are untouched.
TEST(StateTest, NativeSchemaChangesAcrossRestarts) {
  for (const auto& [saved, configured, shown] :
       {std::tuple{5, 3, 3}, std::tuple{1, 3, 1}, std::tuple{3, 3, 3}}) {
    SCOPED_TRACE(std::to_string(saved) + " -> " + std::to_string(configured));
    Components a(saved);
    Fill(a);
    Histogram& observed = a.Series("dp0")->hist(kTimeToFirstToken);
    for (int i = 0; i < 1000; ++i) observed.Observe(1e6 * (1 + i));
    Components b(configured);
    ASSERT_TRUE(b.Load(a.Save()));
    EXPECT_EQ(b.Exposition(), a.Exposition());
    const Histogram& h = b.Series("dp0")->hist(kTimeToFirstToken);
    ASSERT_GT(h.count(), 0u);
    EXPECT_EQ(h.native().schema(), shown);
    uint64_t total = h.native().zero_count();
    h.native().ForEachBucket(true, [&](int32_t, uint64_t n) { total += n; });
    EXPECT_EQ(total, h.count());
  }
}

TEST(StateTest, EveryTruncationFails) {
  Components a;
  Fill(a);
  const std::string bytes = a.Save();
  for (size_t n = 0; n < bytes.size(); n += 1 + n / 64) {
    Components b;
    EXPECT_FALSE(b.Load(bytes.substr(0, n))) << n << " of " << bytes.size();
  }
  Components b;
  EXPECT_FALSE(b.Load(bytes + "x"));  // trailing bytes
}

TEST(StateTest, RandomCorruptionsNeverCrash) {
  Components a;
  Fill(a);
  const std::string bytes = a.Save();
  std::mt19937_64 rng(17);
  int loaded = 0;
  for (int i = 0; i < 400; ++i) {
    std::string bad = bytes;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      bad[rng() % bad.size()] = char(rng());
    }
    Components b;
    if (b.Load(bad)) {
      ++loaded;
      // Whatever loaded must render and go on without harm.
      b.Exposition();
      b.clock.now += 700'000 * kMs;
      b.tracker->Sweep();
    }
  }
  // Most flips land in values (counts, times) and still decode; some hit
  // lengths, ids and enums and are refused. Both happen.
  EXPECT_GT(loaded, 0);
  EXPECT_LT(loaded, 400);
}

// The snapshot's format version: the readable ones reach apply() with the
// reader set to that version; one outside them is set aside unread.
TEST(StateTest, SnapshotVersionsReadAndRefused) {
  char dir[] = "/tmp/tm-state-version-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  const SnapshotFingerprint fp{{"b", "n", "r"}};
  for (const uint32_t version : {0u, 1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE(version);
    std::string bytes;
    EncodeSnapshot(
        "boot", fp, [](StateWriter& w) { w.U64(42); }, &bytes);
    // The version follows the 8-byte magic (little-endian u32).
    for (int i = 0; i < 4; ++i)
      bytes[8 + i] = char((version >> (8 * i)) & 0xff);
    SealSnapshot(&bytes);
    ASSERT_TRUE(WriteFileAtomically(StateDir{d}, "snapshot", bytes).ok());
    uint32_t seen = 0;
    const LoadOutcome got =
        LoadSnapshot(StateDir{d}, UINT64_MAX, "boot", fp, [&](StateReader& r) {
          seen = r.version();
          return r.U64() == 42 && r.at_end();
        });
    const bool readable = version >= 1 && version <= kSnapshotVersion;
    EXPECT_EQ(got, readable ? LoadOutcome::kRestored : LoadOutcome::kSetAside);
    EXPECT_EQ(seen, readable ? version : 0u);
    std::filesystem::remove_all(d);
    std::filesystem::create_directory(d);
  }
  std::filesystem::remove_all(d);
}

TEST(StateTest, FilesAndBootId) {
  char dir[] = "/tmp/tm-state-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  EXPECT_TRUE(PrepareStateDir(StateDir{d + "/sub"}).ok());
  EXPECT_TRUE(
      WriteFileAtomically(StateDir{d + "/sub"}, "snapshot", "abc").ok());
  std::ifstream in(d + "/sub/snapshot");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "abc");
  const Status s =
      WriteFileAtomically(StateDir{d + "/missing"}, "snapshot", "abc");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(d + "/missing/snapshot.tmp"), std::string::npos)
      << s.message();
  std::string id;
  EXPECT_TRUE(ReadBootId("/proc/sys/kernel/random/boot_id", &id).ok());
  EXPECT_EQ(id.size(), 36u) << id;
  { std::ofstream f(d + "/empty"); }
  EXPECT_FALSE(ReadBootId(d + "/empty", &id).ok());
  EXPECT_FALSE(ReadBootId(d + "/none", &id).ok());
  EXPECT_FALSE(PrepareStateDir(StateDir{d + "/empty"}).ok());  // a file
  std::remove((d + "/sub/snapshot").c_str());
  std::remove((d + "/empty").c_str());
  rmdir((d + "/sub").c_str());
  rmdir(d.c_str());
}

// ---- what the daemon trusts in its state directory

// A state directory of the test's uid, mode 0750, with helpers to put a
// snapshot (or something else) at DIR/snapshot and to load it.
class StateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    ASSERT_TRUE(PrepareStateDir(dir_).ok());
  }
  std::string Path(const std::string& name) const {
    return dir_.path + "/" + name;
  }
  static std::string Valid() {
    std::string bytes;
    EncodeSnapshot(
        "boot", kFp, [](StateWriter& w) { w.U64(42); }, &bytes);
    SealSnapshot(&bytes);
    return bytes;
  }
  void Put(const std::string& bytes) {
    ASSERT_TRUE(WriteFileAtomically(dir_, kSnapshotName, bytes).ok());
  }
  // LoadSnapshot() on another thread, at most 5 s: a FIFO opened for
  // reading would block it (`fifo` is then opened for writing, which
  // releases it, so the test fails instead of hanging).
  LoadOutcome Load(uint64_t max_bytes = UINT64_MAX,
                   const std::string& fifo = "") {
    applied_ = false;
    auto done = std::async(std::launch::async, [&] {
      return LoadSnapshot(dir_, max_bytes, "boot", kFp, [&](StateReader& r) {
        applied_ = true;
        return r.U64() == 42 && r.at_end();
      });
    });
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << "LoadSnapshot() blocked";
      if (!fifo.empty()) close(open(fifo.c_str(), O_WRONLY | O_NONBLOCK));
    }
    return done.get();
  }
  // The one file set aside, or "".
  std::string SetAsideFile() const {
    std::string found;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path)) {
      const std::string name = e.path().filename();
      if (name.rfind("snapshot.set-aside.", 0) == 0) {
        EXPECT_TRUE(found.empty()) << "two set aside";
        found = e.path();
      }
    }
    return found;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  static inline const SnapshotFingerprint kFp{{"b", "n", "r"}};
  testutil::TempDir tmp_;
  StateDir dir_{tmp_.path() + "/state"};
  bool applied_ = false;
};

TEST_F(StateDirTest, RestoresItsOwnRegularFileUpToTheBound) {
  const std::string bytes = Valid();
  Put(bytes);
  EXPECT_EQ(Load(bytes.size()), LoadOutcome::kRestored);
  EXPECT_TRUE(applied_);
  EXPECT_EQ(SetAsideFile(), "");
}

TEST_F(StateDirTest, SetsAsideAFileOverTheBoundUnread) {
  const std::string bytes = Valid();
  Put(bytes);
  EXPECT_EQ(Load(bytes.size() - 1), LoadOutcome::kSetAside);
  EXPECT_FALSE(applied_);
  EXPECT_EQ(Read(SetAsideFile()), bytes);
}

// 2 GiB of holes: set aside on its size alone, in far less time than
// reading it would take.
TEST_F(StateDirTest, SetsAsideAHugeSparseFileWithoutReadingIt) {
  const int fd = open(Path("snapshot").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "TMSTATE\n", 8), 8);
  ASSERT_EQ(ftruncate(fd, off_t{2} << 30), 0);
  close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Load(uint64_t{1} << 20), LoadOutcome::kSetAside);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_FALSE(applied_);
  EXPECT_NE(SetAsideFile(), "");
}

TEST_F(StateDirTest, SetsAsideAFifoWithoutBlocking) {
  ASSERT_EQ(mkfifo(Path("snapshot").c_str(), 0600), 0);
  EXPECT_EQ(Load(UINT64_MAX, Path("snapshot")), LoadOutcome::kSetAside);
  struct stat st {};
  ASSERT_EQ(lstat(SetAsideFile().c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(std::filesystem::exists(Path("snapshot")));
}

TEST_F(StateDirTest, SetsAsideADirectoryInItsPlace) {
  ASSERT_EQ(mkdir(Path("snapshot").c_str(), 0700), 0);
  EXPECT_EQ(Load(), LoadOutcome::kSetAside);
  EXPECT_TRUE(std::filesystem::is_directory(SetAsideFile()));
}

// A link to a good snapshot elsewhere is neither followed nor restored;
// the link is set aside, its target left as it was.
TEST_F(StateDirTest, SetsAsideASymbolicLinkUnfollowed) {
  const std::string elsewhere = tmp_.File("elsewhere");
  std::ofstream(elsewhere) << Valid();
  ASSERT_EQ(symlink(elsewhere.c_str(), Path("snapshot").c_str()), 0);
  EXPECT_EQ(Load(), LoadOutcome::kSetAside);
  EXPECT_FALSE(applied_);
  EXPECT_TRUE(std::filesystem::is_symlink(SetAsideFile()));
  EXPECT_EQ(Read(elsewhere), Valid());
}

TEST_F(StateDirTest, SetsAsideAFileOthersCanWrite) {
  for (const mode_t mode : {0666, 0620, 0602}) {
    SCOPED_TRACE(mode);
    Put(Valid());
    ASSERT_EQ(chmod(Path("snapshot").c_str(), mode), 0);
    EXPECT_EQ(Load(), LoadOutcome::kSetAside);
    EXPECT_FALSE(applied_);
    std::filesystem::remove(SetAsideFile());
  }
}

TEST_F(StateDirTest, SetsAsideAFileOfAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another uid needs root";
  Put(Valid());
  ASSERT_EQ(chown(Path("snapshot").c_str(), 65534, 65534), 0);
  EXPECT_EQ(Load(), LoadOutcome::kSetAside);
  EXPECT_FALSE(applied_);
}

// Whatever is at the temporary name goes: the write neither blocks on a
// FIFO nor writes through a link.
TEST_F(StateDirTest, WriteReplacesAFifoAtTheTemporaryName) {
  ASSERT_EQ(mkfifo(Path("snapshot.tmp").c_str(), 0600), 0);
  auto done = std::async(std::launch::async, [&] {
    return WriteFileAtomically(dir_, kSnapshotName, "abc");
  });
  if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "WriteFileAtomically() blocked";
    close(open(Path("snapshot.tmp").c_str(), O_RDONLY | O_NONBLOCK));
  }
  EXPECT_TRUE(done.get().ok());
  EXPECT_EQ(Read(Path("snapshot")), "abc");
  EXPECT_FALSE(std::filesystem::exists(Path("snapshot.tmp")));
}

TEST_F(StateDirTest, WriteNeverFollowsALinkAtTheTemporaryName) {
  const std::string victim = tmp_.File("victim");
  std::ofstream(victim) << "precious";
  ASSERT_EQ(symlink(victim.c_str(), Path("snapshot.tmp").c_str()), 0);
  EXPECT_TRUE(WriteFileAtomically(dir_, kSnapshotName, "abc").ok());
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_EQ(Read(Path("snapshot")), "abc");
  EXPECT_FALSE(std::filesystem::is_symlink(Path("snapshot")));
}

TEST_F(StateDirTest, WriteFailsOnADirectoryAtTheTemporaryName) {
  ASSERT_EQ(mkdir(Path("snapshot.tmp").c_str(), 0700), 0);
  const Status s = WriteFileAtomically(dir_, kSnapshotName, "abc");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot remove " + Path("snapshot.tmp")),
            std::string::npos)
      << s.message();
}

TEST_F(StateDirTest, RefusesADirectoryOthersCanWrite) {
  for (const mode_t mode : {0770, 0730, 0707, 01777}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(chmod(dir_.path.c_str(), mode), 0);
    const Status s = PrepareStateDir(dir_);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message().rfind("--state-dir: " + dir_.path, 0), 0u)
        << s.message();
    EXPECT_NE(s.message().find("writable by its group or others"),
              std::string::npos);
    EXPECT_NE(s.message().find("--state-dir-unsafe-ok"), std::string::npos);
    // The same on every later write and load, should it change after
    // the start: nothing written, nothing read.
    EXPECT_FALSE(WriteFileAtomically(dir_, kSnapshotName, "abc").ok());
    EXPECT_EQ(Load(), LoadOutcome::kNone);
    StateDir waived = dir_;
    waived.unsafe_ok = true;
    EXPECT_TRUE(PrepareStateDir(waived).ok());
    EXPECT_TRUE(WriteFileAtomically(waived, kSnapshotName, "abc").ok());
    EXPECT_TRUE(std::filesystem::remove(Path("snapshot")));
  }
}

TEST_F(StateDirTest, RefusesADirectoryOfAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another uid needs root";
  ASSERT_EQ(chown(dir_.path.c_str(), 65534, 65534), 0);
  const Status s = PrepareStateDir(dir_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is owned by uid 65534"), std::string::npos)
      << s.message();
  EXPECT_TRUE(PrepareStateDir({dir_.path, true}).ok());
}

// systemd's StateDirectory= with DynamicUser= makes /var/lib/NAME a link
// to private/NAME: the link is followed, the directory it names checked.
TEST_F(StateDirTest, FollowsALinkToADirectoryOfItsOwn) {
  const std::string link = tmp_.File("link");
  ASSERT_EQ(symlink(dir_.path.c_str(), link.c_str()), 0);
  EXPECT_TRUE(PrepareStateDir({link}).ok());
  EXPECT_TRUE(WriteFileAtomically({link}, kSnapshotName, "abc").ok());
  EXPECT_EQ(Read(Path("snapshot")), "abc");
}

TEST(StateTest, BootIdFileThatIsAFifoIsAnErrorNotAHang) {
  testutil::TempDir tmp;
  const std::string fifo = tmp.File("boot_id");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string id;
  EXPECT_FALSE(ReadBootId(fifo, &id).ok());
}

}  // namespace
}  // namespace tokenmeter::daemon
