// Checks of decoded frames against docs/protocol.md (ingest protocol v1),
// written from the document, not from the client library's encoder.
#ifndef TOKENMETER_TESTS_CLIENT_LIB_PROTOCOL_CHECKS_H_
#define TOKENMETER_TESTS_CLIENT_LIB_PROTOCOL_CHECKS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "msgpack_value.h"
#include "test_server.h"

namespace tokenmeter::testing {

// [0, meta]: proto 1, engine matching [a-zA-Z_][a-zA-Z0-9_-]*, non-empty
// model, optional instance / scope / labels (at most 8, valid names) / pid,
// and the 1.1 keys profile (vllm, sglang, lmdeploy), cache_config (at most
// 32, valid names, str/int/float64/bool values), max_lora (int >= 0),
// session (uint), ack (bool, with a session); string keys, no key twice,
// nothing else.
::testing::AssertionResult IsValidHello(const Value& frame);

// One event, exactly as the v1 client must send it: the kind's layout with
// no extra elements, an integer or 1..128-byte string request id, and the
// kind's argument rules (TOKENS n >= 1, FINISHED reason, ARRIVED params
// present only when given: max_tokens, n, and the 1.1 lora (1..128 bytes)
// and labels (at most 4, valid names, values at most 128 bytes), the 1.2
// priority (int32), traceparent (W3C, version 00) and tracestate (at most
// 256 bytes); STEP keys and types, waiting_deferred at most waiting; the
// 1.2 SCHEDULED info, ADMISSION_REJECTED, KV_TRANSFER and SLEEP layouts).
::testing::AssertionResult IsValidEvent(const Value& event);

// A whole connection: no undecodable or trailing bytes, HELLO first and
// only once, non-empty BATCHes numbered 0, 1, 2, ... (with `ack`: n, n+1,
// ..., the session's seq going on across connections) with valid events and
// a non-decreasing dropped_total, GOODBYE [2] (if any) last.
::testing::AssertionResult IsWellFormed(const Connection& c);

// Every event of every BATCH on the connection, in order.
std::vector<Value> EventsOf(const Connection& c);
// Every event of every connection, connection by connection.
std::vector<Value> EventsOf(const std::vector<Connection>& conns);
size_t CountEvents(const std::vector<Connection>& conns);

// The BATCH frames of the connection.
std::vector<const Frame*> BatchesOf(const Connection& c);

}  // namespace tokenmeter::testing

#endif  // TOKENMETER_TESTS_CLIENT_LIB_PROTOCOL_CHECKS_H_
