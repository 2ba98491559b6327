// The protocol pieces tokenmeterd uses when built without libsystemd
// (tests/systemd/ runs the libsystemd build against real tools).
#include "daemon/service/systemd.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace tokenmeter::daemon {
namespace {

TEST(ListenFdsTest, NamesDescriptorsFromThree) {
  auto fds = ParseListenFds("42", "2", "ingest:http", 42);
  ASSERT_EQ(fds.size(), 2u);
  EXPECT_EQ(fds["ingest"], 3);
  EXPECT_EQ(fds["http"], 4);
}

TEST(ListenFdsTest, IgnoresAnotherProcesssDescriptors) {
  EXPECT_TRUE(ParseListenFds("41", "2", "ingest:http", 42).empty());
}

TEST(ListenFdsTest, MissingVariablesMeanNoSockets) {
  EXPECT_TRUE(ParseListenFds(nullptr, "1", "ingest", 42).empty());
  EXPECT_TRUE(ParseListenFds("42", nullptr, "ingest", 42).empty());
}

TEST(ListenFdsTest, UnnamedDescriptorsAreUnknown) {
  auto fds = ParseListenFds("42", "1", nullptr, 42);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(fds["unknown"], 3);
}

TEST(ListenFdsTest, GarbageCountGivesNothing) {
  EXPECT_TRUE(ParseListenFds("42", "-3", "x", 42).empty());
  EXPECT_TRUE(ParseListenFds("42", "abc", "x", 42).empty());
}

TEST(NotifyDatagramTest, ReachesAPathSocket) {
  char dir[] = "/tmp/tm-notify-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/n.sock";
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_TRUE(SendNotifyDatagram(path, "READY=1"));
  char buf[64] = {};
  EXPECT_EQ(recv(fd, buf, sizeof buf, 0), 7);
  EXPECT_STREQ(buf, "READY=1");
  close(fd);
  unlink(path.c_str());
  rmdir(dir);
}

TEST(NotifyDatagramTest, ReachesAnAbstractSocket) {
  const std::string name = "@tm-notify-test-" + std::to_string(getpid());
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data() + 1, name.size() - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr),
                 socklen_t(offsetof(sockaddr_un, sun_path) + name.size())),
            0);
  EXPECT_TRUE(SendNotifyDatagram(name, "STOPPING=1"));
  char buf[64] = {};
  EXPECT_EQ(recv(fd, buf, sizeof buf, 0), 10);
  EXPECT_STREQ(buf, "STOPPING=1");
  close(fd);
}

TEST(NotifyDatagramTest, FailsCleanlyWithoutAListener) {
  EXPECT_FALSE(SendNotifyDatagram("/tmp/tm-no-such-notify.sock", "READY=1"));
  EXPECT_FALSE(SendNotifyDatagram("", "READY=1"));
  EXPECT_FALSE(SendNotifyDatagram(std::string(200, 'x'), "READY=1"));
}

}  // namespace
}  // namespace tokenmeter::daemon
