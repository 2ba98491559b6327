#include "daemon/logging/log_setup.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/logging/log_text.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace tokenmeter::daemon {
namespace {

// %* -> "<N>", the syslog priority of the message's level (sd-daemon(3)).
class PriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    char p = '6';
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        p = '7';
        break;
      case spdlog::level::info:
        p = '6';
        break;
      case spdlog::level::warn:
        p = '4';
        break;
      case spdlog::level::err:
        p = '3';
        break;
      case spdlog::level::critical:
        p = '2';
        break;
      default:
        break;
    }
    const char text[3] = {'<', p, '>'};
    dest.append(text, text + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityFlag>();
  }
};

// %~ -> the message, escaped by AppendLogText(): whatever a peer put into
// it stays on this line, after this line's own prefix.
class MessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    text_.clear();
    AppendLogText(std::string_view(msg.payload.data(), msg.payload.size()),
                  &text_);
    dest.append(text_.data(), text_.data() + text_.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<MessageFlag>();
  }

 private:
  std::string text_;  // reused: the logger serializes calls (a _mt sink)
};

}  // namespace

bool StderrIsJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (env == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (fstat(2, &st) != 0) return false;
  return st.st_dev == dev && st.st_ino == ino;
}

Status SetUpLogging(std::string_view level) {
  const spdlog::level::level_enum lvl =
      spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return Status::Error("unknown log level \"" + std::string(level) + "\"");
  }
  auto logger = std::make_shared<spdlog::logger>(
      "tokenmeterd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<MessageFlag>('~');
  if (StderrIsJournal()) {
    formatter->add_flag<PriorityFlag>('*').set_pattern("%*%~");
  } else {
    formatter->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %~");
  }
  logger->set_formatter(std::move(formatter));
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  return Status::Ok();
}

}  // namespace tokenmeter::daemon
