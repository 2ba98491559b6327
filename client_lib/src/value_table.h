// The client's registered label values (tm_register_value(), tokenmeter.h):
// up to TM_MAX_VALUE_IDS strings, each checked once, that the event calls
// then name by a one-byte id instead of passing, checking and copying the
// string on every call. The sender thread turns an id back into its string
// when it encodes the event, so the wire carries the string as before.
//
// Threads: Register() from any thread (a mutex; it allocates). Get() from
// the sender thread (no lock: a slot is written once, before the count
// that covers it is published with a release store, and Get() acquires the
// count). Slots are never rewritten or freed before the table is.
#ifndef TOKENMETER_CLIENT_LIB_SRC_VALUE_TABLE_H_
#define TOKENMETER_CLIENT_LIB_SRC_VALUE_TABLE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "tokenmeter/tokenmeter.h"

namespace tokenmeter::client {

class ValueTable {
 public:
  // Registers `value` (NUL-terminated, label-value syntax) and returns its
  // id, 1 .. TM_MAX_VALUE_IDS; the same string again returns the same id.
  // TM_E_INVALID: NULL or not label-value syntax. TM_E_NOMEM: the table is
  // full (TM_MAX_VALUE_IDS distinct values) or the copy could not be
  // allocated. On success, and before returning, stores the new number of
  // ids into *published (release), the count the event calls check ids
  // against; under the table's mutex, so the stores are in order.
  int Register(const char* value, std::atomic<uint32_t>* published);

  // The string of `id`, or an empty view when `id` is 0 or not (yet)
  // registered. Any thread; wait-free.
  std::string_view Get(uint32_t id) const;

 private:
  std::mutex mu_;
  std::atomic<uint32_t> count_{0};
  std::array<std::unique_ptr<const std::string>, TM_MAX_VALUE_IDS> values_;
};

}  // namespace tokenmeter::client

#endif  // TOKENMETER_CLIENT_LIB_SRC_VALUE_TABLE_H_
