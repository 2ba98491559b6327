// The snapshotter (daemon/state/snapshotter.h) on a real loop and a temp
// directory: inactive without a directory, the start-up errors, the timer's
// writes and the on-written callback, the final snapshot (also while a
// write is in flight), a failing write, and Restore() of a good, a foreign
// and a half-taken snapshot.
#include "daemon/state/snapshotter.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "daemon/exposition/text_writer.h"
#include "testutil/poll.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon {
namespace {

using testutil::PollUntil;

const SnapshotFingerprint kFp{{"buckets", "naming", "labels"}};

class SnapshotterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    std::ofstream(dir_.File("boot_id")) << "boot-1\n";
  }
  void TearDown() override { EXPECT_EQ(uv_loop_close(&loop_), 0); }

  SnapshotterOptions Options() {
    return {dir_.File("state"), 5'000'000, dir_.File("boot_id")};
  }
  std::unique_ptr<Snapshotter> Make(const SnapshotterOptions& o) {
    std::unique_ptr<Snapshotter> s;
    const Status st = Snapshotter::Create(&loop_, o, &s);
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
  }
  void Close(Snapshotter& s) {
    bool done = false;
    s.Close([&done] { done = true; });
    ASSERT_TRUE(PollUntil([&] {
      uv_run(&loop_, UV_RUN_NOWAIT);
      return done;
    }));
    // A write still on the pool finishes before the loop may close.
    ASSERT_TRUE(PollUntil([&] { return uv_run(&loop_, UV_RUN_NOWAIT) == 0; }));
  }
  // The payload a snapshot in the state directory holds ("" if it is not
  // accepted).
  std::string Payload(const SnapshotFingerprint& fp = kFp) {
    std::string payload;
    LoadSnapshot(StateDir{dir_.File("state")}, UINT64_MAX, "boot-1", fp,
                 [&](StateReader& r) {
                   payload = r.Str();
                   return r.ok() && r.at_end();
                 });
    return payload;
  }
  std::string Families(const Snapshotter& s) {
    std::string out;
    TextWriter w(ExpositionFormat::kText004, out);
    w.BeginFamily("", "snapshots", MetricType::kCounter, "h");
    s.Collect(kStateSnapshots, w);
    w.BeginFamily("", "restored", MetricType::kGauge, "h");
    s.Collect(kStateRestored, w);
    return out;
  }

  testutil::TempDir dir_;
  uv_loop_t loop_{};
};

TEST_F(SnapshotterTest, InactiveWithoutADirectory) {
  auto s = Make({"", 1'000'000, "/nonexistent/boot_id"});
  EXPECT_FALSE(s->enabled());
  bool applied = true;
  EXPECT_EQ(s->Restore(
                kFp, [](StateReader&) { return true; }, &applied),
            LoadOutcome::kNone);
  EXPECT_FALSE(applied);
  s->Start(
      kFp, [](StateWriter&) { FAIL() << "encoded"; }, [] {});
  s->WriteFinal("nothing");
  const std::string f = Families(*s);
  EXPECT_NE(f.find("snapshots_total{result=\"ok\"} 0\n"), std::string::npos)
      << f;
  EXPECT_NE(f.find("restored 0\n"), std::string::npos) << f;
  Close(*s);
}

TEST_F(SnapshotterTest, StartUpErrorsNameTheFlag) {
  std::unique_ptr<Snapshotter> s;
  SnapshotterOptions o = Options();
  o.boot_id_file = dir_.File("missing");
  Status st = Snapshotter::Create(&loop_, o, &s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--boot-id-file"), std::string::npos);
  o = Options();
  o.dir = dir_.File("boot_id");  // a file, not a directory
  st = Snapshotter::Create(&loop_, o, &s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--state-dir"), std::string::npos);
  EXPECT_NE(st.message().find("not a directory"), std::string::npos);
}

TEST_F(SnapshotterTest, WritesEveryIntervalAndSaysWhenOneIsOnDisk) {
  auto s = Make(Options());
  int encoded = 0, written = 0;
  s->Start(
      kFp,
      [&](StateWriter& w) {
        ++encoded;
        w.Str("payload " + std::to_string(encoded));
      },
      [&] { ++written; });
  ASSERT_TRUE(PollUntil([&] {
    uv_run(&loop_, UV_RUN_NOWAIT);
    return written >= 3;
  }));
  EXPECT_GE(s->written(), 3u);
  EXPECT_EQ(s->failed(), 0u);
  EXPECT_EQ(Payload().rfind("payload ", 0), 0u);
  // A snapshot with another fingerprint is not this one's.
  EXPECT_EQ(Payload({{"other", "naming", "labels"}}), "");
  Close(*s);
  // After Close() nothing more is written.
  const int at_close = encoded;
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(encoded, at_close);
}

// A snapshot past max_snapshot_bytes is still written (logged once): the
// ACKs do not wait on it; a restart with that bound sets it aside unread,
// one with a bound that fits restores it.
TEST_F(SnapshotterTest, ASnapshotPastTheBoundIsWrittenAndSetAsideAtRestart) {
  SnapshotterOptions o = Options();
  o.max_snapshot_bytes = 16;
  auto s = Make(o);
  int written = 0;
  s->Start(
      kFp, [](StateWriter& w) { w.Str(std::string(100, 'x')); },
      [&] { ++written; });
  ASSERT_TRUE(PollUntil([&] {
    uv_run(&loop_, UV_RUN_NOWAIT);
    return written >= 2;
  }));
  EXPECT_EQ(s->failed(), 0u);
  Close(*s);
  const auto restore = [&](uint64_t max_bytes) {
    SnapshotterOptions r = Options();
    r.max_snapshot_bytes = max_bytes;
    bool applied = false;
    return Make(r)->Restore(
        kFp, [](StateReader& rd) { return rd.Str().size() == 100; }, &applied);
  };
  EXPECT_EQ(restore(1 << 20), LoadOutcome::kRestored);
  EXPECT_EQ(restore(16), LoadOutcome::kSetAside);
  EXPECT_EQ(restore(1 << 20), LoadOutcome::kNone);
}

TEST_F(SnapshotterTest, FinalSnapshotWaitsForTheWriteInFlight) {
  auto s = Make(Options());
  std::string next = "periodic";
  s->Start(
      kFp, [&](StateWriter& w) { w.Str(next); }, [] {});
  // The first tick starts a write on the pool; the final one, asked for
  // while it is in flight, must come after it.
  ASSERT_TRUE(PollUntil([&] {
    uv_run(&loop_, UV_RUN_NOWAIT);
    return s->write_in_flight();
  }));
  bool done = false;
  s->Close([&done] { done = true; });
  next = "final";
  s->WriteFinal("test");
  EXPECT_EQ(s->written(), 0u);  // deferred
  ASSERT_TRUE(PollUntil([&] { return uv_run(&loop_, UV_RUN_NOWAIT) == 0; }));
  EXPECT_TRUE(done);
  EXPECT_EQ(s->written(), 2u);
  EXPECT_EQ(Payload(), "final");
  EXPECT_EQ(s->failed(), 0u);
}

TEST_F(SnapshotterTest, AFailingWriteIsCountedAndTheNextOneRecovers) {
  auto s = Make(Options());
  int written = 0;
  s->Start(
      kFp, [](StateWriter& w) { w.Str("x"); }, [&] { ++written; });
  std::filesystem::remove_all(dir_.File("state"));
  ASSERT_TRUE(PollUntil([&] {
    uv_run(&loop_, UV_RUN_NOWAIT);
    return s->failed() >= 2;
  }));
  EXPECT_EQ(written, 0);  // no ACK may name what is not on disk
  std::filesystem::create_directory(dir_.File("state"));
  ASSERT_TRUE(PollUntil([&] {
    uv_run(&loop_, UV_RUN_NOWAIT);
    return written >= 1;
  }));
  const std::string f = Families(*s);
  EXPECT_NE(f.find("snapshots_total{result=\"error\"} " +
                   std::to_string(s->failed()) + "\n"),
            std::string::npos)
      << f;
  Close(*s);
}

TEST_F(SnapshotterTest, RestoresWhatTheLastOneWrote) {
  {
    auto s = Make(Options());
    s->Start(
        kFp,
        [&s](StateWriter& w) {
          w.Str("state");
          s->SaveState(w);
        },
        [] {});
    bool done = false;
    s->Close([&done] { done = true; });
    s->WriteFinal("test");
    ASSERT_TRUE(PollUntil([&] { return uv_run(&loop_, UV_RUN_NOWAIT) == 0; }));
    EXPECT_EQ(s->written(), 1u);
  }
  auto s = Make(Options());
  bool applied = false;
  std::string got;
  EXPECT_EQ(s->Restore(
                kFp,
                [&](StateReader& r) {
                  got = r.Str();
                  s->LoadState(r);
                  return r.ok() && r.at_end();
                },
                &applied),
            LoadOutcome::kRestored);
  EXPECT_TRUE(applied);
  EXPECT_TRUE(s->restored());
  EXPECT_EQ(got, "state");
  // The snapshot counted itself.
  EXPECT_EQ(s->written(), 1u);
  EXPECT_NE(Families(*s).find("restored 1\n"), std::string::npos);
}

TEST_F(SnapshotterTest, AHalfTakenSnapshotIsSetAsideAndCountsFromZero) {
  {
    auto s = Make(Options());
    s->Start(
        kFp,
        [&s](StateWriter& w) {
          s->SaveState(w);
          w.Str("more");
        },
        [] {});
    bool done = false;
    s->Close([&done] { done = true; });
    s->WriteFinal("test");
    ASSERT_TRUE(PollUntil([&] { return uv_run(&loop_, UV_RUN_NOWAIT) == 0; }));
  }
  auto s = Make(Options());
  bool applied = false;
  EXPECT_EQ(s->Restore(
                kFp,
                [&](StateReader& r) {
                  s->LoadState(r);
                  return false;  // the rest does not decode
                },
                &applied),
            LoadOutcome::kSetAside);
  EXPECT_TRUE(applied);
  EXPECT_FALSE(s->restored());
  EXPECT_EQ(s->written(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir_.File("state/snapshot")));
  // A foreign one is set aside before anything is applied.
  std::ofstream(dir_.File("state/snapshot")) << "not a snapshot";
  auto t = Make(Options());
  EXPECT_EQ(t->Restore(
                kFp, [](StateReader&) { return true; }, &applied),
            LoadOutcome::kSetAside);
  EXPECT_FALSE(applied);
}

}  // namespace
}  // namespace tokenmeter::daemon
