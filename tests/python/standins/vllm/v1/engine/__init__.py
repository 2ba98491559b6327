"""vllm.v1.engine at v0.12: the finish reasons and the engine-core output
records the front end turns into IterationStats."""
import enum
from dataclasses import dataclass, field
from typing import Optional

FINISH_REASON_STRINGS = ("stop", "length", "abort", "error")


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self):
        return FINISH_REASON_STRINGS[self.value]


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclass
class EngineCoreEvent:
    """A request event stamped by the engine core: `timestamp` is
    time.monotonic() in the engine-core process."""
    type: EngineCoreEventType
    timestamp: float


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: Optional[FinishReason] = None
    events: Optional[list[EngineCoreEvent]] = None
    num_cached_tokens: int = 0
    num_nans_in_logits: int = 0
    stop_reason: object = None
    kv_transfer_params: Optional[dict] = field(default=None)
