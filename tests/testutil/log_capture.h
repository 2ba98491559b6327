// What the code under test logs while a LogCapture lives: a ring-buffer
// sink (the last 1000 lines) added to spdlog's default logger and removed
// again. Header-only; the test links spdlog through the daemon's
// dependencies. One at a time per process (tests run one after another).
#ifndef TOKENMETER_TESTS_TESTUTIL_LOG_CAPTURE_H_
#define TOKENMETER_TESTS_TESTUTIL_LOG_CAPTURE_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>

#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

namespace tokenmeter::testutil {

class LogCapture {
 public:
  LogCapture()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  // Lines containing `part`.
  size_t Count(const std::string& part) const {
    size_t n = 0;
    for (const std::string& line : sink_->last_formatted()) {
      if (line.find(part) != std::string::npos) ++n;
    }
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_TESTUTIL_LOG_CAPTURE_H_
