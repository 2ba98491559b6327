// A decoded msgpack value for tests, built with msgpack-c's C API only (so
// that the client library's encoder is checked by an independent decoder).
#ifndef TOKENMETER_TESTS_CLIENT_LIB_MSGPACK_VALUE_H_
#define TOKENMETER_TESTS_CLIENT_LIB_MSGPACK_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tokenmeter::testing {

// A deep copy of one msgpack object, independent of msgpack-c's zones.
struct Value {
  enum class Type {
    kNil,
    kBool,
    kUint,  // positive integer
    kInt,   // negative integer
    kFloat32,
    kFloat64,
    kStr,
    kBin,
    kArray,
    kMap,
    kExt,
  };

  Type type = Type::kNil;
  bool boolean = false;
  uint64_t uint = 0;  // kUint
  int64_t sint = 0;   // kInt
  double real = 0;    // kFloat32, kFloat64
  std::string str;    // kStr, kBin, kExt bytes
  std::vector<Value> array;
  std::vector<std::pair<Value, Value>> map;  // wire order

  bool IsUint() const { return type == Type::kUint; }
  bool IsStr() const { return type == Type::kStr; }
  bool IsArray() const { return type == Type::kArray; }
  bool IsMap() const { return type == Type::kMap; }
  bool IsFloat() const {
    return type == Type::kFloat32 || type == Type::kFloat64;
  }

  // The value of the first entry whose key is the string `key`; nullptr
  // when the map has none (or this is not a map).
  const Value* Find(std::string_view key) const;
  // How many entries have the string key `key`.
  size_t CountKey(std::string_view key) const;

  // Compact JSON-like text for failure messages and simple comparisons:
  // integers in decimal, strings quoted, floats always with a '.', maps in
  // wire order, e.g. [5,1000,"abc","length"].
  std::string ToString() const;
};

// One top-level msgpack object from the stream and the bytes it came from.
struct Frame {
  Value value;
  std::vector<uint8_t> raw;
};

// Decodes every complete object in bytes[*offset, end) with
// msgpack_unpack_next(), appending them to `out` and advancing *offset past
// them. Returns false on a parse error (then *offset stops at the bad
// object); an incomplete object at the end is left for later.
bool DecodeFrames(const std::vector<uint8_t>& bytes, size_t* offset,
                  std::vector<Frame>* out);

// Hex dump "94 04 cf ..." for failure messages.
std::string Hex(const std::vector<uint8_t>& bytes);

}  // namespace tokenmeter::testing

#endif  // TOKENMETER_TESTS_CLIENT_LIB_MSGPACK_VALUE_H_
