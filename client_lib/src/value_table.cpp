#include "value_table.h"

#include <cstring>
#include <new>

#include "tokenmeter/protocol.h"

namespace tokenmeter::client {

int ValueTable::Register(const char* value, std::atomic<uint32_t>* published) {
  if (value == nullptr) return TM_E_INVALID;
  const size_t len = strnlen(value, TM_MAX_LABEL_VALUE_BYTES + 1);
  if (tm_proto_valid_label_value(value, len) == 0) return TM_E_INVALID;
  const std::string_view v(value, len);
  std::lock_guard lock(mu_);
  const uint32_t n = count_.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < n; ++i) {
    if (*values_[i] == v) return int(i + 1);
  }
  if (n == TM_MAX_VALUE_IDS) return TM_E_NOMEM;
  try {
    values_[n] = std::make_unique<const std::string>(v);
  } catch (const std::bad_alloc&) {
    return TM_E_NOMEM;
  }
  count_.store(n + 1, std::memory_order_release);
  published->store(n + 1, std::memory_order_release);
  return int(n + 1);
}

std::string_view ValueTable::Get(uint32_t id) const {
  if (id == 0 || id > count_.load(std::memory_order_acquire)) return "";
  return *values_[id - 1];
}

}  // namespace tokenmeter::client
