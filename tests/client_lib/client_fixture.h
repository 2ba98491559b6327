// A fixture for tests of the C ABI: a temp dir with a short socket path, an
// optional TestServer on it, and one tm_client closed at the end.
#ifndef TOKENMETER_TESTS_CLIENT_LIB_CLIENT_FIXTURE_H_
#define TOKENMETER_TESTS_CLIENT_LIB_CLIENT_FIXTURE_H_

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "protocol_checks.h"
#include "test_server.h"
#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::testing {

struct OptionsDeleter {
  void operator()(tm_options* o) const { tm_options_free(o); }
};
using OptionsPtr = std::unique_ptr<tm_options, OptionsDeleter>;

using StatsArray = std::array<uint64_t, TM_STAT_COUNT>;

class ClientFixture : public ::testing::Test {
 protected:
  ClientFixture();
  ~ClientFixture() override;

  // Starts the fake daemon on socket_path_ (fatal failure if it cannot).
  void StartServer();
  // Options with socket_path_ and model "m"; everything else default.
  OptionsPtr DefaultOptions() const;
  // Creates client_ from `opts` (fatal failure if that fails).
  void NewClient(const tm_options* opts);
  void NewClient() { NewClient(DefaultOptions().get()); }
  // Closes client_; returns tm_client_close's result and the final stats.
  int CloseClient(StatsArray* stats = nullptr);
  StatsArray Stats() const;

  // Waits until the server has seen at least `n` events in all.
  bool WaitForEvents(size_t n);
  // Waits until connection `index` has been closed by the client.
  bool WaitForEof(size_t index);
  // Waits until the server has read every connection to its end: after
  // CloseClient() returned, so that a Snapshot() holds all the client
  // wrote (close returns once the bytes are in the socket, which the
  // server's thread may not have read yet).
  bool WaitForAllEof();

  TempDir dir_;
  std::string socket_path_;
  std::unique_ptr<TestServer> server_;
  tm_client* client_ = nullptr;
};

}  // namespace tokenmeter::testing

#endif  // TOKENMETER_TESTS_CLIENT_LIB_CLIENT_FIXTURE_H_
