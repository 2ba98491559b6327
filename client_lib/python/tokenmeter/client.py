"""tokenmeter.Client: the Python face of libtokenmeter's C ABI (tokenmeter.h).

Every event method is one ctypes call into the library, which stamps the
event and appends it to the calling thread's buffer; the library's own
thread sends it to tokenmeterd. Nothing here takes a lock or touches the
socket; the costs are ctypes' (docs/performance.md, "Python shim").
"""
import ctypes
import sys
import threading
import weakref
from array import array

from ._common import (_MAX_BATCH, _NOMEM, _REASONS, _U32, _U64, INVALID,
                      MAX_DURATION_NS, MAX_LABEL_VALUE_BYTES, MAX_LATENCIES,
                      MAX_LORA_BYTES, MAX_MOE_EXPERTS, MAX_MOE_LAYERS,
                      MAX_REQUEST_LABEL_VALUE_BYTES, MAX_REQUEST_LABELS,
                      MAX_RID_BYTES, OK, Stats, _REGISTER_VALUE_DOC,
                      _arrived_refused,
                      _batch_counts, _counts_array, _diagnose_str_ids,
                      _batch_ids, _index_array, _kv_transfer_args,
                      _kv_transfer_refused, _label_value_or_id,
                      _label_value_refused, _live, _option_str, _priority,
                      _rid, _scheduled_info, _seconds_to_ms,
                      _sleep_state_args, _step_figures, _t, _tracestate,
                      _traceparent, _uint, apply_options,
                      _finish_reason, _request_summary_args, _latency_args)
from ._lib import (KV_UNKNOWN, NOT_GIVEN, IterationCounts, KvTransferInfo,
                   Label, RequestParams, RequestSummary, lib)


# Bound once: a global lookup is cheaper than an attribute lookup per call.
_arrived, _arrived_str = lib.tm_arrived, lib.tm_arrived_str
_arrived_ex, _arrived_ex_str = lib.tm_arrived_ex, lib.tm_arrived_ex_str
_arrived_packed = lib.tm_arrived_packed
_arrived_packed_str = lib.tm_arrived_packed_str
_queued, _queued_str = lib.tm_queued, lib.tm_queued_str
_scheduled, _scheduled_str = lib.tm_scheduled, lib.tm_scheduled_str
_tokens, _tokens_str = lib.tm_tokens, lib.tm_tokens_str
_tokens_batch, _tokens_batch_str = lib.tm_tokens_batch, lib.tm_tokens_batch_str
_finished, _finished_str = lib.tm_finished, lib.tm_finished_str
_preempted, _preempted_str = lib.tm_preempted, lib.tm_preempted_str
_step = lib.tm_step
_expert_load = lib.tm_expert_load
_arrived_params = lib.tm_arrived_params
_arrived_params_str = lib.tm_arrived_params_str
_scheduled_ex, _scheduled_ex_str = lib.tm_scheduled_ex, lib.tm_scheduled_ex_str
# admission_rejected() without an id, with an integer id, with a string id.
_ADMISSION_STR = (lib.tm_admission_rejected, lib.tm_admission_rejected_rid,
                  lib.tm_admission_rejected_str)
_ADMISSION_ID = (lib.tm_admission_rejected_id,
                 lib.tm_admission_rejected_id_rid,
                 lib.tm_admission_rejected_id_str)
_kv_transfer, _kv_transfer_str = lib.tm_kv_transfer, lib.tm_kv_transfer_str
_sleep_state = lib.tm_sleep_state
_request_summary = lib.tm_request_summary
_request_summary_rid = lib.tm_request_summary_rid
_request_summary_str = lib.tm_request_summary_str
_latencies = lib.tm_latencies

# Prebuilt ctypes arguments for the fast paths (see "events" below).
_ZERO, _ONE = 0, 1
_T_NOW = ctypes.c_uint64(0)
_N_ZERO = ctypes.c_uint32(0)
_N_ONE = ctypes.c_uint32(1)
# A ready size_t for every valid string-id length: indexing a tuple costs a
# quarter of converting an int.
_RID_LEN = tuple(ctypes.c_size_t(i) for i in range(MAX_RID_BYTES + 1))
# The same with None for 0, which ctypes refuses: a lookup that also checks.
_STR_RID_LEN = (None,) + _RID_LEN[1:]
_REASON_ARGS = {name: ctypes.c_int(v) for name, v in _REASONS.items()
                if type(name) is str}
_REASON_VALUES = {name: v for name, v in _REASONS.items()
                  if type(name) is str}
# request_summary()'s optional fields' bounds, in _SUMMARY_FIELDS order.
_SUMMARY_MAX = (_U32,) * 4 + (MAX_DURATION_NS,) * 7

_StatsArray = ctypes.c_uint64 * len(Stats._fields)


class _CtypesOptions:
    """A tm_options* with the setters _common.apply_options() calls, each
    returning the library's status code."""

    def __init__(self):
        self.p = lib.tm_options_new()
        if not self.p:
            raise MemoryError("tm_options_new")

    def free(self):
        lib.tm_options_free(self.p)
        self.p = None

    def __getattr__(self, name):
        fn = getattr(lib, "tm_options_" + name)
        return lambda *args: fn(self.p, *args)


def _close_handle(handle):
    lib.tm_client_close(handle, None, 0)


class Client:
    """One connection's worth of identity and buffers: a tm_client.

    with tokenmeter.Client(engine="vllm", model="llama-3-8b",
                           instance="dp0") as meter:
        meter.arrived("req-1", prompt_tokens=812, max_tokens=256)
        meter.tokens_batch(step_request_ids)      # once per engine step
        meter.finished("req-1", "stop")

    Arguments are keyword-only. model is required; engine names the metric
    namespace (default "tokenmeter-engine"); instance is the `engine` label;
    scope joins this client's request ids with other clients' of the same
    engine, model and scope (a frontend process and an engine process);
    labels are at most 8 constant labels. Protocol 1.1 (a 1.0 daemon
    ignores them): profile ("vllm", "sglang" or "lmdeploy"; default: the
    daemon decides) names the series; cache_config is a dict of at most 32
    KV-cache settings (str, int, float or bool values, keys as label names),
    e.g. {"block_size": 16, "num_gpu_blocks": 8192}; max_lora the most LoRA
    adapters served at once. socket_path defaults to
    /run/tokenmeter/ingest.sock. buffer_capacity (events per thread),
    flush_interval and close_timeout (seconds) and max_threads tune the
    library (tokenmeter.h). ack (default True) asks the daemon for ACKs
    and replays unacked batches after a reconnect, keeping at most
    replay_bytes (default 4 MiB, 512 KiB .. 1 GiB) of them, to a daemon
    that answered HELLO's ack only (one that does not ack is never sent a
    batch twice; what was kept for it is counted in events_discarded)
    (tokenmeter.h, tm_options_set_ack()); a HELLO always carries a random
    session. Bad values raise ValueError or TypeError naming the rule; the daemon need not be running (the library connects in the
    background and keeps retrying).

    Event methods (arrived, queued, scheduled, tokens, tokens_batch,
    finished, preempted, step, expert_load, and the protocol 1.2
    admission_rejected, kv_transfer, sleep_state) may be called from any
    number of threads at once. They raise TypeError or ValueError for bad
    arguments, before anything is sent, and never for transport trouble: a
    missing daemon or a full buffer is counted in stats(). They return OK
    (0), or DROPPED (-2) when the event was dropped (counted); after close()
    they do nothing and return INVALID (-1). tokens_batch returns the
    number of events appended. Timestamps t_ns are time.monotonic_ns()
    values; 0 means now. Request ids are ints (0 .. 2**64-1) or strs
    (1 .. 128 bytes of UTF-8;
    bytes also work); a request keeps one form in all its events.
    """

    __slots__ = ("_h", "_finalizer", "_close_lock", "_final_stats",
                 "__weakref__")

    def __init__(self, **options):
        # Set first so that close() works whatever fails below.
        self._h = None
        self._finalizer = None
        self._close_lock = threading.Lock()
        self._final_stats = Stats(*([0] * len(Stats._fields)))

        opts = _CtypesOptions()
        try:
            apply_options(opts, **options)
            handle = ctypes.c_void_p()
            rc = lib.tm_client_new(opts.p, ctypes.byref(handle))
        finally:
            opts.free()
        if rc == _NOMEM:
            raise MemoryError("tm_client_new: out of memory")
        if rc != OK:
            raise OSError(f"tm_client_new: {lib.strerror(rc)} (could not "
                          "start the sender thread)")
        self._h = handle.value
        # Unclosed clients are closed (their events sent) when collected or
        # at interpreter exit.
        self._finalizer = weakref.finalize(self, _close_handle, self._h)
        _live.add(self)

    # ---- lifecycle -------------------------------------------------------

    def close(self):
        """Sends what is buffered (waiting at most close_timeout), says
        GOODBYE and frees the library's client. Returns the final Stats.
        Idempotent. Call it once the threads that report have stopped
        reporting; event calls after it do nothing."""
        with self._close_lock:
            h, self._h = self._h, None
            if h is None:
                return self._final_stats
            self._finalizer.detach()
            _live.discard(self)
            out = _StatsArray()
            lib.tm_client_close(h, ctypes.addressof(out), len(out))
            self._final_stats = Stats(*out)
            return self._final_stats

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _forget_after_fork(self):
        # The child has a copy of the buffers but no sender thread: closing
        # would wait for a thread that is not there. Leave the copy alone.
        self._h = None
        if self._finalizer is not None:
            self._finalizer.detach()

    @property
    def closed(self):
        return self._h is None

    def __repr__(self):
        state = "closed" if self._h is None else "open"
        return f"<tokenmeter.Client {state}>"

    # ---- control ---------------------------------------------------------

    def stats(self):
        """Counters as a Stats namedtuple (after close: the final ones).
        Lock-free; any thread."""
        out = _StatsArray()
        addr, n = ctypes.addressof(out), len(out)
        if lib.tm_client_stats(self._h, addr, n) != OK:  # closed meanwhile
            return self._final_stats
        return Stats(*out)

    def flush(self, timeout=1.0):
        """Waits until every event appended before the call is written to
        the socket. True when done; False when the daemon is away (at once)
        or the timeout ran out. Blocks (other threads run meanwhile): not
        for hot paths."""
        ms = _seconds_to_ms("timeout", timeout, 0, _U32)
        with self._close_lock:  # blocks with the GIL released: keep close out
            if self._h is None:
                raise ValueError("flush() on a closed tokenmeter.Client")
            return lib.tm_client_flush(self._h, ms) == OK

    def attach_thread(self):
        """Optional: allocates the calling thread's buffer now, so that its
        first event call does not. False when max_threads are reporting."""
        with self._close_lock:
            return self._h is not None and lib.tm_thread_attach(self._h) == OK

    # ---- events ----------------------------------------------------------
    #
    # Each method has a fast path for the common call (an int or str id,
    # the other arguments at their defaults or plain ints), then a checking
    # path that converts or raises. Costs here are ctypes': about 90 ns to
    # convert each int argument, 40 ns to pass a ready ctypes object; so the
    # fast paths pass prebuilt objects for default arguments (_T_NOW, ...),
    # guarded by identity with the defaults (`t_ns is _ZERO`: any other 0
    # takes the checking path and gets the same result).
    #
    # self._h is read as the last thing before the C call (no Python call in
    # between), so a close() in another thread turns later calls into
    # no-ops rather than uses of a freed client.

    def _checked(self, fn_int, fn_str, rid, t_ns, *args):
        t_ns = _t(t_ns)
        v, b = _rid(rid)
        if b is None:
            return fn_int(self._h, t_ns, v, *args)
        ln = len(b)
        return fn_str(self._h, t_ns, b, ln, *args)

    def arrived(self, rid, prompt_tokens, max_tokens=0, n=0, t_ns=0,
                lora=None, labels=None, priority=None, traceparent=None,
                tracestate=None):
        """The request entered the server (ARRIVED). max_tokens and n are
        its sampling parameters; 0 means not given. Protocol 1.1 (a 1.0
        daemon ignores them): lora, the LoRA adapter serving the request
        (a str of 1 .. 128 bytes of UTF-8; None: none); labels, a dict of at
        most 4 request labels, names as label names (as HELLO labels),
        values strs of at most 128 bytes of UTF-8 (the daemon uses those it
        enables with --request-label). Protocol 1.2 (a 1.1 daemon ignores
        them): priority, an int -2**31 .. 2**31-1 (lower runs first, as
        vLLM's priority scheduling; None: not sent); traceparent and
        tracestate, the W3C trace context headers as the frontend received
        them (strs; None: none): a traceparent of version 00 (55 bytes,
        lowercase hex, neither id all zeros), a tracestate of at most 256
        bytes and 32 members ("" is one, and is sent). The library checks
        them by protocol.h's rules, as the daemon does, and leaves a
        malformed one out (a malformed traceparent with its tracestate, as
        W3C has a receiver ignore it), counting it in
        stats().fields_dropped: the ARRIVED is sent all the same. A
        traceparent or tracestate that is no str raises TypeError."""
        # The fast path, for ints in range and a str or int id. Anything
        # else takes the checking path below, which says what is wrong: a
        # float count raises TypeError at `|` (a negative one shifts to -1),
        # a numpy int makes ctypes raise ArgumentError before the call, an
        # empty or overlong str id finds no ready length (None for 0,
        # IndexError past MAX_RID_BYTES). lora and labels take the path of
        # their own (_arrived_ex) after it.
        try:
            if (t_ns is _ZERO and n is _ZERO and lora is None
                    and labels is None and priority is None
                    and traceparent is None and tracestate is None):
                # The common form (now, no n): both counts in one argument
                # to a 3- or 4-argument entry, each argument fewer saving
                # ctypes 40 to 90 ns.
                if not (prompt_tokens | max_tokens) >> 32:
                    tokens = prompt_tokens | max_tokens << 32
                    kind = type(rid)
                    if kind is str:
                        b = rid.encode()
                        return _arrived_packed_str(
                            self._h, b, _STR_RID_LEN[len(b)], tokens)
                    if kind is int and not rid >> 64:
                        return _arrived_packed(self._h, rid, tokens)
            if t_ns is _ZERO:
                t = _T_NOW
            elif type(t_ns) is int and not t_ns >> 64:
                t = t_ns
            else:
                t = None
            if (t is not None and lora is None and labels is None
                    and priority is None and traceparent is None
                    and tracestate is None
                    and not (prompt_tokens | max_tokens | n) >> 32):
                n_arg = _N_ZERO if n is _ZERO else n
                kind = type(rid)
                if kind is str:
                    b = rid.encode()
                    ln = _STR_RID_LEN[len(b)]
                    return _arrived_str(self._h, t, b, ln, prompt_tokens,
                                        max_tokens, n_arg)
                if kind is int and not rid >> 64:
                    return _arrived(self._h, t, rid, prompt_tokens,
                                    max_tokens, n_arg)
        except (TypeError, IndexError, ctypes.ArgumentError):
            pass
        if (lora is not None or labels is not None or priority is not None
                or traceparent is not None or tracestate is not None):
            return self._arrived_params(rid, prompt_tokens, max_tokens, n,
                                        t_ns, lora, labels, priority,
                                        traceparent, tracestate)
        return self._checked(
            _arrived, _arrived_str, rid, t_ns,
            _uint("prompt_tokens", prompt_tokens, 0, _U32),
            _uint("max_tokens", max_tokens, 0, _U32), _uint("n", n, 0, _U32))

    def _arrived_params(self, rid, prompt_tokens, max_tokens, n, t_ns, lora,
                        labels, priority, traceparent, tracestate):
        """arrived() with any of the 1.1 or 1.2 params: checks them, then
        one tm_arrived_params(_str) call."""
        t_ns = _t(t_ns)
        v, b = _rid(rid)
        # prompt_tokens first, as the native binding checks them.
        prompt = _uint("prompt_tokens", prompt_tokens, 0, _U32)
        p = RequestParams(
            max_tokens=_uint("max_tokens", max_tokens, 0, _U32),
            n=_uint("n", n, 0, _U32))
        if lora is not None:
            p.lora = _option_str("lora", lora, 1, MAX_LORA_BYTES)
        if labels is None:
            labels = {}
        elif not hasattr(labels, "items"):
            raise TypeError("labels must be a dict of str to str, not "
                            f"{type(labels).__name__}")
        count = len(labels)
        if count > MAX_REQUEST_LABELS:
            raise ValueError(f"labels has {count} entries; at most "
                             f"{MAX_REQUEST_LABELS}")
        arr = (Label * count)()  # keeps the bytes alive through the call
        for i, (name, value) in enumerate(labels.items()):
            arr[i].name = _option_str("request label name", name, 1)
            arr[i].value = _option_str(f"request label {name!r} value",
                                       value, 0,
                                       MAX_REQUEST_LABEL_VALUE_BYTES)
        p.labels = ctypes.addressof(arr)
        p.n_labels = count
        if priority is not None:
            p.has_priority = 1
            p.priority = _priority(priority)
        if traceparent is not None:
            p.traceparent = _traceparent(traceparent).encode()
        if tracestate is not None:
            p.tracestate = _tracestate(tracestate).encode()
        addr = ctypes.addressof(p)
        if b is None:
            rc = _arrived_params(self._h, t_ns, v, prompt, addr)
        else:
            rc = _arrived_params_str(self._h, t_ns, b, len(b), prompt, addr)
        if rc == INVALID and self._h is not None:
            # What is left for the library (which counted it as rejected):
            # the label-name rules of protocol.h.
            _arrived_refused(labels)
        return rc

    def queued(self, rid, t_ns=0):
        """The request entered the engine's waiting queue (optional)."""
        if t_ns is _ZERO:
            if type(rid) is int and 0 <= rid <= _U64:
                return _queued(self._h, _T_NOW, rid)
            if type(rid) is str:
                b = rid.encode()
                ln = len(b)
                if 0 < ln <= MAX_RID_BYTES:
                    return _queued_str(self._h, _T_NOW, b, _RID_LEN[ln])
        return self._checked(_queued, _queued_str, rid, t_ns)

    def scheduled(self, rid, t_ns=0, cached_tokens=None,
                  external_tokens=None):
        """The request was scheduled (the first time counts). Protocol 1.2:
        with cached_tokens (prompt tokens found in the local prefix cache)
        and external_tokens (received from another instance or a KV store
        instead of computed), both or neither, ints 0 .. 2**32-1: the
        daemon reads them on the first SCHEDULED, and drops them when their
        sum exceeds the request's prompt_tokens."""
        if cached_tokens is not None or external_tokens is not None:
            info = _scheduled_info(cached_tokens, external_tokens)
            t_ns = _t(t_ns)
            v, b = _rid(rid)
            if b is None:
                return _scheduled_ex(self._h, t_ns, v, *info)
            return _scheduled_ex_str(self._h, t_ns, b, len(b), *info)
        if t_ns is _ZERO:
            if type(rid) is int and 0 <= rid <= _U64:
                return _scheduled(self._h, _T_NOW, rid)
            if type(rid) is str:
                b = rid.encode()
                ln = len(b)
                if 0 < ln <= MAX_RID_BYTES:
                    return _scheduled_str(self._h, _T_NOW, b,
                                          _RID_LEN[ln])
        return self._checked(_scheduled, _scheduled_str, rid, t_ns)

    def tokens(self, rid, n=1, t_ns=0):
        """n >= 1 output tokens were produced for the request in one step.
        For a whole step, tokens_batch() costs far less per request."""
        if n is _ONE and t_ns is _ZERO:
            if type(rid) is int and 0 <= rid <= _U64:
                return _tokens(self._h, _T_NOW, rid, _N_ONE)
            if type(rid) is str:
                b = rid.encode()
                ln = len(b)
                if 0 < ln <= MAX_RID_BYTES:
                    return _tokens_str(self._h, _T_NOW, b, _RID_LEN[ln],
                                       _N_ONE)
        elif (type(rid) is int and type(n) is int and type(t_ns) is int
              and 0 <= rid <= _U64 and 0 < n <= _U32 and 0 <= t_ns <= _U64):
            return _tokens(self._h, t_ns, rid, n)
        return self._checked(_tokens, _tokens_str, rid, t_ns,
                             _uint("n (tokens)", n, 1, _U32))

    def tokens_batch(self, rids, n=None, t_ns=0):
        """One engine step's output tokens, for many requests, in one call:
        the events tokens(rids[i], n[i], t_ns) would send, with one shared
        timestamp (t_ns 0: read once).

        rids: a sequence of ints or of strs (not mixed), or a buffer of
        integer ids: an array('Q') is used in place, without a copy (with
        the C extension also array('q'/'L'), numpy uint64/int64 arrays and
        bytes of native uint64s); other integer buffers (numpy int32,
        strided views) are read item by item; bytes, bytearray and
        memoryviews of bytes hold native uint64s (a length that is not a
        multiple of 8 raises ValueError); a buffer of floats or of more than
        one dimension raises TypeError. n: None (1 token each), one int for
        all, or a sequence or buffer (an array('I') is used in place) as
        long as rids; an entry of 0 is skipped (a prefill chunk that sampled
        nothing).
        Returns the number of events appended; fewer than the non-zero
        entries means the buffer was full (the rest dropped and counted).
        Raises TypeError / ValueError, sending nothing, for bad arguments.
        """
        rids, count, t_ns = _batch_ids(rids, t_ns)
        n_arr = _batch_counts(n, count)
        if type(n_arr) is int:  # n = 0: nothing to send
            return 0
        if count > _MAX_BATCH:
            return self._tokens_batch_split(rids, n, n_arr, count, t_ns)
        n_addr = n_arr.buffer_info()[0] if n_arr is not None else None
        # Request ids: integers (the cheap form), else strings.
        if type(rids) is array and rids.typecode == "Q":
            ids = rids
        elif type(rids) is list and count and type(rids[0]) is str:
            ids = None  # skip the failed int conversion, raising costs 1 us
        else:
            ids = _index_array("Q", rids)
        if ids is not None:
            ids_addr = ids.buffer_info()[0]
            rc = _tokens_batch(self._h, t_ns, ids_addr, n_addr, count)
            return rc if rc > 0 else 0  # < 0: closed
        try:
            # "a\0b" plus the NUL every bytes object ends with (CPython
            # guarantees it): the packed form tm_tokens_batch_str takes.
            buf = "\0".join(rids).encode()
        except TypeError:
            raise TypeError("request ids must be all ints or all strs") \
                from None
        buf_len = len(buf) + 1
        rc = _tokens_batch_str(self._h, t_ns, buf, buf_len, n_addr, count)
        if rc >= 0 or self._h is None:
            return max(rc, 0)
        return _diagnose_str_ids(rids)

    def _tokens_batch_split(self, rids, n, n_arr, count, t_ns):
        if t_ns == 0:
            t_ns = lib.tm_now_ns()  # one timestamp for the whole step
        appended = 0
        for lo in range(0, count, _MAX_BATCH):
            hi = min(lo + _MAX_BATCH, count)
            part_n = n if n is None or type(n) is int else n_arr[lo:hi]
            appended += self.tokens_batch(rids[lo:hi], part_n, t_ns)
        return appended

    def finished(self, rid, reason="stop", t_ns=0):
        """The request finished: reason "stop", "length", "abort", "error"
        or a FinishReason."""
        if t_ns is _ZERO and type(reason) is str:
            r = _REASON_ARGS.get(reason)
            if r is not None:
                if type(rid) is int and 0 <= rid <= _U64:
                    return _finished(self._h, _T_NOW, rid, r)
                if type(rid) is str:
                    b = rid.encode()
                    ln = len(b)
                    if 0 < ln <= MAX_RID_BYTES:
                        return _finished_str(self._h, _T_NOW, b,
                                             _RID_LEN[ln], r)
        return self._checked(_finished, _finished_str, rid, t_ns,
                             _finish_reason(reason))

    def preempted(self, rid, t_ns=0):
        """The request lost its KV cache and went back to waiting."""
        if t_ns is _ZERO:
            if type(rid) is int and 0 <= rid <= _U64:
                return _preempted(self._h, _T_NOW, rid)
            if type(rid) is str:
                b = rid.encode()
                ln = len(b)
                if 0 < ln <= MAX_RID_BYTES:
                    return _preempted_str(self._h, _T_NOW, b,
                                          _RID_LEN[ln])
        return self._checked(_preempted, _preempted_str, rid, t_ns)

    def step(self, *, running=None, waiting=None, kv_usage=None,
             prompt_tokens=None, generation_tokens=None, prefix_queries=None,
             prefix_hits=None, spec_drafts=None, spec_draft_tokens=None,
             spec_accepted_tokens=None, spec_accepted_per_pos=None, t_ns=0,
             waiting_deferred=None):
        """One scheduler iteration (STEP). Every figure is optional; None
        leaves it out. Counts are ints 0 .. 2**32-1; kv_usage a fraction
        0 .. 1; spec_accepted_per_pos at most 64 ints 0 .. 2**32-1.
        waiting_deferred (protocol 1.2): of waiting, the requests waiting
        for something other than capacity (a LoRA slot, a KV transfer, a
        grammar); only with waiting and at most it (ValueError otherwise:
        the daemon would drop it)."""
        figures, pos = _step_figures(
            (running, waiting, kv_usage, prompt_tokens, generation_tokens,
             prefix_queries, prefix_hits, spec_drafts, spec_draft_tokens,
             spec_accepted_tokens, waiting_deferred), spec_accepted_per_pos)
        keys = array("i", [k for k, _ in figures])
        values = array("d", [v for _, v in figures])
        t_ns = _t(t_ns)
        k_addr, n_keys = keys.buffer_info()
        v_addr = values.buffer_info()[0]
        p_addr, n_pos = pos.buffer_info()
        return _step(self._h, t_ns, k_addr, v_addr, n_keys, p_addr, n_pos)


    def expert_load(self, layer, counts, t_ns=0):
        """MoE expert load (protocol 1.1 EXPERT_LOAD): counts[i] is the
        number of tokens MoE layer `layer` (0 .. 4095) routed to expert i
        since this engine's previous expert_load() for that layer. 1 .. 1024
        counts, each 0 .. 2**32-1; a layer keeps the number of experts its
        first call gave (the daemon refuses another length).

        counts is read in place, without a per-element copy, when it is a
        one-dimensional C-contiguous buffer of native uint64: an
        array('Q'), a numpy uint64 array (for a torch tensor:
        t.to(torch.int64).cpu().numpy().view(numpy.uint64)), a ctypes
        c_uint64 array, or bytes / bytearray / memoryview holding native
        uint64s (a length that is a multiple of 8). Anything else (a list,
        a numpy array of another dtype) is converted to an array('Q') first,
        element by element. The library copies the counts into its buffer;
        counts may be reused once the call returns.

        Returns OK, DROPPED (buffer full; counted), or INVALID after
        close(). Raises TypeError / ValueError for a bad layer, t_ns or
        number of counts, or a count that is not an int 0 .. 2**64-1,
        before anything is sent; a count above 2**32-1 is found by the
        library, which counts the event as rejected, and then raises
        ValueError too.
        """
        if type(layer) is not int or not 0 <= layer < MAX_MOE_LAYERS:
            layer = _uint("layer", layer, 0, MAX_MOE_LAYERS - 1)
        t = _T_NOW if t_ns is _ZERO else _t(t_ns)
        if type(counts) is array and counts.typecode == "Q":
            arg, n = counts.buffer_info()
        else:
            # `arg` keeps what it points into alive until the call is done.
            arg, n = _u64_buffer(counts)
        if not 0 < n <= MAX_MOE_EXPERTS:
            raise ValueError(f"counts has {n} entries; an expert_load "
                             f"carries 1 .. {MAX_MOE_EXPERTS}")
        h = self._h
        rc = _expert_load(h, t, layer, arg, n)
        if rc == INVALID and h is not None:
            # Layer and length were checked: the library refused a count.
            raise ValueError("expert counts must be ints 0 .. 2**32-1 (the "
                             "event was counted as rejected)")
        return rc


    # ---- protocol 1.2 events --------------------------------------------

    def register_value(self, value):
        b = _option_str("value", value, 1, MAX_LABEL_VALUE_BYTES)
        h = self._h
        rc = lib.tm_register_value(h, b)
        if rc == INVALID and h is not None:
            _label_value_refused("value", value)
        return rc

    register_value.__doc__ = _REGISTER_VALUE_DOC

    def admission_rejected(self, reason, rid=None, t_ns=0):
        """The server refused a request before it entered the engine
        (ADMISSION_REJECTED): reason, a str of 1 .. 64 bytes of UTF-8
        without control characters (e.g. "queue_full"), or its
        register_value() id; rid, the request's id (an int or a str, as
        elsewhere) or None. The request is not tracked; the id only names
        it. A reason the library refuses (a control character, an id this
        client did not return) is counted as rejected and raises
        ValueError."""
        r, value_id = _label_value_or_id("reason", reason)
        t = _t(t_ns)
        # The three calls of a string reason, or of a registered one.
        calls = _ADMISSION_STR if r is not None else _ADMISSION_ID
        arg = r if r is not None else value_id
        v, b = _rid(rid) if rid is not None else (None, None)
        # The handle read last, right before the call (as the native
        # binding, which holds the GIL throughout): a close() on another
        # thread makes it None (INVALID), never a closed client's CLOSED.
        h = self._h
        if rid is None:
            rc = calls[0](h, t, arg)
        elif b is None:
            rc = calls[1](h, t, arg, v)
        else:
            rc = calls[2](h, t, arg, b, len(b))
        if rc == INVALID and h is not None:
            _label_value_refused("reason", reason)
        return rc

    def kv_transfer(self, rid, role, start_ns, t_ns=0, bytes=None,
                    blocks=None, ok=True, reason=None, connector=None):
        """One KV-cache transfer of request rid ended at t_ns (0: now)
        (KV_TRANSFER, disaggregated prefill/decode): role "send" (the
        prefill side) or "recv" (the decode side); start_ns, when it began
        (time.monotonic_ns(), at most the end); bytes and blocks, ints
        0 .. 2**48-1 or None (not sent); ok, a bool (False: it failed; sent
        only then); reason (on failure, e.g. "timeout") and connector (e.g.
        "nixl"), strs of 1 .. 64 bytes of UTF-8 without control characters,
        or None; either may be its register_value() id instead. A start
        after now (t_ns 0), a string the library refuses or an id this
        client did not return is counted as rejected and raises
        ValueError."""
        role_i, start, t, nbytes, nblocks, ok, r, conn = _kv_transfer_args(
            role, start_ns, t_ns, bytes, blocks, ok, reason, connector)
        info = KvTransferInfo(
            role=role_i, start_ns=start,
            bytes=KV_UNKNOWN if nbytes is None else nbytes,
            blocks=KV_UNKNOWN if nblocks is None else nblocks,
            ok=int(ok), reason=r[0], connector=conn[0], reason_id=r[1],
            connector_id=conn[1])
        addr = ctypes.addressof(info)
        v, b = _rid(rid)
        h = self._h
        if b is None:
            rc = _kv_transfer(h, t, v, addr)
        else:
            rc = _kv_transfer_str(h, t, b, len(b), addr)
        if rc == INVALID and h is not None:
            _kv_transfer_refused(start, t, reason, connector)
        return rc

    def sleep_state(self, scheduler=None, weights=None, kv_cache=None,
                    t_ns=0):
        """The engine's sleep state changed (SLEEP; vLLM's sleep mode,
        SGLang's memory release): scheduler "running" or "paused"; weights
        "resident", "offloaded" or "discarded"; kv_cache "resident" or
        "released"; None leaves a part as it was (all None sends an empty
        state, which changes nothing)."""
        parts = _sleep_state_args(scheduler, weights, kv_cache)
        return _sleep_state(self._h, _t(t_ns), *parts)


    # ---- protocol 1.3 events --------------------------------------------

    def request_summary(self, reason, *, prompt_tokens, generation_tokens,
                        cached_tokens=None, max_tokens=None, n=None,
                        ttft_ns=None, queue_ns=None, prefill_ns=None,
                        decode_ns=None, inference_ns=None, e2e_ns=None,
                        tpot_ns=None, rid=None, t_ns=0,
                        max_generation_tokens=None):
        """One finished request as the engine computed it
        (REQUEST_SUMMARY), for engines that report no per-request events:
        reason "stop", "length", "abort", "error" or a FinishReason;
        prompt_tokens and generation_tokens, ints 0 .. 2**32-1 (required);
        cached_tokens (at most prompt_tokens), the max_tokens and n params
        and max_generation_tokens (of a request group, vLLM's parallel
        sampling: the most tokens one of its requests generated, given on
        the summary that completes the group), ints 0 .. 2**32-1 or None;
        the durations in ns (time to first token, queue, prefill, decode,
        inference, end to end, time per output token), ints 0 .. 2**48-1
        or None (not known: that histogram is not observed); rid, the
        request's id (int or str) or None: it only names the request. The
        daemon observes request_success_total and the per-request
        histograms; it tracks no request."""
        fields = (cached_tokens, max_tokens, n, max_generation_tokens,
                  ttft_ns, queue_ns, prefill_ns, decode_ns, inference_ns,
                  e2e_ns, tpot_ns)
        r = _REASON_VALUES.get(reason) if type(reason) is str else None
        if (r is not None and type(prompt_tokens) is int and
                type(generation_tokens) is int and
                0 <= prompt_tokens <= _U32 and
                0 <= generation_tokens <= _U32 and
                all(v is None or (type(v) is int and 0 <= v <= hi)
                    for v, hi in zip(fields, _SUMMARY_MAX)) and
                (cached_tokens is None or cached_tokens <= prompt_tokens)):
            t = _T_NOW if t_ns is _ZERO else _t(t_ns)
            prompt, generation = prompt_tokens, generation_tokens
        else:  # the checks that name the rule broken
            r, prompt, generation, fields = _request_summary_args(
                reason, prompt_tokens, generation_tokens, fields)
            t = _t(t_ns)
        q = RequestSummary.given(r, prompt, generation, fields)
        addr = ctypes.addressof(q)
        h = self._h
        if rid is None:
            return _request_summary(h, t, addr)
        v, b = _rid(rid)
        if b is None:
            return _request_summary_rid(h, t, v, addr)
        return _request_summary_str(h, t, b, len(b), addr)

    def latencies(self, ttft_ns=(), itl_ns=(), t_ns=0, *, prompt_tokens=None,
                  generation_tokens=None, preemptions=None):
        """One iteration's latencies as the engine computed them
        (LATENCIES): ttft_ns, its requests' times to first token, and
        itl_ns, its inter-token latencies, sequences (or buffers) of ints
        0 .. 2**48-1 in ns, each observed once in its histogram; more than
        1024 values together are sent as several events. prompt_tokens,
        generation_tokens and preemptions: what the iteration counted for
        requests the engine reports no events of (added to the token and
        preemption counters), ints 0 .. 2**32-1 or None. Returns OK, or the
        first event's DROPPED / INVALID."""
        # The common call, one event (LMDeploy's adapter makes one per
        # engine output): lists or tuples of ints in range, t_ns and each
        # count an int in range or None. Anything else, or a value out of
        # range, takes the checking path below (the same result).
        tt, it = type(ttft_ns), type(itl_ns)
        if ((tt is tuple or tt is list) and (it is tuple or it is list) and
                type(t_ns) is int and not t_ns >> 64 and
                len(ttft_ns) + len(itl_ns) <= MAX_LATENCIES):
            try:
                a = array("Q", ttft_ns)
                b = array("Q", itl_ns)
            except (TypeError, OverflowError):
                a = None
            if (a is not None and (not a or max(a) <= MAX_DURATION_NS) and
                    (not b or max(b) <= MAX_DURATION_NS)):
                c = _latency_counts_fast(prompt_tokens, generation_tokens,
                                         preemptions)
                if c is not False:
                    return _latencies(
                        self._h, t_ns, a.buffer_info()[0] if a else None,
                        len(a), b.buffer_info()[0] if b else None, len(b),
                        None if c is None else ctypes.addressof(c))
        h = self._h
        rc = OK
        for a, b, t, counts in _latency_args(ttft_ns, itl_ns, t_ns,
                                             prompt_tokens, generation_tokens,
                                             preemptions):
            c = IterationCounts(**counts) if counts else None
            r = _latencies(h, t, a.buffer_info()[0] if a else None, len(a),
                           b.buffer_info()[0] if b else None, len(b),
                           None if c is None else ctypes.addressof(c))
            if rc == OK:
                rc = r
        return rc

_COUNTS_SIZE = ctypes.sizeof(IterationCounts)
_init_struct = ctypes.Structure.__init__


def _latency_counts_fast(prompt_tokens, generation_tokens, preemptions):
    """latencies()' counts as a tm_iteration_counts without the keyword
    __init__: None when none is given, False when one is not an int in
    range (the checking path then raises naming it)."""
    if prompt_tokens is None and generation_tokens is None and \
            preemptions is None:
        return None
    vals = []
    for v in (prompt_tokens, generation_tokens, preemptions):
        if v is None:
            vals.append(NOT_GIVEN)
        elif type(v) is int and 0 <= v <= _U32:
            vals.append(v)
        else:
            return False
    c = IterationCounts.__new__(IterationCounts)
    _init_struct(c, _COUNTS_SIZE, *vals)
    return c


# memoryview formats of a native uint64 (array('Q'): "Q"; numpy uint64: "L"
# on LP64 Linux; ctypes c_uint64 arrays: "<Q").
_U64_FORMATS = frozenset(("Q", "L", "=Q", "=L", "@Q", "@L") +
                         (("<Q", "<L") if sys.byteorder == "little"
                          else (">Q", ">L")))


def _u64_buffer(counts):
    """(argument for tm_expert_load's counts, n) for expert_load(): the
    buffer itself when it holds native uint64s (no copy per element), else
    an array('Q') of the items (_counts_array() refuses what is not ints,
    a str or an int included)."""
    try:
        m = memoryview(counts)
    except TypeError:
        m = None
    if m is not None and m.ndim == 1 and m.c_contiguous:
        if m.format in _U64_FORMATS and m.itemsize == 8:
            n = m.shape[0]
        elif m.format in ("B", "b", "c"):
            if m.nbytes % 8 != 0:
                raise ValueError(f"counts given as bytes: {m.nbytes} bytes "
                                 "is not a whole number of uint64s")
            n = m.nbytes // 8  # raw bytes of native uint64s
        else:
            n = None
        if n is not None:
            if n == 0:
                return None, 0
            if type(counts) is bytes:
                return counts, n  # ctypes passes its char*; 8-aligned
            if not m.readonly:
                # A ctypes view of the same memory (no copy), passed as its
                # address; it holds the buffer exported during the call.
                view = (ctypes.c_char * m.nbytes).from_buffer(m)
                if ctypes.addressof(view) % 8 == 0:
                    return view, n
            # Read-only or misaligned: one copy of the bytes, not per item.
            return m.tobytes(), n
    a = _counts_array(counts)
    # c_void_p takes an int address; the caller keeps `a` alive meanwhile.
    return _ArrayArg(a), len(a)


class _ArrayArg:
    """An array('Q') as a ctypes argument (its address), kept alive by the
    argument itself for the length of the call."""
    __slots__ = ("_as_parameter_", "a")

    def __init__(self, a):
        self.a = a
        self._as_parameter_ = a.buffer_info()[0]
