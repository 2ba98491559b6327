#include "msgpack_value.h"

#include <msgpack.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace tokenmeter::testing {
namespace {

Value FromObject(const msgpack_object& o) {
  Value v;
  switch (o.type) {
    case MSGPACK_OBJECT_NIL:
      v.type = Value::Type::kNil;
      break;
    case MSGPACK_OBJECT_BOOLEAN:
      v.type = Value::Type::kBool;
      v.boolean = o.via.boolean;
      break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
      v.type = Value::Type::kUint;
      v.uint = o.via.u64;
      break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      v.type = Value::Type::kInt;
      v.sint = o.via.i64;
      break;
    case MSGPACK_OBJECT_FLOAT32:
      v.type = Value::Type::kFloat32;
      v.real = o.via.f64;
      break;
    case MSGPACK_OBJECT_FLOAT64:
      v.type = Value::Type::kFloat64;
      v.real = o.via.f64;
      break;
    case MSGPACK_OBJECT_STR:
      v.type = Value::Type::kStr;
      v.str.assign(o.via.str.ptr, o.via.str.size);
      break;
    case MSGPACK_OBJECT_BIN:
      v.type = Value::Type::kBin;
      v.str.assign(o.via.bin.ptr, o.via.bin.size);
      break;
    case MSGPACK_OBJECT_EXT:
      v.type = Value::Type::kExt;
      v.str.assign(o.via.ext.ptr, o.via.ext.size);
      break;
    case MSGPACK_OBJECT_ARRAY:
      v.type = Value::Type::kArray;
      for (uint32_t i = 0; i < o.via.array.size; ++i) {
        v.array.push_back(FromObject(o.via.array.ptr[i]));
      }
      break;
    case MSGPACK_OBJECT_MAP:
      v.type = Value::Type::kMap;
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        v.map.emplace_back(FromObject(o.via.map.ptr[i].key),
                           FromObject(o.via.map.ptr[i].val));
      }
      break;
  }
  return v;
}

void AppendQuoted(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(char(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out->append(buf);
    } else {
      out->push_back(char(c));
    }
  }
  out->push_back('"');
}

void AppendText(const Value& v, std::string* out) {
  char buf[64];
  switch (v.type) {
    case Value::Type::kNil:
      out->append("nil");
      return;
    case Value::Type::kBool:
      out->append(v.boolean ? "true" : "false");
      return;
    case Value::Type::kUint:
      std::snprintf(buf, sizeof buf, "%" PRIu64, v.uint);
      out->append(buf);
      return;
    case Value::Type::kInt:
      std::snprintf(buf, sizeof buf, "%" PRId64, v.sint);
      out->append(buf);
      return;
    case Value::Type::kFloat32:
    case Value::Type::kFloat64: {
      std::snprintf(buf, sizeof buf, "%.17g", v.real);
      std::string s(buf);
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      out->append(s);
      return;
    }
    case Value::Type::kStr:
      AppendQuoted(v.str, out);
      return;
    case Value::Type::kBin:
      out->append("bin");
      AppendQuoted(v.str, out);
      return;
    case Value::Type::kExt:
      out->append("ext");
      AppendQuoted(v.str, out);
      return;
    case Value::Type::kArray:
      out->push_back('[');
      for (size_t i = 0; i < v.array.size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendText(v.array[i], out);
      }
      out->push_back(']');
      return;
    case Value::Type::kMap:
      out->push_back('{');
      for (size_t i = 0; i < v.map.size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendText(v.map[i].first, out);
        out->push_back(':');
        AppendText(v.map[i].second, out);
      }
      out->push_back('}');
      return;
  }
}

}  // namespace

const Value* Value::Find(std::string_view key) const {
  if (type != Type::kMap) return nullptr;
  for (const auto& [k, v] : map) {
    if (k.IsStr() && k.str == key) return &v;
  }
  return nullptr;
}

size_t Value::CountKey(std::string_view key) const {
  size_t n = 0;
  for (const auto& entry : map) {
    if (entry.first.IsStr() && entry.first.str == key) ++n;
  }
  return n;
}

std::string Value::ToString() const {
  std::string out;
  AppendText(*this, &out);
  return out;
}

bool DecodeFrames(const std::vector<uint8_t>& bytes, size_t* offset,
                  std::vector<Frame>* out) {
  msgpack_unpacked result;
  msgpack_unpacked_init(&result);
  bool ok = true;
  while (*offset < bytes.size()) {
    size_t off = *offset;
    const msgpack_unpack_return rc = msgpack_unpack_next(
        &result, reinterpret_cast<const char*>(bytes.data()), bytes.size(),
        &off);
    if (rc == MSGPACK_UNPACK_CONTINUE) break;
    if (rc != MSGPACK_UNPACK_SUCCESS && rc != MSGPACK_UNPACK_EXTRA_BYTES) {
      ok = false;
      break;
    }
    Frame f;
    f.value = FromObject(result.data);
    f.raw.assign(bytes.begin() + std::ptrdiff_t(*offset),
                 bytes.begin() + std::ptrdiff_t(off));
    out->push_back(std::move(f));
    *offset = off;
  }
  msgpack_unpacked_destroy(&result);
  return ok;
}

std::string Hex(const std::vector<uint8_t>& bytes) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::snprintf(buf, sizeof buf, i == 0 ? "%02x" : " %02x", bytes[i]);
    s += buf;
  }
  return s;
}

}  // namespace tokenmeter::testing
