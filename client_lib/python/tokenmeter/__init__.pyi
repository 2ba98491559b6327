# Type hints of the tokenmeter package (both implementations, "native" and
# "ctypes", have this API). The contract of each call: client.py.
from enum import IntEnum
from typing import (Any, Iterable, Literal, Mapping, NamedTuple, Optional,
                    Sequence, Union)

RequestId = Union[int, str, bytes]
# Buffers of integers: array('Q'/'q'/'L'/'I'/...), numpy integer arrays,
# memoryview, bytes (native uint64s), ctypes arrays.
IntBuffer = Any

OK: int
INVALID: int
DROPPED: int
MAX_RID_BYTES: int
MAX_CACHE_CONFIG: int
MAX_LORA_BYTES: int
MAX_REQUEST_LABELS: int
MAX_REQUEST_LABEL_VALUE_BYTES: int
MAX_MOE_LAYERS: int
MAX_MOE_EXPERTS: int
MIN_PRIORITY: int
MAX_PRIORITY: int
MAX_LABEL_VALUE_BYTES: int
MAX_VALUE_IDS: int
MAX_TRACESTATE_BYTES: int
MAX_KV_TRANSFER_BYTES: int
MAX_DURATION_NS: int
MAX_LATENCIES: int
KV_ROLES: tuple[str, ...]
SCHEDULER_STATES: tuple[str, ...]
WEIGHTS_STATES: tuple[str, ...]
KV_CACHE_STATES: tuple[str, ...]
PROFILES: tuple[str, ...]
ENV_VAR: str
BACKEND_VAR: str
backend: Literal["native", "ctypes"]
library_path: str


def library_version() -> str: ...
def now_ns() -> int: ...


class LibraryNotFoundError(ImportError): ...


class FinishReason(IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3


class Stats(NamedTuple):
    events_sent: int
    events_dropped: int
    events_rejected: int
    reconnects: int
    batches_sent: int
    bytes_sent: int
    connected: int
    connect_failures: int
    batches_replayed: int
    events_unacked: int
    events_discarded: int
    fields_dropped: int


class Client:
    def __init__(self, *, model: str, engine: Optional[str] = ...,
                 instance: Optional[str] = ..., scope: Optional[str] = ...,
                 labels: Optional[Mapping[str, str]] = ...,
                 socket_path: Optional[Union[str, bytes]] = ...,
                 buffer_capacity: Optional[int] = ...,
                 flush_interval: Optional[float] = ...,
                 close_timeout: Optional[float] = ...,
                 max_threads: Optional[int] = ...,
                 profile: Optional[Literal["vllm", "sglang",
                                           "lmdeploy"]] = ...,
                 cache_config: Optional[Mapping[
                     str, Union[str, int, float, bool]]] = ...,
                 max_lora: Optional[int] = ...,
                 ack: Optional[bool] = ...,
                 replay_bytes: Optional[int] = ...) -> None: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> Stats: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: object) -> None: ...
    def stats(self) -> Stats: ...
    def flush(self, timeout: float = ...) -> bool: ...
    def attach_thread(self) -> bool: ...
    def arrived(self, rid: RequestId, prompt_tokens: int,
                max_tokens: int = ..., n: int = ..., t_ns: int = ...,
                lora: Optional[str] = ...,
                labels: Optional[Mapping[str, str]] = ...,
                priority: Optional[int] = ...,
                traceparent: Optional[str] = ...,
                tracestate: Optional[str] = ...) -> int: ...
    def queued(self, rid: RequestId, t_ns: int = ...) -> int: ...
    def scheduled(self, rid: RequestId, t_ns: int = ...,
                  cached_tokens: Optional[int] = ...,
                  external_tokens: Optional[int] = ...) -> int: ...
    def tokens(self, rid: RequestId, n: int = ..., t_ns: int = ...) -> int:
        ...
    def tokens_batch(self, rids: Union[Sequence[int], Sequence[str],
                                       Iterable[int], IntBuffer],
                     n: Union[None, int, Sequence[int], IntBuffer] = ...,
                     t_ns: int = ...) -> int: ...
    def finished(self, rid: RequestId,
                 reason: Union[Literal["stop", "length", "abort", "error"],
                               FinishReason] = ...,
                 t_ns: int = ...) -> int: ...
    def preempted(self, rid: RequestId, t_ns: int = ...) -> int: ...
    def step(self, *, running: Optional[int] = ...,
             waiting: Optional[int] = ..., kv_usage: Optional[float] = ...,
             prompt_tokens: Optional[int] = ...,
             generation_tokens: Optional[int] = ...,
             prefix_queries: Optional[int] = ...,
             prefix_hits: Optional[int] = ...,
             spec_drafts: Optional[int] = ...,
             spec_draft_tokens: Optional[int] = ...,
             spec_accepted_tokens: Optional[int] = ...,
             spec_accepted_per_pos: Optional[Sequence[int]] = ...,
             t_ns: int = ...,
             waiting_deferred: Optional[int] = ...) -> int: ...
    def expert_load(self, layer: int,
                    counts: Union[Sequence[int], IntBuffer],
                    t_ns: int = ...) -> int: ...
    def register_value(self, value: str) -> int: ...
    def admission_rejected(self, reason: Union[str, int],
                           rid: Optional[RequestId] = ...,
                           t_ns: int = ...) -> int: ...
    def kv_transfer(self, rid: RequestId, role: Literal["send", "recv"],
                    start_ns: int, t_ns: int = ...,
                    bytes: Optional[int] = ..., blocks: Optional[int] = ...,
                    ok: bool = ..., reason: Optional[Union[str, int]] = ...,
                    connector: Optional[Union[str, int]] = ...) -> int: ...
    def sleep_state(self,
                    scheduler: Optional[Literal["running", "paused"]] = ...,
                    weights: Optional[Literal["resident", "offloaded",
                                              "discarded"]] = ...,
                    kv_cache: Optional[Literal["resident",
                                               "released"]] = ...,
                    t_ns: int = ...) -> int: ...
    # Protocol 1.3.
    def request_summary(self,
                        reason: Union[Literal["stop", "length", "abort",
                                              "error"], FinishReason], *,
                        prompt_tokens: int, generation_tokens: int,
                        cached_tokens: Optional[int] = ...,
                        max_tokens: Optional[int] = ...,
                        n: Optional[int] = ...,
                        ttft_ns: Optional[int] = ...,
                        queue_ns: Optional[int] = ...,
                        prefill_ns: Optional[int] = ...,
                        decode_ns: Optional[int] = ...,
                        inference_ns: Optional[int] = ...,
                        e2e_ns: Optional[int] = ...,
                        tpot_ns: Optional[int] = ...,
                        rid: Optional[RequestId] = ...,
                        t_ns: int = ...,
                        max_generation_tokens: Optional[int] = ...) -> int: ...
    def latencies(self, ttft_ns: Union[Sequence[int], IntBuffer] = ...,
                  itl_ns: Union[Sequence[int], IntBuffer] = ...,
                  t_ns: int = ..., *, prompt_tokens: Optional[int] = ...,
                  generation_tokens: Optional[int] = ...,
                  preemptions: Optional[int] = ...) -> int: ...
