#include "protocol_checks.h"

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "tokenmeter/protocol.h"

namespace tokenmeter::testing {
namespace {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c, bool allow_dash) {
  return IsNameStart(c) || (c >= '0' && c <= '9') || (allow_dash && c == '-');
}
bool IsName(std::string_view s, bool allow_dash) {
  if (s.empty() || !IsNameStart(s[0])) return false;
  for (char c : s) {
    if (!IsNameChar(c, allow_dash)) return false;
  }
  return true;
}

// Every key a string, none twice.
bool HasUniqueStringKeys(const Value& map) {
  std::set<std::string> seen;
  for (const auto& [k, v] : map.map) {
    if (!k.IsStr() || !seen.insert(k.str).second) return false;
  }
  return true;
}

bool IsRid(const Value& v) {
  if (v.IsUint()) return true;
  return v.IsStr() && !v.str.empty() && v.str.size() <= 128;
}

AssertionResult Bad(const Value& v, const char* why) {
  return AssertionFailure() << why << ": " << v.ToString();
}

// A label name as protocol.md states the HELLO rules (names the daemon
// sets, and names starting with "__", are reserved).
bool IsLabelName(const std::string& s) {
  static const std::set<std::string> kReserved = {
      "model_name", "engine",   "engine_family", "finished_reason", "position",
      "le",         "quantile", "interval",      "reason",          "kind"};
  return IsName(s, false) && s.size() <= 256 && s.rfind("__", 0) != 0 &&
         kReserved.count(s) == 0;
}

// An int of msgpack, read as int64 (positive ones are decoded as uints).
bool IntValue(const Value& v, int64_t* out) {
  if (v.IsUint() && v.uint <= uint64_t{INT64_MAX}) {
    *out = int64_t(v.uint);
    return true;
  }
  if (v.type == Value::Type::kInt) {
    *out = v.sint;
    return true;
  }
  return false;
}

bool IsLowerHex(const std::string& s, size_t from, size_t n) {
  bool nonzero = false;
  for (size_t i = from; i < from + n; ++i) {
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    nonzero = nonzero || c != '0';
  }
  return nonzero || n == 2;  // the flags may be 00, the ids may not
}

// The W3C traceparent of version 00, as protocol-v1.md 1.2 states it.
bool IsTraceparent(const std::string& s) {
  return s.size() == 55 && s.compare(0, 3, "00-") == 0 && s[35] == '-' &&
         s[52] == '-' && IsLowerHex(s, 3, 32) && IsLowerHex(s, 36, 16) &&
         IsLowerHex(s, 53, 2);
}

// Label-value syntax (1.2): 1..64 bytes, no C0 control character nor DEL.
// (UTF-8 well-formedness and the C1 range are the library's own tests.)
bool IsLabelValue(const Value& v) {
  if (!v.IsStr() || v.str.empty() || v.str.size() > 64) return false;
  for (const char c : v.str) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

AssertionResult CheckArrivedParams(const Value& ev, const Value& params) {
  if (!params.IsMap() || params.map.empty() || !HasUniqueStringKeys(params)) {
    return Bad(ev, "ARRIVED params must be a non-empty map with unique keys");
  }
  for (const auto& [k, v] : params.map) {
    if (k.str == "max_tokens" || k.str == "n") {
      if (!v.IsUint() || v.uint == 0) {
        return Bad(ev, "ARRIVED max_tokens / n are given (non-zero) ints");
      }
    } else if (k.str == "lora") {  // 1.1
      if (!v.IsStr() || v.str.empty() || v.str.size() > 128) {
        return Bad(ev, "ARRIVED lora must be a str of 1..128 bytes");
      }
    } else if (k.str == "labels") {  // 1.1
      if (!v.IsMap() || v.map.empty() || v.map.size() > 4 ||
          !HasUniqueStringKeys(v)) {
        return Bad(ev, "ARRIVED labels: 1..4 unique string keys");
      }
      for (const auto& [name, value] : v.map) {
        if (!IsLabelName(name.str) || !value.IsStr() ||
            value.str.size() > 128) {
          return Bad(ev, "ARRIVED label name or value invalid");
        }
      }
    } else if (k.str == "priority") {  // 1.2
      int64_t prio;
      if (!IntValue(v, &prio) || prio < INT32_MIN || prio > INT32_MAX) {
        return Bad(ev, "ARRIVED priority must be an int32");
      }
    } else if (k.str == "traceparent") {  // 1.2
      if (!v.IsStr() || !IsTraceparent(v.str)) {
        return Bad(ev, "ARRIVED traceparent must be a W3C traceparent 00");
      }
    } else if (k.str == "tracestate") {  // 1.2
      if (!v.IsStr() || v.str.size() > 256) {
        return Bad(ev, "ARRIVED tracestate must be a str of 0..256 bytes");
      }
    } else {
      return Bad(ev, "unexpected ARRIVED param");
    }
  }
  return AssertionSuccess();
}

AssertionResult CheckStepStats(const Value& ev, const Value& stats) {
  static const std::set<std::string> kIntKeys = {
      "running",           "waiting",           "prompt_tokens",
      "generation_tokens", "prefix_queries",    "prefix_hits",
      "spec_drafts",       "spec_draft_tokens", "spec_accepted_tokens",
      "waiting_deferred"};
  if (!stats.IsMap() || !HasUniqueStringKeys(stats)) {
    return Bad(ev, "STEP stats must be a map with unique string keys");
  }
  for (const auto& [k, v] : stats.map) {
    if (kIntKeys.count(k.str) != 0) {
      if (!v.IsUint() || v.uint > (uint64_t{1} << 53)) {
        return Bad(ev, "STEP integer key with a non-integer value");
      }
    } else if (k.str == "kv_usage") {
      if (!v.IsFloat() || !(v.real >= 0.0 && v.real <= 1.0)) {
        return Bad(ev, "STEP kv_usage must be a float in 0..1");
      }
    } else if (k.str == "spec_accepted_per_pos") {
      if (!v.IsArray() || v.array.empty() || v.array.size() > 64) {
        return Bad(ev, "spec_accepted_per_pos must hold 1..64 entries");
      }
      for (const Value& e : v.array) {
        if (!e.IsUint()) return Bad(ev, "spec_accepted_per_pos non-integer");
      }
    } else {
      return Bad(ev, "unknown STEP key");
    }
  }
  // 1.2: waiting_deferred is part of waiting.
  if (const Value* d = stats.Find("waiting_deferred"); d != nullptr) {
    const Value* w = stats.Find("waiting");
    if (w == nullptr || d->uint > w->uint) {
      return Bad(ev, "STEP waiting_deferred without waiting or above it");
    }
  }
  return AssertionSuccess();
}

// 1.2 KV_TRANSFER info: role and start required, the rest optional.
AssertionResult CheckKvInfo(const Value& ev, uint64_t t, const Value& info) {
  if (!info.IsMap() || !HasUniqueStringKeys(info)) {
    return Bad(ev, "KV_TRANSFER info must be a map with unique string keys");
  }
  const Value* role = info.Find("role");
  if (role == nullptr || !role->IsStr() ||
      (role->str != "send" && role->str != "recv")) {
    return Bad(ev, "KV_TRANSFER role must be send or recv");
  }
  const Value* start = info.Find("start");
  if (start == nullptr || !start->IsUint() || start->uint > t) {
    return Bad(ev, "KV_TRANSFER start must be a uint <= t");
  }
  for (const auto& [k, v] : info.map) {
    if (k.str == "role" || k.str == "start") continue;
    if (k.str == "bytes" || k.str == "blocks") {
      if (!v.IsUint() || v.uint > (uint64_t{1} << 48) - 1) {
        return Bad(ev, "KV_TRANSFER bytes / blocks: uint below 2^48");
      }
    } else if (k.str == "ok") {
      if (v.type != Value::Type::kBool) return Bad(ev, "KV_TRANSFER ok: bool");
    } else if (k.str == "reason" || k.str == "connector") {
      if (!IsLabelValue(v)) {
        return Bad(ev, "KV_TRANSFER reason / connector: label-value syntax");
      }
    } else {
      return Bad(ev, "unexpected KV_TRANSFER key");
    }
  }
  return AssertionSuccess();
}

// 1.2 SLEEP state: each key optional, each with its own values.
AssertionResult CheckSleepState(const Value& ev, const Value& state) {
  if (!state.IsMap() || !HasUniqueStringKeys(state)) {
    return Bad(ev, "SLEEP state must be a map with unique string keys");
  }
  for (const auto& [k, v] : state.map) {
    const std::string& s = v.str;
    bool ok = false;
    if (k.str == "scheduler") {
      ok = s == "running" || s == "paused";
    } else if (k.str == "weights") {
      ok = s == "resident" || s == "offloaded" || s == "discarded";
    } else if (k.str == "kv_cache") {
      ok = s == "resident" || s == "released";
    }
    if (!v.IsStr() || !ok) return Bad(ev, "SLEEP key or value unknown");
  }
  return AssertionSuccess();
}

}  // namespace

AssertionResult IsValidHello(const Value& frame) {
  if (!frame.IsArray() || frame.array.size() != 2 || !frame.array[0].IsUint() ||
      frame.array[0].uint != 0) {
    return Bad(frame, "HELLO must be [0, meta]");
  }
  const Value& meta = frame.array[1];
  if (!meta.IsMap() || !HasUniqueStringKeys(meta)) {
    return Bad(frame, "HELLO meta must be a map with unique string keys");
  }
  const Value* proto = meta.Find("proto");
  if (proto == nullptr || !proto->IsUint() || proto->uint != 1) {
    return Bad(frame, "HELLO proto must be 1");
  }
  const Value* engine = meta.Find("engine");
  if (engine == nullptr || !engine->IsStr() || !IsName(engine->str, true)) {
    return Bad(frame, "HELLO engine must match [a-zA-Z_][a-zA-Z0-9_-]*");
  }
  const Value* model = meta.Find("model");
  if (model == nullptr || !model->IsStr() || model->str.empty()) {
    return Bad(frame, "HELLO model must be a non-empty string");
  }
  for (const auto& [k, v] : meta.map) {
    if (k.str == "proto" || k.str == "engine" || k.str == "model") continue;
    if (k.str == "instance" || k.str == "scope") {
      if (!v.IsStr()) return Bad(frame, "HELLO instance/scope are strings");
    } else if (k.str == "pid") {
      if (!v.IsUint()) return Bad(frame, "HELLO pid must be an integer");
    } else if (k.str == "labels") {
      if (!v.IsMap() || v.map.empty() || v.map.size() > 8 ||
          !HasUniqueStringKeys(v)) {
        return Bad(frame, "HELLO labels: 1..8 unique string keys");
      }
      for (const auto& [name, value] : v.map) {
        if (!IsLabelName(name.str) || !value.IsStr()) {
          return Bad(frame, "HELLO label name or value invalid");
        }
      }
    } else if (k.str == "profile") {  // 1.1
      if (!v.IsStr() ||
          (v.str != "vllm" && v.str != "sglang" && v.str != "lmdeploy")) {
        return Bad(frame, "HELLO profile must be vllm, sglang or lmdeploy");
      }
    } else if (k.str == "cache_config") {  // 1.1
      if (!v.IsMap() || v.map.empty() || v.map.size() > 32 ||
          !HasUniqueStringKeys(v)) {
        return Bad(frame, "HELLO cache_config: 1..32 unique string keys");
      }
      for (const auto& [key, value] : v.map) {
        const bool scalar = value.IsStr() || value.IsUint() ||
                            value.type == Value::Type::kInt ||
                            value.type == Value::Type::kFloat64 ||
                            value.type == Value::Type::kBool;
        if (!IsLabelName(key.str) || !scalar) {
          return Bad(frame, "HELLO cache_config key or value invalid");
        }
      }
    } else if (k.str == "max_lora") {  // 1.1
      if (!v.IsUint()) return Bad(frame, "HELLO max_lora must be an int >= 0");
    } else if (k.str == "session") {  // 1.1
      if (!v.IsUint()) return Bad(frame, "HELLO session must be a uint");
    } else if (k.str == "ack") {  // 1.1
      if (v.type != Value::Type::kBool) return Bad(frame, "HELLO ack: bool");
      if (meta.Find("session") == nullptr) {
        return Bad(frame, "HELLO ack needs a session");
      }
    } else {
      return Bad(frame, "unexpected HELLO key");
    }
  }
  return AssertionSuccess();
}

AssertionResult IsValidEvent(const Value& ev) {
  if (!ev.IsArray() || ev.array.size() < 3) {
    return Bad(ev, "an event is an array [kind, t, ...]");
  }
  const std::vector<Value>& a = ev.array;
  if (!a[0].IsUint()) return Bad(ev, "event kind must be an integer");
  if (!a[1].IsUint()) return Bad(ev, "event time must be a uint64");
  switch (a[0].uint) {
    case 1:  // ARRIVED [1, t, rid, prompt_tokens(, params)]
      if (a.size() != 4 && a.size() != 5) return Bad(ev, "ARRIVED size");
      if (!IsRid(a[2])) return Bad(ev, "ARRIVED rid");
      if (!a[3].IsUint()) return Bad(ev, "ARRIVED prompt_tokens");
      if (a.size() == 5) return CheckArrivedParams(ev, a[4]);
      return AssertionSuccess();
    case 2:  // QUEUED
    case 6:  // PREEMPTED
      if (a.size() != 3) return Bad(ev, "[kind, t, rid] size");
      if (!IsRid(a[2])) return Bad(ev, "rid");
      return AssertionSuccess();
    case 3:  // SCHEDULED [3, t, rid(, info)] (info: 1.2)
      if (a.size() != 3 && a.size() != 4) return Bad(ev, "SCHEDULED size");
      if (!IsRid(a[2])) return Bad(ev, "SCHEDULED rid");
      if (a.size() == 4) {
        const Value& info = a[3];
        if (!info.IsMap() || !HasUniqueStringKeys(info)) {
          return Bad(ev, "SCHEDULED info must be a map");
        }
        for (const auto& [k, v] : info.map) {
          if ((k.str != "cached_tokens" && k.str != "external_tokens") ||
              !v.IsUint() || v.uint > TM_MAX_EVENT_COUNT) {
            return Bad(ev, "SCHEDULED info key or value");
          }
        }
      }
      return AssertionSuccess();
    case 4:  // TOKENS [4, t, rid, n]
      if (a.size() != 4) return Bad(ev, "TOKENS size");
      if (!IsRid(a[2])) return Bad(ev, "TOKENS rid");
      if (!a[3].IsUint() || a[3].uint < 1) return Bad(ev, "TOKENS n >= 1");
      return AssertionSuccess();
    case 5: {  // FINISHED [5, t, rid, reason]
      if (a.size() != 4) return Bad(ev, "FINISHED size");
      if (!IsRid(a[2])) return Bad(ev, "FINISHED rid");
      const std::string& r = a[3].str;
      if (!a[3].IsStr() ||
          (r != "stop" && r != "length" && r != "abort" && r != "error")) {
        return Bad(ev, "FINISHED reason");
      }
      return AssertionSuccess();
    }
    case 7:  // STEP [7, t, stats]
      if (a.size() != 3) return Bad(ev, "STEP size");
      return CheckStepStats(ev, a[2]);
    case 8: {  // EXPERT_LOAD [8, t, layer, counts] (1.1)
      if (a.size() != 4) return Bad(ev, "EXPERT_LOAD size");
      if (!a[2].IsUint() || a[2].uint >= TM_MAX_MOE_LAYERS) {
        return Bad(ev, "EXPERT_LOAD layer");
      }
      if (!a[3].IsArray() || a[3].array.empty() ||
          a[3].array.size() > TM_MAX_MOE_EXPERTS) {
        return Bad(ev, "EXPERT_LOAD counts: 1 .. 1024 entries");
      }
      for (const Value& n : a[3].array) {
        if (!n.IsUint() || n.uint > TM_MAX_EVENT_COUNT) {
          return Bad(ev, "EXPERT_LOAD count");
        }
      }
      return AssertionSuccess();
    }
    case 9:  // ADMISSION_REJECTED [9, t, reason(, rid)] (1.2)
      if (a.size() != 3 && a.size() != 4) return Bad(ev, "ADMISSION size");
      if (!IsLabelValue(a[2])) return Bad(ev, "ADMISSION_REJECTED reason");
      if (a.size() == 4 && !IsRid(a[3])) return Bad(ev, "ADMISSION rid");
      return AssertionSuccess();
    case 10:  // KV_TRANSFER [10, t, rid, info] (1.2)
      if (a.size() != 4) return Bad(ev, "KV_TRANSFER size");
      if (!IsRid(a[2])) return Bad(ev, "KV_TRANSFER rid");
      return CheckKvInfo(ev, a[1].uint, a[3]);
    case 11:  // SLEEP [11, t, state] (1.2)
      if (a.size() != 3) return Bad(ev, "SLEEP size");
      return CheckSleepState(ev, a[2]);
    case 12: {  // REQUEST_SUMMARY [12, t, reason, summary(, rid)] (1.3)
      if (a.size() != 4 && a.size() != 5) return Bad(ev, "SUMMARY size");
      const std::string& r = a[2].str;
      if (!a[2].IsStr() ||
          (r != "stop" && r != "length" && r != "abort" && r != "error")) {
        return Bad(ev, "REQUEST_SUMMARY reason");
      }
      const Value& q = a[3];
      if (!q.IsMap() || !HasUniqueStringKeys(q)) {
        return Bad(ev, "REQUEST_SUMMARY summary must be a map");
      }
      const Value* prompt = q.Find("prompt_tokens");
      if (prompt == nullptr || q.Find("generation_tokens") == nullptr) {
        return Bad(ev, "REQUEST_SUMMARY without its token counts");
      }
      for (const auto& [k, v] : q.map) {
        const bool count = k.str == "prompt_tokens" ||
                           k.str == "generation_tokens" ||
                           k.str == "cached_tokens" || k.str == "max_tokens" ||
                           k.str == "n" || k.str == "max_generation_tokens";
        const bool duration = k.str == "ttft" || k.str == "queue" ||
                              k.str == "prefill" || k.str == "decode" ||
                              k.str == "inference" || k.str == "e2e" ||
                              k.str == "tpot";
        if ((!count && !duration) || !v.IsUint() ||
            v.uint > (count ? TM_MAX_EVENT_COUNT : TM_MAX_DURATION_NS)) {
          return Bad(ev, "REQUEST_SUMMARY key or value");
        }
        if (k.str == "cached_tokens" && v.uint > prompt->uint) {
          return Bad(ev, "REQUEST_SUMMARY cached above prompt");
        }
      }
      if (a.size() == 5 && !IsRid(a[4])) return Bad(ev, "SUMMARY rid");
      return AssertionSuccess();
    }
    case 13: {  // LATENCIES [13, t, ttft, itl(, counts)] (1.3)
      if (a.size() != 4 && a.size() != 5) return Bad(ev, "LATENCIES size");
      if (!a[2].IsArray() || !a[3].IsArray() ||
          a[2].array.size() + a[3].array.size() > TM_MAX_LATENCIES) {
        return Bad(ev, "LATENCIES lists");
      }
      for (const Value* list : {&a[2], &a[3]}) {
        for (const Value& v : list->array) {
          if (!v.IsUint() || v.uint > TM_MAX_DURATION_NS) {
            return Bad(ev, "LATENCIES value");
          }
        }
      }
      if (a.size() == 5) {
        const Value& c = a[4];
        if (!c.IsMap() || c.map.empty() || !HasUniqueStringKeys(c)) {
          return Bad(ev, "LATENCIES counts must be a non-empty map");
        }
        for (const auto& [k, v] : c.map) {
          if ((k.str != "prompt_tokens" && k.str != "generation_tokens" &&
               k.str != "preemptions") ||
              !v.IsUint() || v.uint > TM_MAX_EVENT_COUNT) {
            return Bad(ev, "LATENCIES count");
          }
        }
      }
      return AssertionSuccess();
    }
    default:
      return Bad(ev, "unknown event kind");
  }
}

AssertionResult IsWellFormed(const Connection& c) {
  if (c.decode_error) {
    return AssertionFailure()
           << "undecodable bytes at offset " << c.decoded_bytes;
  }
  if (c.eof && c.decoded_bytes != c.bytes.size()) {
    return AssertionFailure() << (c.bytes.size() - c.decoded_bytes)
                              << " trailing bytes of an incomplete frame";
  }
  // Without ack, seq counts this connection's batches from 0; in an ack
  // session it goes on from the session's earlier connections (the first
  // batch here is the oldest one not acked), one by one.
  uint64_t next_seq = 0;
  bool ack = false;
  bool first_batch = true;
  uint64_t last_dropped = 0;
  bool goodbye = false;
  for (size_t i = 0; i < c.frames.size(); ++i) {
    const Value& f = c.frames[i].value;
    if (goodbye) return Bad(f, "a frame after GOODBYE");
    if (!f.IsArray() || f.array.empty() || !f.array[0].IsUint()) {
      return Bad(f, "a frame is an array starting with its type");
    }
    const uint64_t type = f.array[0].uint;
    if (i == 0 && type != 0) return Bad(f, "the first frame must be HELLO");
    if (type == 0) {
      if (i != 0) return Bad(f, "a second HELLO");
      AssertionResult r = IsValidHello(f);
      if (!r) return r;
      const Value* a = f.array[1].Find("ack");
      ack = a != nullptr && a->boolean;
    } else if (type == 1) {
      if (f.array.size() != 4 || !f.array[1].IsUint() || !f.array[2].IsUint() ||
          !f.array[3].IsArray()) {
        return Bad(f, "BATCH must be [1, seq, dropped_total, [events]]");
      }
      if (ack && first_batch) next_seq = f.array[1].uint;
      first_batch = false;
      if (f.array[1].uint != next_seq) {
        return AssertionFailure()
               << "BATCH seq " << f.array[1].uint << ", expected " << next_seq;
      }
      ++next_seq;
      if (f.array[2].uint < last_dropped) {
        return Bad(f, "dropped_total went down");
      }
      last_dropped = f.array[2].uint;
      // Legal on the wire, but this client has no reason to send one.
      if (f.array[3].array.empty()) return Bad(f, "an empty BATCH");
      for (const Value& ev : f.array[3].array) {
        AssertionResult r = IsValidEvent(ev);
        if (!r) return r;
      }
    } else if (type == 2) {
      if (f.array.size() != 1) return Bad(f, "GOODBYE must be [2]");
      goodbye = true;
    } else {
      return Bad(f, "unknown frame type");
    }
  }
  return AssertionSuccess();
}

std::vector<Value> EventsOf(const Connection& c) {
  std::vector<Value> events;
  for (const Frame* f : BatchesOf(c)) {
    for (const Value& ev : f->value.array[3].array) events.push_back(ev);
  }
  return events;
}

std::vector<Value> EventsOf(const std::vector<Connection>& conns) {
  std::vector<Value> events;
  for (const Connection& c : conns) {
    std::vector<Value> e = EventsOf(c);
    events.insert(events.end(), e.begin(), e.end());
  }
  return events;
}

size_t CountEvents(const std::vector<Connection>& conns) {
  size_t n = 0;
  for (const Connection& c : conns) {
    for (const Frame* f : BatchesOf(c)) n += f->value.array[3].array.size();
  }
  return n;
}

std::vector<const Frame*> BatchesOf(const Connection& c) {
  std::vector<const Frame*> batches;
  for (const Frame& f : c.frames) {
    const Value& v = f.value;
    if (v.IsArray() && v.array.size() == 4 && v.array[0].IsUint() &&
        v.array[0].uint == 1 && v.array[3].IsArray()) {
      batches.push_back(&f);
    }
  }
  return batches;
}

}  // namespace tokenmeter::testing
