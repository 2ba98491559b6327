// libFuzzer target: Accept and Accept-Encoding parsing (daemon/http/
// negotiation.h promises total functions over arbitrary bytes). The input
// is split at its first '\n': Accept before, Accept-Encoding after.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "daemon/http/negotiation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokenmeter::daemon::http;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string_view accept = in.substr(0, nl);
  const std::string_view encoding =
      nl == std::string_view::npos ? in : in.substr(nl + 1);
  const Format f = ChooseFormat(accept);
  if (f != Format::kText004 && f != Format::kOpenMetrics100) __builtin_trap();
  if (ContentType(f).empty()) __builtin_trap();
  // Deterministic: the same header gives the same answer.
  if (ChooseFormat(accept) != f) __builtin_trap();
  const bool gzip = AcceptsGzip(encoding);
  if (AcceptsGzip(encoding) != gzip) __builtin_trap();
  // An empty header never selects OpenMetrics nor gzip.
  if (ChooseFormat({}) != Format::kText004 || AcceptsGzip({})) {
    __builtin_trap();
  }
  return 0;
}
