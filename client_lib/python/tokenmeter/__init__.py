"""tokenmeter: report LLM request events to tokenmeterd from Python.

Two implementations of one API, chosen at import:

* "native": the CPython extension tokenmeter._native, with libtokenmeter
  linked into it (what `pip install` and a build with python3-dev give):
  each event call is one C call, about 100 ns.
* "ctypes": a pure-Python binding over a libtokenmeter.so found at run
  time (from $TOKENMETER_LIBRARY, this package's folder, or the system
  library path), for a build without Python headers or to load a
  particular library build; an event call costs about 1 us.

The native one is used when it is there, unless $TOKENMETER_LIBRARY names a
library (then ctypes loads that one) or $TOKENMETER_BACKEND says "ctypes"
or "native" (then only that one is tried). tokenmeter.backend says which.
When neither loads, import raises an ImportError (LibraryNotFoundError for
ctypes, naming every place tried):

    try:
        import tokenmeter
    except ImportError:
        tokenmeter = None          # run without metrics

    meter = tokenmeter.Client(engine="vllm", model="llama-3-8b",
                              instance="dp0", scope="server-1")
    meter.arrived("req-1", prompt_tokens=812, max_tokens=256)
    meter.scheduled("req-1")
    meter.tokens_batch(["req-1", "req-2"])    # once per engine step
    meter.finished("req-1", "stop")
    meter.step(running=2, waiting=0, kv_usage=0.31)
    meter.expert_load(0, [512, 3, 77, 1])  # MoE layer 0, protocol 1.1
    # Protocol 1.2:
    meter.arrived("req-3", 40, priority=-1, traceparent=(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
    meter.scheduled("req-3", cached_tokens=32, external_tokens=0)
    meter.admission_rejected("queue_full", rid="req-4")
    meter.kv_transfer("req-3", "send", tokenmeter.now_ns() - 2_000_000,
                      bytes=1 << 20, connector="nixl")
    meter.sleep_state(scheduler="paused", weights="offloaded")
    # Protocol 1.3, for engines that hand over only computed figures:
    meter.request_summary("stop", prompt_tokens=812, generation_tokens=256,
                          ttft_ns=41_000_000, e2e_ns=2_300_000_000)
    meter.latencies(ttft_ns=[41_000_000], itl_ns=[9_000_000, 8_500_000],
                    prompt_tokens=812, generation_tokens=3)
    meter.close()

docs/user-guide.md ("Python integration") has the whole story.
"""
import os
import time

from ._common import (DROPPED, ENV_VAR, INVALID, KV_CACHE_STATES, KV_ROLES,
                      MAX_CACHE_CONFIG, MAX_DURATION_NS, MAX_KV_TRANSFER_BYTES,
                      MAX_LATENCIES,
                      MAX_LABEL_VALUE_BYTES, MAX_LORA_BYTES, MAX_MOE_EXPERTS,
                      MAX_MOE_LAYERS, MAX_PRIORITY,
                      MAX_REQUEST_LABEL_VALUE_BYTES, MAX_REQUEST_LABELS,
                      MAX_RID_BYTES, MAX_TRACESTATE_BYTES, MAX_VALUE_IDS,
                      MIN_PRIORITY, NOMEM, OK,
                      PROFILES, SCHEDULER_STATES, WEIGHTS_STATES,
                      FinishReason, LibraryNotFoundError, Stats)

BACKEND_VAR = "TOKENMETER_BACKEND"


def _choose():
    wanted = os.environ.get(BACKEND_VAR, "")
    if wanted not in ("", "native", "ctypes"):
        raise ImportError(f"${BACKEND_VAR}={wanted!r}: it must be 'native' "
                          "or 'ctypes' (or unset)")
    if wanted == "" and os.environ.get(ENV_VAR):
        wanted = "ctypes"  # a library named by path: load that one
    if wanted in ("", "native"):
        try:
            from . import _native  # noqa: F401
            return "native"
        except ImportError:
            if wanted == "native":
                raise
    return "ctypes"


backend = _choose()
"""Which implementation this import uses: "native" or "ctypes"."""

if backend == "native":
    from . import _native as _impl
    from ._native_client import Client

    # The extension, which holds the library (linked in statically).
    library_path = _impl.__file__

    def library_version():
        """libtokenmeter's version string, e.g. "0.1.0"."""
        return _impl.version()
else:
    from ._lib import lib as _lib
    from .client import Client

    # The library's path, as loaded.
    library_path = _lib.path

    def library_version():
        """libtokenmeter's version string, e.g. "0.1.0"."""
        return _lib.tm_version().decode()

__all__ = ["Client", "FinishReason", "Stats", "LibraryNotFoundError",
           "OK", "INVALID", "DROPPED", "NOMEM", "MAX_RID_BYTES", "MAX_CACHE_CONFIG",
           "MAX_LORA_BYTES", "MAX_REQUEST_LABELS",
           "MAX_REQUEST_LABEL_VALUE_BYTES", "MAX_MOE_LAYERS",
           "MAX_MOE_EXPERTS", "MIN_PRIORITY", "MAX_PRIORITY",
           "MAX_LABEL_VALUE_BYTES", "MAX_VALUE_IDS", "MAX_TRACESTATE_BYTES",
           "MAX_KV_TRANSFER_BYTES", "MAX_DURATION_NS", "MAX_LATENCIES",
           "KV_ROLES", "SCHEDULER_STATES",
           "WEIGHTS_STATES", "KV_CACHE_STATES", "PROFILES", "ENV_VAR",
           "BACKEND_VAR", "backend", "now_ns", "library_path",
           "library_version"]

# CLOCK_MONOTONIC nanoseconds: the clock of every event (on Linux,
# time.monotonic_ns() reads CLOCK_MONOTONIC, as the library does).
now_ns = time.monotonic_ns
