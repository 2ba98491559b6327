"""What both Client implementations share: the constants of tokenmeter.h,
the argument rules and their messages, and the options a Client is made
with. Internal: import them from tokenmeter.

Nothing here loads libtokenmeter: the options go through an object whose
methods are the library's setters (set_model(b"m") -> status code),
tokenmeter._native.Options in C or client._CtypesOptions over ctypes.
"""
import math
import operator
import os
import re
import sys
import time
import weakref
from array import array
from collections import namedtuple
from enum import IntEnum

ENV_VAR = "TOKENMETER_LIBRARY"


class LibraryNotFoundError(ImportError):
    """libtokenmeter could not be loaded from any of the places tried."""
    __module__ = "tokenmeter"  # where users import it from

# Status codes of tokenmeter.h that event methods return.
OK = 0
INVALID = -1  # only after close(): the call did nothing
DROPPED = -2  # buffer full or no thread slot; counted in stats()
# TM_E_NOMEM: register_value() when MAX_VALUE_IDS values are registered
# (or a copy could not be allocated); other calls raise MemoryError.
NOMEM = -3
_NOMEM = NOMEM

MAX_RID_BYTES = 128      # TM_MAX_RID_BYTES
MAX_LABELS = 8           # TM_MAX_HELLO_LABELS
MAX_STRING_BYTES = 256   # TM_MAX_STRING_BYTES
MAX_SPEC_POSITIONS = 64  # TM_MAX_SPEC_POSITIONS
MAX_CACHE_CONFIG = 32    # TM_MAX_CACHE_CONFIG
_MIN_REPLAY_BYTES = 512 * 1024  # TM_MIN_REPLAY_BYTES
_MAX_REPLAY_BYTES = 1 << 30     # TM_MAX_REPLAY_BYTES
MAX_LORA_BYTES = 128     # TM_MAX_LORA_BYTES
MAX_REQUEST_LABELS = 4   # TM_MAX_REQUEST_LABELS
MAX_REQUEST_LABEL_VALUE_BYTES = 128  # TM_MAX_REQUEST_LABEL_VALUE_BYTES
MAX_MOE_LAYERS = 4096    # TM_MAX_MOE_LAYERS: expert_load() layer < this
MAX_MOE_EXPERTS = 1024   # TM_MAX_MOE_EXPERTS: counts per expert_load()
# Protocol 1.2.
MIN_PRIORITY = -(1 << 31)    # TM_MIN_PRIORITY: arrived() priority
MAX_PRIORITY = (1 << 31) - 1  # TM_MAX_PRIORITY
MAX_LABEL_VALUE_BYTES = 64   # TM_MAX_LABEL_VALUE_BYTES: reasons, connectors
MAX_VALUE_IDS = 255          # TM_MAX_VALUE_IDS: register_value() ids 1 .. this
MAX_TRACESTATE_BYTES = 256   # TM_MAX_TRACESTATE_BYTES
MAX_KV_TRANSFER_BYTES = (1 << 48) - 1  # TM_MAX_KV_TRANSFER_BYTES
KV_ROLES = ("send", "recv")  # tm_kv_role: TM_KV_SEND, TM_KV_RECV
# sleep_state() values, each in its tm_*_state order (0, 1, ...).
SCHEDULER_STATES = ("running", "paused")
WEIGHTS_STATES = ("resident", "offloaded", "discarded")
KV_CACHE_STATES = ("resident", "released")
PROFILES = ("vllm", "sglang", "lmdeploy")  # TM_PROFILE_*
MAX_DURATION_NS = (1 << 48) - 1  # TM_MAX_DURATION_NS: 1.3 durations
MAX_LATENCIES = 1024             # TM_MAX_LATENCIES: values per LATENCIES
_MAX_BATCH = 65536       # TM_MAX_BATCH_EVENTS: longer batches are split
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_STEP_INT_MAX = _U32  # TM_MAX_EVENT_COUNT: one event's counts fit 32 bits

assert array("Q").itemsize == 8 and array("I").itemsize == 4

class FinishReason(IntEnum):
    """tm_finish_reason. finished() also takes the strings "stop",
    "length", "abort", "error"."""
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3


_REASONS = {"stop": 0, "length": 1, "abort": 2, "error": 3}
_REASONS.update({r: int(r) for r in FinishReason})

Stats = namedtuple("Stats", [
    "events_sent",       # events written to the socket
    "events_dropped",    # buffer full, no thread slot, or unsent at close
    "events_rejected",   # invalid arguments that reached the library
    "reconnects",        # connections made after the first one
    "batches_sent",      # BATCH frames written
    "bytes_sent",        # bytes written, all frames
    "connected",         # 1 while connected, else 0
    "connect_failures",  # connection attempts that failed
    "batches_replayed",  # BATCH frames written again after a reconnect (ack)
    "events_unacked",    # written but not acked when close gave up (ack)
    "events_discarded",  # kept for replay, discarded: the daemon did not
                         # answer HELLO's ack (ack; not dropped)
    "fields_dropped",    # trace strings arrived() left out as malformed
])
Stats.__doc__ = "Counters of tm_client_stats(), in tm_stat order."

# STEP keys, in tm_step_key order.
_STEP_KEYS = ("running", "waiting", "kv_usage", "prompt_tokens",
              "generation_tokens", "prefix_queries", "prefix_hits",
              "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
              "waiting_deferred")
_WAITING = 1
_KV_USAGE = 2
_WAITING_DEFERRED = 10


# ---- argument checks (the slow paths; the fast paths are inline) -----------

def _rid(rid):
    """(int id, None) or (None, bytes id); raises for anything else."""
    if isinstance(rid, str):
        b = rid.encode()  # UnicodeEncodeError (a ValueError): lone surrogate
    elif isinstance(rid, (bytes, bytearray, memoryview)):
        b = bytes(rid)
    elif isinstance(rid, bool):
        raise TypeError("request id must be an int or a str, not bool")
    else:
        try:
            v = operator.index(rid)  # int subclasses, numpy integers
        except TypeError:
            raise TypeError("request id must be an int or a str, not "
                            f"{type(rid).__name__}") from None
        if not 0 <= v <= _U64:
            raise ValueError(f"integer request id {v} is outside "
                             "0 .. 2**64-1")
        return v, None
    if not 0 < len(b) <= MAX_RID_BYTES:
        raise ValueError(f"request id {rid!r} is {len(b)} bytes of UTF-8; "
                         f"it must be 1 .. {MAX_RID_BYTES}")
    return None, b


def _uint(name, v, lo, hi):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    v = operator.index(v)
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v} is outside {lo} .. {hi}")
    return v


def _index_array(typecode, values):
    """array(typecode, values) of ints (numpy integers too), None when an
    item is not an int; ValueError when one is out of range."""
    try:
        try:
            return array(typecode, values)
        except TypeError:  # not all plain ints: try __index__
            return array(typecode, map(operator.index, values))
    except TypeError:
        return None
    except OverflowError:
        what = "request ids" if typecode == "Q" else "token counts n"
        bits = 64 if typecode == "Q" else 32
        raise ValueError(f"integer {what} must be 0 .. 2**{bits}-1") \
            from None


def _t(t_ns):
    return _uint("t_ns (CLOCK_MONOTONIC ns, 0 = now)", t_ns, 0, _U64)


def _option_str(name, v, lo=0, hi=MAX_STRING_BYTES):
    """v as UTF-8 bytes of lo .. hi bytes without NUL; raises otherwise."""
    if not isinstance(v, str):
        raise TypeError(f"{name} must be a str, not {type(v).__name__}")
    if "\0" in v:
        raise ValueError(f"{name} {v!r} contains a NUL character")
    b = v.encode()  # UnicodeEncodeError (a ValueError): lone surrogate
    if len(b) > hi:
        raise ValueError(f"{name} {v!r} is {len(b)} bytes of UTF-8; the "
                         f"limit is {hi}")
    if len(b) < lo:
        raise ValueError(f"{name} must not be empty")
    return b


def _add_cache_config(o, key, value):
    """tm_options_add_cache_config_*() for one entry, by the value's type
    (bool before int: True is an int too)."""
    k = _option_str("cache_config key", key)
    what = f"cache_config {key!r}"
    if isinstance(value, bool):
        rc = o.add_cache_config_bool(k, int(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} = {value} is not a finite number")
        rc = o.add_cache_config_float(k, value)
    elif isinstance(value, str):
        rc = o.add_cache_config_str(
            k, _option_str(f"{what} value", value))
    elif hasattr(value, "__index__"):  # int, numpy integers
        rc = o.add_cache_config_int(
            k, _uint(what, value, _I64_MIN, _I64_MAX))
    else:
        raise TypeError(f"{what} must be a str, int, float or bool, not "
                        f"{type(value).__name__}")
    if rc != OK:
        raise ValueError(
            f"cache_config key {key!r}: at most {MAX_CACHE_CONFIG} entries, "
            "none twice; keys match [a-zA-Z_][a-zA-Z0-9_]*, do not start "
            "with __ nor are a label the daemon sets "
            "(TM_RESERVED_LABEL_NAMES in tokenmeter/protocol.h)")


def _seconds_to_ms(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a number of seconds")
    ms = round(v * 1000)
    if not lo <= ms <= hi:
        raise ValueError(f"{name} = {v} s is outside {lo / 1000} .. "
                         f"{hi / 1000} s")
    return ms




def apply_options(o, *, model, engine=None, instance=None, scope=None,
                  labels=None, socket_path=None, buffer_capacity=None,
                  flush_interval=None, close_timeout=None, max_threads=None,
                  profile=None, cache_config=None, max_lora=None,
                  ack=None, replay_bytes=None):
    """Client(**kw)'s options onto `o` (setters returning status codes);
    raises ValueError / TypeError naming the rule a value breaks."""
    def apply(setter, value, rule):
        if setter(value) != OK:
            raise ValueError(rule)

    m = _option_str("model", model)
    apply(o.set_model, m, "model must not be empty")
    if engine is not None:
        apply(o.set_engine, _option_str("engine", engine),
              f"engine {engine!r} must match [a-zA-Z_][a-zA-Z0-9_-]*")
    if instance is not None:
        apply(o.set_instance, _option_str("instance", instance), "instance")
    if scope is not None:
        apply(o.set_scope, _option_str("scope", scope), "scope")
    if socket_path is not None:
        path = os.fsencode(socket_path)
        if b"\0" in path:
            raise ValueError("socket_path contains a NUL byte")
        apply(o.set_socket_path, path,
              f"socket_path {socket_path!r} must be 1 .. 107 bytes")
    for name, value in dict(labels or {}).items():
        if o.add_label(_option_str("label name", name),
                       _option_str(f"label {name!r} value", value)) != OK:
            raise ValueError(
                f"label {name!r}: at most {MAX_LABELS} labels; names "
                "match [a-zA-Z_][a-zA-Z0-9_]*, do not start with __ "
                "nor repeat one the daemon sets "
                "(TM_RESERVED_LABEL_NAMES in tokenmeter/protocol.h), "
                "values are at most 256 bytes of UTF-8")
    if profile is not None:
        apply(o.set_profile, _option_str("profile", profile),
              f"profile {profile!r} must be one of "
              + ", ".join(repr(p) for p in PROFILES))
    if cache_config is not None:
        if not hasattr(cache_config, "items"):
            raise TypeError("cache_config must be a dict, not "
                            f"{type(cache_config).__name__}")
        for key, value in cache_config.items():
            _add_cache_config(o, key, value)
    if max_lora is not None:
        apply(o.set_max_lora, _uint("max_lora", max_lora, 0, _I64_MAX),
              "max_lora")
    if buffer_capacity is not None:
        apply(o.set_buffer_capacity,
              _uint("buffer_capacity", buffer_capacity, 1024, 16 << 20),
              "buffer_capacity must be 1024 .. 16Mi events")
    if flush_interval is not None:
        apply(o.set_flush_interval_ms,
              _seconds_to_ms("flush_interval", flush_interval, 1, 10000),
              "flush_interval")
    if close_timeout is not None:
        apply(o.set_close_timeout_ms,
              _seconds_to_ms("close_timeout", close_timeout, 0, 600000),
              "close_timeout")
    if max_threads is not None:
        apply(o.set_max_threads, _uint("max_threads", max_threads, 1, 4096),
              "max_threads must be 1 .. 4096")
    if ack is not None:
        if not isinstance(ack, bool):
            raise TypeError(f"ack must be a bool, not {type(ack).__name__}")
        apply(o.set_ack, int(ack), "ack")
    if replay_bytes is not None:
        apply(o.set_replay_bytes,
              _uint("replay_bytes", replay_bytes, _MIN_REPLAY_BYTES,
                    _MAX_REPLAY_BYTES),
              "replay_bytes must be 512 KiB .. 1 GiB")


def _uint64s_of_bytes(what, m):
    """A memoryview of bytes read as native uint64s, into an array('Q')."""
    if m.nbytes % 8 != 0:
        raise ValueError(f"{what} given as bytes: {m.nbytes} bytes is not a "
                         "whole number of uint64s")
    a = array("Q")
    a.frombytes(m.tobytes())
    return a


_INT_CODES = "bhilqnBHILQN"


def _int_format(what, m, bits):
    """The struct code of a buffer of native integers; TypeError (the C
    extension's words) for a buffer of anything else."""
    code = m.format.lstrip("@=" + ("<" if sys.byteorder == "little"
                                   else ">"))
    if m.ndim != 1 or len(code) != 1 or code not in _INT_CODES:
        kind = ("array('Q'), numpy.uint64" if bits == 64
                else "array('I'), numpy.uint32")
        raise TypeError(
            f"{what}: a buffer of format '{m.format}', itemsize {m.itemsize}, "
            f"{m.ndim} dimension(s): it must be one-dimensional with integer "
            f"items (in place when they are native {bits}-bit unsigned ints: "
            f"{kind})")
    return code


def _buffer_ints(m, code):
    """The items of a one-dimensional buffer of native integers, a list."""
    a = array({"n": "q", "N": "Q"}.get(code, code))
    a.frombytes(m.tobytes())
    return a.tolist()


def _ids_buffer(rids):
    """tokens_batch()'s ids from a buffer (bytes of native uint64s, a numpy
    array, a memoryview) as an array('Q'); None when rids is a list, a
    tuple, an array('Q') or no buffer at all. Raises ValueError / TypeError
    for a buffer that holds no whole number of uint64s or no integers."""
    if isinstance(rids, (list, tuple, str)) or (
            type(rids) is array and rids.typecode == "Q"):
        return None
    try:
        m = memoryview(rids)
    except TypeError:
        return None
    if m.ndim == 1 and m.format in ("B", "b", "c"):
        return _uint64s_of_bytes("rids", m)
    return _index_array("Q", _buffer_ints(m, _int_format("rids", m, 64)))


# ---- fork: a child has the buffers but not the sender thread ---------------

_live = weakref.WeakSet()  # the open clients, of either implementation


def _after_fork_in_child():
    for client in list(_live):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- checks shared by both implementations' event methods ------------------

def _diagnose_str_ids(rids):
    """The library refused a tokens_batch of str ids: raise saying why."""
    for i, rid in enumerate(rids):
        b = rid.encode()
        if not 0 < len(b) <= MAX_RID_BYTES:
            raise ValueError(f"request id {i} ({rid!r}) is {len(b)} bytes of "
                             f"UTF-8; it must be 1 .. {MAX_RID_BYTES}")
        if b"\0" in b:
            raise ValueError(f"request id {i} ({rid!r}) contains a NUL "
                             "character, which tokens_batch cannot carry; "
                             "use tokens()")
    return 0


def _batch_counts(n, count):
    """tokens_batch()'s n as an array('I') of `count` entries, or None for
    1 each; 0 when n is the int 0 (nothing to send)."""
    if n is None:
        return None
    if type(n) is int:
        if not 0 <= n <= _U32:
            raise ValueError(f"n = {n} is outside 0 .. {_U32}")
        if n == 0:
            return 0
        return None if n == 1 else array("I", (n,)) * count
    n_arr = n if type(n) is array and n.typecode == "I" else \
        _index_array("I", n)
    if n_arr is None:
        raise TypeError("n must be None, an int or a sequence of ints")
    if len(n_arr) != count:
        raise ValueError(f"n has {len(n_arr)} entries for {count} request "
                         "ids")
    return n_arr


def _step_figures(given, spec_accepted_per_pos):
    """step()'s figures, checked: ([(key index, value)], array('Q') of the
    accepted tokens per position)."""
    figures = []
    for key, v in enumerate(given):
        if v is None:
            continue
        if key == _KV_USAGE:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError("kv_usage must be a number 0 .. 1")
            if not 0.0 <= v <= 1.0:  # NaN fails too
                raise ValueError(f"kv_usage = {v} is outside 0 .. 1")
            figures.append((key, float(v)))
        else:
            figures.append((key, _uint(_STEP_KEYS[key], v, 0,
                                       _STEP_INT_MAX)))
    if given[_WAITING_DEFERRED] is not None:
        # 1.2: a part of `waiting` (the daemon drops it otherwise).
        deferred = dict(figures)[_WAITING_DEFERRED]
        waiting = dict(figures).get(_WAITING)
        if waiting is None:
            raise ValueError("waiting_deferred needs waiting in the same "
                             "step (it counts some of the waiting requests)")
        if deferred > waiting:
            raise ValueError(f"waiting_deferred = {deferred} is above "
                             f"waiting = {waiting}")
    if spec_accepted_per_pos is None:
        return figures, array("Q")
    try:
        pos = array("Q", spec_accepted_per_pos)
    except (TypeError, OverflowError):
        raise ValueError("spec_accepted_per_pos must be ints 0 .. 2**64-1") \
            from None
    if len(pos) > MAX_SPEC_POSITIONS:
        raise ValueError(f"spec_accepted_per_pos has {len(pos)} entries; at "
                         f"most {MAX_SPEC_POSITIONS}")
    if any(p > _STEP_INT_MAX for p in pos):
        raise ValueError("spec_accepted_per_pos entries must be ints "
                         "0 .. 2**32-1")
    return figures, pos


def _counts_array(counts):
    """expert_load()'s counts copied into an array('Q'), item by item (a
    buffer of bytes: as native uint64s); raises for what is not ints."""
    if isinstance(counts, (str, int)):
        raise TypeError("counts must be a sequence or buffer of ints, not "
                        f"{type(counts).__name__}")
    try:
        m = memoryview(counts)
    except TypeError:
        m = None
    if m is not None and m.ndim == 1 and m.format in ("B", "b", "c"):
        return _uint64s_of_bytes("counts", m)
    if m is not None:
        counts = _buffer_ints(m, _int_format("counts", m, 64))
    try:
        try:
            return array("Q", counts)
        except TypeError:  # numpy integers and other __index__ types
            return array("Q", map(operator.index, counts))
    except TypeError:
        raise TypeError("counts must be a sequence or buffer of ints, not "
                        f"{type(counts).__name__}") from None
    except OverflowError:
        raise ValueError("expert counts must be ints 0 .. 2**32-1") from None


def _batch_ids(rids, t_ns):
    """tokens_batch()'s first checks: (rids, count, t_ns), the ids of a
    buffer of bytes or integers as an array('Q')."""
    buf = _ids_buffer(rids)  # bytes, numpy arrays, memoryviews
    if buf is not None:
        rids = buf
    if isinstance(rids, str):
        raise TypeError("rids must be a sequence of request ids, not one str")
    try:
        count = len(rids)
    except TypeError:
        raise TypeError("rids must be a sequence of request ids, not "
                        f"{type(rids).__name__}") from None
    if type(t_ns) is not int or not 0 <= t_ns <= _U64:
        t_ns = _t(t_ns)
    return rids, count, t_ns


# ---- protocol 1.2 ------------------------------------------------------------
#
# The string rules (label-value syntax, traceparent, tracestate) are
# protocol.h's, applied by the library (as the daemon applies them): the
# binding checks types, NUL bytes and lengths, passes the rest on, and when
# the library refuses (and counts) the event, says why with the helpers
# below, which only word the message.

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_LABEL_VALUE_RULE = (f"1 .. {MAX_LABEL_VALUE_BYTES} bytes of UTF-8 without "
                     "control characters (label-value syntax, "
                     "tm_proto_valid_label_value in tokenmeter/protocol.h)")
_REFUSED = "the event was counted as rejected"


_REGISTER_VALUE_DOC = """Registers a reason or connector sent often
        (tm_register_value()): returns its id, an int 1 .. 255, to pass in
        place of the str to admission_rejected() and kv_transfer() (the same
        str gives the same id; an id is this client's, until close). value:
        a str of 1 .. 64 bytes of UTF-8 without control characters; one the
        library refuses raises ValueError (not counted as rejected: no event
        was made). Returns a status instead of an id: INVALID (-1) when
        the client is closed, NOMEM (-3) when 255 values are registered.
        Takes a lock: at start-up, not per request."""


def _label_value(what, v):
    """A reason or connector as UTF-8 bytes: a str of 1 .. 64 bytes without
    NUL (the library checks the rest); raises otherwise."""
    b = _option_str(what, v, 1, MAX_LABEL_VALUE_BYTES)
    return b


def _value_id(what, v):
    """A reason or connector given as a register_value() id: an int
    1 .. MAX_VALUE_IDS (the library checks that this client returned it);
    None when v is no int, which then must be a str."""
    if type(v) is not int:
        if isinstance(v, int) and not isinstance(v, bool):
            v = int(v)  # an int subclass (an IntEnum of ids)
        else:
            return None
    return _uint(f"{what} id", v, 1, MAX_VALUE_IDS)


def _label_value_or_id(what, v):
    """A reason or connector: (bytes, 0) for a str, (None, id) for an id;
    raises for anything else."""
    i = _value_id(what, v)
    if i is not None:
        return None, i
    if not isinstance(v, str):
        raise TypeError(f"{what} must be a str or a register_value() id, "
                        f"not {type(v).__name__}")
    return _label_value(what, v), 0


def _label_value_message(what, v):
    """Why the library refused the label-value `v` (a str that passed
    _label_value(), or an id that passed _value_id())."""
    if not isinstance(v, str):
        return (f"{what} id {v} was not returned by this client's "
                "register_value()")
    m = _CONTROL.search(v)
    if m:
        return (f"{what} {v!r} contains the control character "
                f"U+{ord(m.group()):04X}; it must be {_LABEL_VALUE_RULE}")
    return f"{what} {v!r} must be {_LABEL_VALUE_RULE}"


def _label_value_refused(what, v):
    raise ValueError(f"{_label_value_message(what, v)} ({_REFUSED})")


def _priority(v):
    return _uint("priority", v, MIN_PRIORITY, MAX_PRIORITY)


# The trace strings come from the caller's HTTP headers: the library leaves
# a malformed one out (with a malformed traceparent its tracestate, as W3C
# has a receiver ignore it), counts it in fields_dropped and sends the
# ARRIVED. A str the library cannot be handed as it is (a NUL character, a
# lone surrogate) is passed as one that breaks the rule for certain, so
# that it is counted the same way.
_NO_TRACEPARENT = ""  # 0 bytes: never a traceparent
_NO_TRACESTATE = "="  # a member without a key: never a tracestate


def _trace_str(what, v, bad):
    """traceparent / tracestate as a str the library can take: v, or `bad`
    when v holds a NUL or does not encode; TypeError for no str."""
    if not isinstance(v, str):
        raise TypeError(f"{what} must be a str, not {type(v).__name__}")
    if "\0" in v:
        return bad
    try:
        v.encode()
    except UnicodeEncodeError:
        return bad
    return v


def _traceparent(v):
    return _trace_str("traceparent", v, _NO_TRACEPARENT)


def _tracestate(v):
    return _trace_str("tracestate", v, _NO_TRACESTATE)


def _arrived_refused(labels):
    """The library refused an arrived() whose params the binding checked
    (types, lengths, NUL bytes): raise naming the rule of protocol.h that
    the request labels broke (malformed trace strings are left out, not
    refused)."""
    raise ValueError(
        f"request labels {list(labels or ())!r}: names match "
        "[a-zA-Z_][a-zA-Z0-9_]*, do not start with __ nor are a label the "
        "daemon sets (TM_RESERVED_LABEL_NAMES in tokenmeter/protocol.h) "
        f"({_REFUSED})")


def _scheduled_info(cached_tokens, external_tokens):
    """scheduled()'s info: None, or (cached, external) checked."""
    if cached_tokens is None and external_tokens is None:
        return None
    if cached_tokens is None or external_tokens is None:
        raise TypeError("scheduled() takes cached_tokens and external_tokens "
                        "together (both or neither)")
    return (_uint("cached_tokens", cached_tokens, 0, _U32),
            _uint("external_tokens", external_tokens, 0, _U32))


def _kv_role(role):
    if type(role) is str or isinstance(role, str):
        if role in KV_ROLES:
            return KV_ROLES.index(role)
        raise ValueError(f"role {role!r} is not one of 'send', 'recv'")
    raise TypeError(f"role must be 'send' or 'recv', not "
                    f"{type(role).__name__}")


def _kv_amount(what, v):
    """bytes / blocks: None (not sent) or an int 0 .. 2**48-1."""
    if v is None:
        return None
    return _uint(what, v, 0, MAX_KV_TRANSFER_BYTES)


def _kv_transfer_args(role, start_ns, t_ns, nbytes, blocks, ok, reason,
                      connector):
    """kv_transfer()'s arguments checked and converted: (role index,
    start_ns, t_ns, bytes or None, blocks or None, ok, reason and
    connector each as (bytes or None, id or 0))."""
    r = _kv_role(role)
    start = _uint("start_ns (CLOCK_MONOTONIC ns)", start_ns, 0, _U64)
    t = _t(t_ns)
    if t != 0 and start > t:
        raise ValueError(f"start_ns = {start} is after the event time "
                         f"t_ns = {t}: a transfer ends after it began")
    if not isinstance(ok, bool):
        raise TypeError(f"ok must be a bool, not {type(ok).__name__}")
    return (r, start, t, _kv_amount("bytes", nbytes),
            _kv_amount("blocks", blocks), ok,
            (None, 0) if reason is None
            else _label_value_or_id("reason", reason),
            (None, 0) if connector is None
            else _label_value_or_id("connector", connector))


def _kv_transfer_refused(start_ns, t_ns, reason, connector):
    """The library refused a kv_transfer() the binding checked: with t_ns
    0 the start was after now, else a string broke label-value syntax."""
    if t_ns == 0 and start_ns > time.monotonic_ns():
        raise ValueError(f"start_ns = {start_ns} is after now (t_ns = 0): a "
                         f"transfer ends after it began ({_REFUSED})")
    for what, v in (("reason", reason), ("connector", connector)):
        if isinstance(v, str) and _CONTROL.search(v):
            _label_value_refused(what, v)
    ids = [f"{what} id {v}" for what, v in (("reason", reason),
                                            ("connector", connector))
           if v is not None and not isinstance(v, str)]
    if ids:
        raise ValueError(f"kv_transfer refused: start_ns must be at most "
                         f"the event time, and {' and '.join(ids)} must be "
                         f"returned by this client's register_value() "
                         f"({_REFUSED})")
    raise ValueError(f"kv_transfer refused: start_ns must be at most the "
                     f"event time, reason and connector {_LABEL_VALUE_RULE} "
                     f"({_REFUSED})")


def _sleep_part(what, v, values):
    """A sleep_state() part: None (keep, -1) or its value's index."""
    if v is None:
        return -1
    if isinstance(v, str):
        if v in values:
            return values.index(v)
        raise ValueError(f"{what} {v!r} is not one of "
                         + ", ".join(repr(x) for x in values))
    raise TypeError(f"{what} must be None or a str, not {type(v).__name__}")


def _sleep_state_args(scheduler, weights, kv_cache):
    return (_sleep_part("scheduler", scheduler, SCHEDULER_STATES),
            _sleep_part("weights", weights, WEIGHTS_STATES),
            _sleep_part("kv_cache", kv_cache, KV_CACHE_STATES))


# ---- protocol 1.3 ------------------------------------------------------------

# request_summary()'s optional fields, in the order of tm_request_summary_info
# (and of the C extension's keyword table): four counts, seven durations.
_SUMMARY_COUNTS = ("cached_tokens", "max_tokens", "n",
                   "max_generation_tokens")
_SUMMARY_DURATIONS = ("ttft_ns", "queue_ns", "prefill_ns", "decode_ns",
                      "inference_ns", "e2e_ns", "tpot_ns")
_SUMMARY_FIELDS = _SUMMARY_COUNTS + _SUMMARY_DURATIONS
_LATENCY_COUNTS = ("prompt_tokens", "generation_tokens", "preemptions")


def _finish_reason(reason):
    """A finish reason ("stop", "length", "abort", "error" or a
    FinishReason) as its tm_finish_reason value; ValueError otherwise."""
    try:
        r = None if isinstance(reason, bool) else _REASONS.get(reason)
    except TypeError:  # unhashable
        r = None
    if r is None:
        raise ValueError(f"finish reason {reason!r} is not one of "
                         "'stop', 'length', 'abort', 'error'")
    return r


def _request_summary_args(reason, prompt_tokens, generation_tokens, fields):
    """request_summary()'s arguments checked: (reason value, prompt_tokens,
    generation_tokens, the optional fields in _SUMMARY_FIELDS order, each
    None (not given) or its int)."""
    r = _finish_reason(reason)
    prompt = _uint("prompt_tokens", prompt_tokens, 0, _U32)
    generation = _uint("generation_tokens", generation_tokens, 0, _U32)
    out = []
    for name, v in zip(_SUMMARY_FIELDS, fields):
        if v is not None:
            v = _uint(name, v, 0, _U32 if name in _SUMMARY_COUNTS
                      else MAX_DURATION_NS)
        out.append(v)
    if out[0] is not None and out[0] > prompt:
        raise ValueError(f"cached_tokens = {out[0]} is above prompt_tokens = "
                         f"{prompt}: the cached tokens are part of the prompt")
    return r, prompt, generation, out


def _latency_values(what, values):
    """latencies()'s ttft_ns / itl_ns as an array('Q'): a sequence or a
    one-dimensional buffer of ints 0 .. 2**48-1 (nanoseconds)."""
    if isinstance(values, (str, bytes, int, float)):
        raise TypeError(f"{what} must be a sequence of ints (ns), not "
                        f"{type(values).__name__}")
    try:
        m = memoryview(values)
    except TypeError:
        m = None
    if m is not None:
        values = _buffer_ints(m, _int_format(what, m, 64))
    elif type(values) in (list, tuple):
        # The common case in one C pass: ints 0 .. 2**64-1, then the bound.
        try:
            out = array("Q", values)
        except (TypeError, OverflowError):
            pass  # item by item below, naming the bad one
        else:
            if not out or max(out) <= MAX_DURATION_NS:
                return out
    out = array("Q")
    for v in values:
        out.append(_uint(f"{what} value", v, 0, MAX_DURATION_NS))
    return out


def _latency_counts(prompt_tokens, generation_tokens, preemptions):
    """latencies()'s counts: each None (not sent) or an int 0 .. 2**32-1."""
    return tuple(None if v is None else _uint(name, v, 0, _U32)
                 for name, v in zip(_LATENCY_COUNTS,
                                    (prompt_tokens, generation_tokens,
                                     preemptions)))


def _latency_args(ttft_ns, itl_ns, t_ns, prompt_tokens, generation_tokens,
                  preemptions):
    """latencies()'s arguments checked, as the events to send: (ttft
    array('Q'), itl array('Q'), t_ns, {count name: value given}) each, at
    most MAX_LATENCIES values together, the times to first token first;
    the counts on the first event only."""
    ttft = _latency_values("ttft_ns", ttft_ns)
    itl = _latency_values("itl_ns", itl_ns)
    t = _t(t_ns)
    counts = {k: v for k, v in zip(_LATENCY_COUNTS, _latency_counts(
        prompt_tokens, generation_tokens, preemptions)) if v is not None}
    events = []
    i = j = 0
    while True:
        a = ttft[i:i + MAX_LATENCIES]
        b = itl[j:j + MAX_LATENCIES - len(a)]
        events.append((a, b, t, counts if not events else {}))
        i += len(a)
        j += len(b)
        if i >= len(ttft) and j >= len(itl):
            return events
