#include "daemon/ingest/event.h"

namespace tokenmeter::daemon {

std::string_view EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kArrived:
      return "arrived";
    case EventKind::kQueued:
      return "queued";
    case EventKind::kScheduled:
      return "scheduled";
    case EventKind::kTokens:
      return "tokens";
    case EventKind::kFinished:
      return "finished";
    case EventKind::kPreempted:
      return "preempted";
    case EventKind::kStep:
      return "step";
    case EventKind::kExpertLoad:
      return "expert_load";
    case EventKind::kAdmissionRejected:
      return "admission_rejected";
    case EventKind::kKvTransfer:
      return "kv_transfer";
    case EventKind::kSleep:
      return "sleep";
    case EventKind::kRequestSummary:
      return "request_summary";
    case EventKind::kLatencies:
      return "latencies";
  }
  return "unknown";
}

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

std::string_view IngestErrorName(IngestError e) {
  switch (e) {
    case IngestError::kInvalidMsgpack:
      return "invalid_msgpack";
    case IngestError::kBadFrame:
      return "bad_frame";
    case IngestError::kFrameTooLarge:
      return "frame_too_large";
    case IngestError::kStringTooLong:
      return "string_too_long";
    case IngestError::kBatchTooLarge:
      return "batch_too_large";
    case IngestError::kTooDeep:
      return "too_deep";
    case IngestError::kBatchBeforeHello:
      return "batch_before_hello";
    case IngestError::kSecondHello:
      return "second_hello";
    case IngestError::kBadHello:
      return "bad_hello";
    case IngestError::kBadName:
      return "bad_name";
    case IngestError::kReservedLabel:
      return "reserved_label";
    case IngestError::kTooManyLabels:
      return "too_many_labels";
    case IngestError::kPeerNotAllowed:
      return "peer_not_allowed";
    case IngestError::kSeriesLimit:
      return "series_limit";
    case IngestError::kConnectionLimit:
      return "connection_limit";
    case IngestError::kUidConnectionLimit:
      return "uid_connection_limit";
    case IngestError::kHelloTimeout:
      return "hello_timeout";
    case IngestError::kFdLimit:
      return "fd_limit";
    case IngestError::kBadEvent:
      return "bad_event";
    case IngestError::kBadTimestamp:
      return "bad_timestamp";
    case IngestError::kBadReason:
      return "bad_reason";
    case IngestError::kBadField:
      return "bad_field";
    case IngestError::kUnknownKind:
      return "unknown_kind";
    case IngestError::kCount:
      break;
  }
  return "unknown";
}

}  // namespace tokenmeter::daemon
