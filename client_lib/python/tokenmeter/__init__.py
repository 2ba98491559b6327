"""tokenmeter: report LLM request events to tokenmeterd from Python.

A ctypes binding over libtokenmeter's C ABI (tokenmeter.h); no compiler is
needed to install it. Importing it loads the library (from
$TOKENMETER_LIBRARY, this package's folder, or the system library path) and
raises LibraryNotFoundError, an ImportError, naming all three when none has
it:

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
    meter.close()

docs/user-guide.md ("Python integration") has the whole story.
"""
import time

from ._lib import ENV_VAR, LibraryNotFoundError, lib as _lib
from .client import (DROPPED, INVALID, MAX_CACHE_CONFIG, MAX_LORA_BYTES,
                     MAX_MOE_EXPERTS, MAX_MOE_LAYERS,
                     MAX_REQUEST_LABEL_VALUE_BYTES, MAX_REQUEST_LABELS,
                     MAX_RID_BYTES, OK, PROFILES, Client, FinishReason, Stats)

__all__ = ["Client", "FinishReason", "Stats", "LibraryNotFoundError",
           "OK", "INVALID", "DROPPED", "MAX_RID_BYTES", "MAX_CACHE_CONFIG",
           "MAX_LORA_BYTES", "MAX_REQUEST_LABELS",
           "MAX_REQUEST_LABEL_VALUE_BYTES", "MAX_MOE_LAYERS",
           "MAX_MOE_EXPERTS", "PROFILES", "ENV_VAR", "now_ns",
           "library_path", "library_version"]

# The library's path, as loaded.
library_path = _lib.path

# CLOCK_MONOTONIC nanoseconds: the clock of every event (on Linux,
# time.monotonic_ns() reads CLOCK_MONOTONIC, as the library does).
now_ns = time.monotonic_ns


def library_version():
    """libtokenmeter's version string, e.g. "0.1.0"."""
    return _lib.tm_version().decode()
