"""lmdeploy/messages.py (v0.16.0): the types of the metrics path.

ResponseType's members, in their order (enum.auto() numbers them 1..13),
EventType (an IntEnum: QUEUED 1, SCHEDULED 2, PREEMPTED 3), EngineEvent
(its timestamp wall-clock, time.time(), "to maintain consistency between
csrc(std::chrono::system_clock) and python"), ScheduleMetrics,
RequestMetrics (token_timestamp: wall-clock), EngineOutput, and the fields
of PytorchEngineConfig that AsyncEngine._build_stat_loggers and the server
read (the real class has many more)."""
import enum
import time
from dataclasses import dataclass, field
from typing import Any, Optional


class ResponseType(enum.Enum):
    SUCCESS = enum.auto()
    FINISH = enum.auto()
    ENGINE_STOP_ERROR = enum.auto()
    SESSION_REPEAT = enum.auto()
    SESSION_NOT_EXIST = enum.auto()
    HANDLER_NOT_EXIST = enum.auto()
    INPUT_LENGTH_ERROR = enum.auto()
    INTERNAL_ENGINE_ERROR = enum.auto()
    CANCEL = enum.auto()
    PREFIX_CACHE_CONFLICT = enum.auto()
    NO_QUEUE = enum.auto()
    NOT_SUPPORTED = enum.auto()
    OUT_OF_MEMORY = enum.auto()


class EventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclass
class EngineEvent:
    type: EventType
    timestamp: float

    @classmethod
    def new_event(cls, event_type, timestamp=None):
        return cls(event_type, time.time() if timestamp is None else timestamp)


@dataclass
class ScheduleMetrics:
    active_seqs: int = 0
    waiting_seqs: int = 0
    cache_usage: float = 0.0
    prefix_cache_hit_rate: float = 0
    scheduler_tick: int = 0


@dataclass
class RequestMetrics:
    token_timestamp: float = 0.0
    engine_events: list = field(default_factory=list)
    spec_info: Optional[dict] = None
    cached_tokens: int = 0


@dataclass
class EngineOutput:
    status: ResponseType
    token_ids: list
    logprobs: Any = None
    logits: Any = None
    last_hidden_state: Any = None
    cache_block_ids: Any = None
    req_metrics: Optional[RequestMetrics] = None
    routed_experts: Any = None
    ce_loss: Any = None


@dataclass
class PytorchEngineConfig:
    """The fields the metrics path reads; session_len is what the real
    AsyncEngine derives from the model when it is None."""
    dp: int = 1
    dp_rank: int = 0
    tp: int = 1
    ep: int = 1
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = None
    enable_metrics: bool = True


@dataclass
class SpeculativeConfig:
    method: str = "eagle3"
    num_speculative_tokens: int = 1
