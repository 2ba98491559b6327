"""Finds and loads libtokenmeter and declares the C ABI (tokenmeter.h) to
ctypes. Internal: use tokenmeter.Client.

Where the library is looked for, in order:

1. the path in the environment variable TOKENMETER_LIBRARY, when it is set
   (then it is the only place tried: a wrong path is an error, not a reason
   to load some other copy);
2. this package's own folder: libtokenmeter.so, libtokenmeter.so.0, ... (a
   copy shipped beside the .py files);
3. the system library path, through the dynamic loader ("libtokenmeter.so.0":
   LD_LIBRARY_PATH, the ld.so cache, /usr/lib...), then
   ctypes.util.find_library("tokenmeter").
"""
import ctypes
import ctypes.util
import glob
import os

from ._common import ENV_VAR, LibraryNotFoundError

SONAME = "libtokenmeter.so.0"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# Functions every binding needs, checked at load so that an old library fails
# at import with a clear message rather than at the first step.
_REQUIRED = ("tm_tokens_batch", "tm_tokens_batch_str", "tm_arrived_ex",
             "tm_arrived_ex_str", "tm_options_set_profile",
             "tm_options_add_cache_config_str", "tm_options_set_max_lora",
             "tm_expert_load", "tm_options_set_ack", "tm_arrived_params",
             "tm_kv_transfer", "tm_sleep_state", "tm_register_value",
             "tm_request_summary", "tm_latencies")


def _try_load(path):
    """(CDLL, PyDLL) for path, or raises OSError / LibraryNotFoundError."""
    cdll = ctypes.CDLL(path)
    missing = [name for name in _REQUIRED if not hasattr(cdll, name)]
    if missing:
        raise OSError(f"{path} lacks {', '.join(missing)}: a libtokenmeter "
                      "older than this binding")
    # Two views of one loaded library (dlopen counts references): event
    # functions through PyDLL keep the GIL for their few nanoseconds, which
    # saves dropping and retaking it on every call; functions that block
    # (flush, close) go through CDLL, which lets other threads run meanwhile.
    return cdll, ctypes.PyDLL(path)


def _package_copies():
    names = glob.glob(os.path.join(PACKAGE_DIR, "libtokenmeter.so*"))
    # libtokenmeter.so first, then the shortest (soname) before full versions.
    return sorted(names, key=lambda p: (len(os.path.basename(p)), p))


def load():
    """Loads the library: (cdll, pydll, path). Raises LibraryNotFoundError
    naming every place tried and why each failed."""
    tried = []
    env = os.environ.get(ENV_VAR)
    if env:
        try:
            return (*_try_load(env), env)
        except OSError as e:
            tried.append(f"1. ${ENV_VAR}={env}: {e}")
            tried.append(f"2. the package folder {PACKAGE_DIR}: not tried "
                         f"(${ENV_VAR} is set)")
            tried.append("3. the system library path: not tried "
                         f"(${ENV_VAR} is set)")
            raise LibraryNotFoundError(_message(tried)) from None
    tried.append(f"1. ${ENV_VAR}: not set")

    copies = _package_copies()
    reasons = []
    for path in copies:
        try:
            return (*_try_load(path), path)
        except OSError as e:
            reasons.append(str(e))
    tried.append(f"2. the package folder {PACKAGE_DIR}: "
                 + ("; ".join(reasons) if reasons
                    else "no libtokenmeter.so* there"))

    reasons = []
    candidates = [SONAME]
    found = ctypes.util.find_library("tokenmeter")
    if found and found != SONAME:
        candidates.append(found)
    for name in candidates:
        try:
            return (*_try_load(name), name)
        except OSError as e:
            reasons.append(str(e))
    tried.append("3. the system library path (dynamic loader, then "
                 "ctypes.util.find_library): " + "; ".join(reasons))
    raise LibraryNotFoundError(_message(tried))


def _message(tried):
    return ("libtokenmeter not found. Tried:\n  " + "\n  ".join(tried)
            + "\nInstall tokenmeter (meson install puts libtokenmeter.so.0 on "
            f"the system library path), set {ENV_VAR} to the library's path, "
            "or copy the library into the package folder.")


# ---- declarations ----------------------------------------------------------

_c = ctypes
_client_p = _c.c_void_p
_u64, _u32, _int, _size = _c.c_uint64, _c.c_uint32, _c.c_int, _c.c_size_t
_i64, _double = _c.c_int64, _c.c_double
_str = _c.c_char_p
_ptr = _c.c_void_p  # arrays passed as addresses (array.buffer_info()[0])

# name: (restype, argtypes)
_SIGNATURES = {
    "tm_strerror": (_c.c_char_p, [_int]),
    "tm_version": (_c.c_char_p, []),
    "tm_now_ns": (_u64, []),
    "tm_options_new": (_c.c_void_p, []),
    "tm_options_free": (None, [_c.c_void_p]),
    "tm_options_set_socket_path": (_int, [_c.c_void_p, _str]),
    "tm_options_set_engine": (_int, [_c.c_void_p, _str]),
    "tm_options_set_model": (_int, [_c.c_void_p, _str]),
    "tm_options_set_instance": (_int, [_c.c_void_p, _str]),
    "tm_options_set_scope": (_int, [_c.c_void_p, _str]),
    "tm_options_add_label": (_int, [_c.c_void_p, _str, _str]),
    "tm_options_set_profile": (_int, [_c.c_void_p, _str]),
    "tm_options_add_cache_config_str": (_int, [_c.c_void_p, _str, _str]),
    "tm_options_add_cache_config_int": (_int, [_c.c_void_p, _str, _i64]),
    "tm_options_add_cache_config_float": (_int, [_c.c_void_p, _str,
                                                 _double]),
    "tm_options_add_cache_config_bool": (_int, [_c.c_void_p, _str, _int]),
    "tm_options_set_max_lora": (_int, [_c.c_void_p, _i64]),
    "tm_options_set_buffer_capacity": (_int, [_c.c_void_p, _size]),
    "tm_options_set_flush_interval_ms": (_int, [_c.c_void_p, _u32]),
    "tm_options_set_close_timeout_ms": (_int, [_c.c_void_p, _u32]),
    "tm_options_set_max_threads": (_int, [_c.c_void_p, _u32]),
    "tm_options_set_ack": (_int, [_c.c_void_p, _int]),
    "tm_options_set_replay_bytes": (_int, [_c.c_void_p, _size]),
    "tm_client_new": (_int, [_c.c_void_p, _c.POINTER(_c.c_void_p)]),
    "tm_client_close": (_int, [_client_p, _ptr, _size]),
    "tm_client_flush": (_int, [_client_p, _u32]),
    "tm_thread_attach": (_int, [_client_p]),
    "tm_client_stats": (_int, [_client_p, _ptr, _size]),
    "tm_arrived": (_int, [_client_p, _u64, _u64, _u32, _u32, _u32]),
    "tm_arrived_str": (_int, [_client_p, _u64, _str, _size, _u32, _u32,
                              _u32]),
    # lora: a char* or None; labels: the address of a tm_label array.
    "tm_arrived_ex": (_int, [_client_p, _u64, _u64, _u32, _u32, _u32, _str,
                             _ptr, _size]),
    "tm_arrived_ex_str": (_int, [_client_p, _u64, _str, _size, _u32, _u32,
                                 _u32, _str, _ptr, _size]),
    "tm_arrived_packed": (_int, [_client_p, _u64, _u64]),
    "tm_arrived_packed_str": (_int, [_client_p, _str, _size, _u64]),
    "tm_queued": (_int, [_client_p, _u64, _u64]),
    "tm_queued_str": (_int, [_client_p, _u64, _str, _size]),
    "tm_scheduled": (_int, [_client_p, _u64, _u64]),
    "tm_scheduled_str": (_int, [_client_p, _u64, _str, _size]),
    "tm_tokens": (_int, [_client_p, _u64, _u64, _u32]),
    "tm_tokens_str": (_int, [_client_p, _u64, _str, _size, _u32]),
    "tm_tokens_batch": (_int, [_client_p, _u64, _ptr, _ptr, _size]),
    "tm_tokens_batch_str": (_int, [_client_p, _u64, _str, _size, _ptr,
                                   _size]),
    # tm_finish_reason and tm_step_key are C enums: int-sized.
    "tm_finished": (_int, [_client_p, _u64, _u64, _int]),
    "tm_finished_str": (_int, [_client_p, _u64, _str, _size, _int]),
    "tm_preempted": (_int, [_client_p, _u64, _u64]),
    "tm_preempted_str": (_int, [_client_p, _u64, _str, _size]),
    "tm_step": (_int, [_client_p, _u64, _ptr, _ptr, _size, _ptr, _size]),
    # counts: an address, or a bytes object (passed as its char*).
    "tm_expert_load": (_int, [_client_p, _u64, _u32, _ptr, _size]),
    # Protocol 1.2. params / info: the address of a RequestParams /
    # KvTransferInfo (below).
    "tm_arrived_params": (_int, [_client_p, _u64, _u64, _u32, _ptr]),
    "tm_arrived_params_str": (_int, [_client_p, _u64, _str, _size, _u32,
                                     _ptr]),
    "tm_scheduled_ex": (_int, [_client_p, _u64, _u64, _u32, _u32]),
    "tm_scheduled_ex_str": (_int, [_client_p, _u64, _str, _size, _u32,
                                   _u32]),
    "tm_admission_rejected": (_int, [_client_p, _u64, _str]),
    "tm_admission_rejected_rid": (_int, [_client_p, _u64, _str, _u64]),
    "tm_admission_rejected_str": (_int, [_client_p, _u64, _str, _str,
                                         _size]),
    "tm_register_value": (_int, [_client_p, _str]),
    "tm_admission_rejected_id": (_int, [_client_p, _u64, _u32]),
    "tm_admission_rejected_id_rid": (_int, [_client_p, _u64, _u32, _u64]),
    "tm_admission_rejected_id_str": (_int, [_client_p, _u64, _u32, _str,
                                            _size]),
    "tm_kv_transfer": (_int, [_client_p, _u64, _u64, _ptr]),
    "tm_kv_transfer_str": (_int, [_client_p, _u64, _str, _size, _ptr]),
    # tm_scheduler_state, tm_weights_state, tm_kv_cache_state: C enums.
    "tm_sleep_state": (_int, [_client_p, _u64, _int, _int, _int]),
    # Protocol 1.3. summary / counts: the address of a RequestSummary /
    # IterationCounts (below), or None for no counts.
    "tm_request_summary": (_int, [_client_p, _u64, _ptr]),
    "tm_request_summary_rid": (_int, [_client_p, _u64, _u64, _ptr]),
    "tm_request_summary_str": (_int, [_client_p, _u64, _str, _size, _ptr]),
    "tm_latencies": (_int, [_client_p, _u64, _ptr, _size, _ptr, _size,
                            _ptr]),
}

# Called from Python hot paths and never blocking: loaded through PyDLL.
_EVENT_FUNCTIONS = frozenset({
    "tm_arrived", "tm_arrived_str", "tm_arrived_ex", "tm_arrived_ex_str",
    "tm_arrived_packed",
    "tm_arrived_packed_str", "tm_queued", "tm_queued_str",
    "tm_scheduled", "tm_scheduled_str", "tm_tokens", "tm_tokens_str",
    "tm_tokens_batch", "tm_tokens_batch_str", "tm_finished",
    "tm_finished_str", "tm_preempted", "tm_preempted_str", "tm_step",
    "tm_expert_load", "tm_arrived_params", "tm_arrived_params_str",
    "tm_scheduled_ex", "tm_scheduled_ex_str", "tm_admission_rejected",
    "tm_admission_rejected_rid", "tm_admission_rejected_str",
    "tm_admission_rejected_id", "tm_admission_rejected_id_rid",
    "tm_admission_rejected_id_str",
    "tm_kv_transfer", "tm_kv_transfer_str", "tm_sleep_state",
    # Not an event call, but under the GIL like them: a mutex only other
    # tm_register_value() calls take, and no close() between a binding's
    # read of its handle and the call (the native binding's behaviour).
    "tm_register_value",
    "tm_request_summary", "tm_request_summary_rid", "tm_request_summary_str",
    "tm_latencies", "tm_client_stats", "tm_now_ns"})


class Label(_c.Structure):
    """tm_label: one request label of tm_arrived_ex()."""
    _fields_ = [("name", _c.c_char_p), ("value", _c.c_char_p)]


class RequestParams(_c.Structure):
    """tm_request_params (protocol 1.2), for tm_arrived_params(); `size`
    set by the constructor, as TM_REQUEST_PARAMS_INIT sets it."""
    _fields_ = [("size", _size), ("max_tokens", _u32), ("n", _u32),
                ("lora", _c.c_char_p), ("labels", _ptr),
                ("n_labels", _size), ("has_priority", _int),
                ("priority", _c.c_int32), ("traceparent", _c.c_char_p),
                ("tracestate", _c.c_char_p)]

    def __init__(self, **kw):
        super().__init__(size=_c.sizeof(RequestParams), **kw)


class KvTransferInfo(_c.Structure):
    """tm_kv_transfer_info (protocol 1.2), for tm_kv_transfer(); `size`
    set by the constructor. bytes / blocks: KV_UNKNOWN when not given."""
    _fields_ = [("size", _size), ("role", _int), ("start_ns", _u64),
                ("bytes", _u64), ("blocks", _u64), ("ok", _int),
                ("reason", _c.c_char_p), ("connector", _c.c_char_p),
                ("reason_id", _u32), ("connector_id", _u32)]

    def __init__(self, **kw):
        super().__init__(size=_c.sizeof(KvTransferInfo), **kw)


KV_UNKNOWN = (1 << 64) - 1  # TM_KV_UNKNOWN
NOT_GIVEN = (1 << 64) - 1   # TM_NOT_GIVEN


class RequestSummary(_c.Structure):
    """tm_request_summary_info (protocol 1.3), for tm_request_summary(); `size`
    set by the constructor, every optional field NOT_GIVEN unless set."""
    _fields_ = [("size", _size), ("reason", _int),
                ("prompt_tokens", _u64), ("generation_tokens", _u64),
                ("cached_tokens", _u64), ("max_tokens", _u64), ("n", _u64),
                ("max_generation_tokens", _u64), ("ttft_ns", _u64),
                ("queue_ns", _u64), ("prefill_ns", _u64),
                ("decode_ns", _u64), ("inference_ns", _u64),
                ("e2e_ns", _u64), ("tpot_ns", _u64)]

    def __init__(self, **kw):
        given = {name: NOT_GIVEN for name, _ in self._fields_[4:]}
        given.update(kw)
        super().__init__(size=_c.sizeof(RequestSummary), **given)

    @classmethod
    def given(cls, reason, prompt, generation, fields):
        """One made from checked arguments: the optional fields in struct
        order, None for not given (one positional construction)."""
        q = cls.__new__(cls)
        _c.Structure.__init__(
            q, _c.sizeof(cls), reason, prompt, generation,
            *[NOT_GIVEN if v is None else v for v in fields])
        return q


class IterationCounts(_c.Structure):
    """tm_iteration_counts (protocol 1.3), for tm_latencies()."""
    _fields_ = [("size", _size), ("prompt_tokens", _u64),
                ("generation_tokens", _u64), ("preemptions", _u64)]

    def __init__(self, **kw):
        given = {name: NOT_GIVEN for name, _ in self._fields_[1:]}
        given.update(kw)
        super().__init__(size=_c.sizeof(IterationCounts), **given)


class Lib:
    """The loaded library's functions as attributes (tm_tokens, ...), each
    with argtypes and restype declared."""

    def __init__(self):
        cdll, pydll, self.path = load()
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(pydll if name in _EVENT_FUNCTIONS else cdll, name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def strerror(self, status):
        return self.tm_strerror(status).decode()


lib = Lib()
