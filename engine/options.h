// tokenmeter-engine's command line (docs/engine.md lists every flag; the
// ones in /work/shared/design/interfaces.md are fixed).
#ifndef TOKENMETER_ENGINE_OPTIONS_H_
#define TOKENMETER_ENGINE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/status.h"
#include "engine/workload.h"

namespace tokenmeter::engine {

enum class Backend : uint8_t { kAuto, kCpu, kCuda };

struct EngineOptions {
  WorkloadOptions workload;
  SchedulerOptions scheduler;
  KvCacheOptions kv;
  ModelConfig model;  // from --model-size; vocab feeds the workload
  Backend backend = Backend::kAuto;
  float temperature = 1.0f;  // 0: greedy

  bool metrics = true;
  std::string metrics_socket;  // default TM_DEFAULT_SOCKET_PATH
  std::string engine_name = "tokenmeter-engine";
  std::string model_name;  // default "tokenmeter-<size>"
  std::string instance;
  std::string scope;
  std::string report_path;
  bool quiet = false;

  bool show_help = false;
  bool show_version = false;
};

// Parses argv (argv[0] skipped; `--flag value` and `--flag=value`) and
// checks the combination: a request must fit the model's context and the
// KV cache. Errors name the flag.
Status ParseOptions(int argc, const char* const* argv, EngineOptions* o);

std::string_view UsageText();

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_OPTIONS_H_
