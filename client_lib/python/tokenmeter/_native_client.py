"""tokenmeter.Client over the CPython extension tokenmeter._native.

The event methods are the C type's (tokenmeter/_native.c): a call with the
argument types an engine passes costs one C call, no Python frame. Any
other call lands in the _*_slow method of the same name below, which
checks the arguments by the rules of _common.py (the messages the ctypes
binding raises), converts them to the exact types the fast path takes and
calls it again, so every rule has one implementation.
"""
import threading
import weakref
from array import array

from . import _native
from ._common import (_MAX_BATCH, _NOMEM, _REGISTER_VALUE_DOC, _STEP_KEYS,
                      _U32,
                      KV_CACHE_STATES, KV_ROLES, MAX_LABEL_VALUE_BYTES,
                      MAX_LORA_BYTES,
                      MAX_MOE_EXPERTS, MAX_MOE_LAYERS,
                      MAX_REQUEST_LABEL_VALUE_BYTES, MAX_REQUEST_LABELS, OK,
                      SCHEDULER_STATES, WEIGHTS_STATES, Stats,
                      _arrived_refused, _batch_counts, _counts_array,
                      _diagnose_str_ids, _batch_ids, _index_array,
                      _kv_transfer_args, _kv_transfer_refused,
                      _label_value_or_id,
                      _label_value_refused, _live, _option_str, _priority,
                      _rid, _scheduled_info, _seconds_to_ms,
                      _sleep_state_args, _step_figures, _t, _tracestate,
                      _traceparent, _uint, apply_options,
                      _SUMMARY_FIELDS, _finish_reason, _request_summary_args,
                      _latency_args)

_C = _native.Client
_ZERO_STATS = Stats(*([0] * len(Stats._fields)))

def _id(rid):
    """The request id as the fast path takes it: an int or bytes."""
    v, b = _rid(rid)
    return v if b is None else b


def _exact_str(s):
    return s if type(s) is str else str.__str__(s)


class Client(_C):
    """One connection's worth of identity and buffers: a tm_client.

    with tokenmeter.Client(engine="vllm", model="llama-3-8b",
                           instance="dp0") as meter:
        meter.arrived("req-1", prompt_tokens=812, max_tokens=256)
        meter.tokens_batch(step_request_ids)      # once per engine step
        meter.finished("req-1", "stop")

    The same class, arguments and results as the ctypes binding
    (tokenmeter/client.py has the whole contract); here each event method
    is one C call.
    """

    __slots__ = ("_finalizer", "_close_lock", "_final_stats")

    def __init__(self, **options):
        self._finalizer = None
        self._close_lock = threading.Lock()
        self._final_stats = _ZERO_STATS
        opts = _native.Options()
        apply_options(opts, **options)
        rc = self._open(opts)
        del opts
        if rc == _NOMEM:
            raise MemoryError("tm_client_new: out of memory")
        if rc != OK:
            raise OSError(f"tm_client_new: {_native.strerror(rc)} (could not "
                          "start the sender thread)")
        # Unclosed clients are closed (their events sent) when collected or
        # at interpreter exit.
        self._finalizer = weakref.finalize(self, _native.close_handle,
                                           self._handle())
        _live.add(self)

    # ---- lifecycle -------------------------------------------------------

    def close(self):
        """Sends what is buffered (waiting at most close_timeout), says
        GOODBYE and frees the library's client. Returns the final Stats.
        Idempotent."""
        with self._close_lock:
            result = self._close()  # the GIL is released while it waits
            if result is None:
                return self._final_stats
            self._finalizer.detach()
            _live.discard(self)
            self._final_stats = Stats(*result[1])
            return self._final_stats

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _forget_after_fork(self):
        # The child has a copy of the buffers but no sender thread: closing
        # would wait for a thread that is not there. Leave the copy alone.
        self._forget()
        if self._finalizer is not None:
            self._finalizer.detach()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<tokenmeter.Client {state}>"

    # ---- control ---------------------------------------------------------

    def stats(self):
        """Counters as a Stats namedtuple (after close: the final ones)."""
        s = self._stats()
        return self._final_stats if s is None else Stats(*s)

    def flush(self, timeout=1.0):
        """Waits until every event appended before the call is written to
        the socket. True when done; False when the daemon is away (at once)
        or the timeout ran out. Blocks (other threads run meanwhile)."""
        ms = _seconds_to_ms("timeout", timeout, 0, _U32)
        with self._close_lock:
            rc = self._flush(ms)
            if rc is None:
                raise ValueError("flush() on a closed tokenmeter.Client")
            return rc == OK

    def attach_thread(self):
        """Optional: allocates the calling thread's buffer now, so that its
        first event call does not. False when max_threads are reporting."""
        with self._close_lock:
            return not self.closed and self._attach() == OK

    # ---- the slow paths of the C methods ----------------------------------

    def _tokens_slow(self, rid, n=1, t_ns=0):
        n = _uint("n (tokens)", n, 1, _U32)
        t = _t(t_ns)
        return _C.tokens(self, _id(rid), n, t)

    def _queued_slow(self, rid, t_ns=0):
        t = _t(t_ns)
        return _C.queued(self, _id(rid), t)

    def _scheduled_slow(self, rid, t_ns=0, cached_tokens=None,
                        external_tokens=None):
        info = _scheduled_info(cached_tokens, external_tokens)
        t = _t(t_ns)
        if info is None:
            return _C.scheduled(self, _id(rid), t)
        return _C.scheduled(self, _id(rid), t, *info)

    def _preempted_slow(self, rid, t_ns=0):
        t = _t(t_ns)
        return _C.preempted(self, _id(rid), t)

    def _finished_slow(self, rid, reason="stop", t_ns=0):
        r = _finish_reason(reason)
        t = _t(t_ns)
        return _C.finished(self, _id(rid), int(r), t)

    def _arrived_slow(self, rid, prompt_tokens, max_tokens=0, n=0, t_ns=0,
                      lora=None, labels=None, priority=None, traceparent=None,
                      tracestate=None):
        if (lora is None and labels is None and priority is None
                and traceparent is None and tracestate is None):
            counts = (_uint("prompt_tokens", prompt_tokens, 0, _U32),
                      _uint("max_tokens", max_tokens, 0, _U32),
                      _uint("n", n, 0, _U32))
            t = _t(t_ns)
            return _C.arrived(self, _id(rid), *counts, t)
        t = _t(t_ns)
        r = _id(rid)
        counts = (_uint("prompt_tokens", prompt_tokens, 0, _U32),
                  _uint("max_tokens", max_tokens, 0, _U32),
                  _uint("n", n, 0, _U32))
        if lora is not None:
            _option_str("lora", lora, 1, MAX_LORA_BYTES)
            lora = _exact_str(lora)
        if labels is None:
            labels = {}
        elif not hasattr(labels, "items"):
            raise TypeError("labels must be a dict of str to str, not "
                            f"{type(labels).__name__}")
        if len(labels) > MAX_REQUEST_LABELS:
            raise ValueError(f"labels has {len(labels)} entries; at most "
                             f"{MAX_REQUEST_LABELS}")
        exact = {}
        for name, value in labels.items():
            _option_str("request label name", name, 1)
            _option_str(f"request label {name!r} value", value, 0,
                        MAX_REQUEST_LABEL_VALUE_BYTES)
            exact[_exact_str(name)] = _exact_str(value)
        if priority is not None:
            priority = _priority(priority)
        if traceparent is not None:
            traceparent = _exact_str(_traceparent(traceparent))
        if tracestate is not None:
            tracestate = _exact_str(_tracestate(tracestate))
        return _C.arrived(self, r, *counts, t, lora, exact or None, priority,
                          traceparent, tracestate)

    def _tokens_batch_slow(self, rids, n=None, t_ns=0):
        rids, count, t_ns = _batch_ids(rids, t_ns)
        n_arr = _batch_counts(n, count)
        if type(n_arr) is int:  # n = 0: nothing to send
            return 0
        if count > _MAX_BATCH:
            if t_ns == 0:
                t_ns = _native.now_ns()  # one timestamp for the whole step
            appended = 0
            for lo in range(0, count, _MAX_BATCH):
                hi = min(lo + _MAX_BATCH, count)
                part = None if n_arr is None else n_arr[lo:hi]
                appended += _C.tokens_batch(self, list(rids[lo:hi]), part,
                                            t_ns)
            return appended
        if type(rids) is array and rids.typecode == "Q":
            ids = rids
        elif type(rids) in (list, tuple) and count and \
                isinstance(rids[0], str):
            ids = None
        else:
            ids = _index_array("Q", rids)
        if ids is not None:
            return _C.tokens_batch(self, ids, n_arr, t_ns)
        if not all(isinstance(r, str) for r in rids):
            raise TypeError("request ids must be all ints or all strs")
        return _C.tokens_batch(self, [_exact_str(r) for r in rids], n_arr,
                               t_ns)

    def _tokens_batch_diagnose(self, rids):
        """The library refused a batch of str ids: raise saying why."""
        return _diagnose_str_ids(rids)

    def _step_slow(self, *, running=None, waiting=None, kv_usage=None,
                   prompt_tokens=None, generation_tokens=None,
                   prefix_queries=None, prefix_hits=None, spec_drafts=None,
                   spec_draft_tokens=None, spec_accepted_tokens=None,
                   spec_accepted_per_pos=None, t_ns=0, waiting_deferred=None):
        figures, pos = _step_figures(
            (running, waiting, kv_usage, prompt_tokens, generation_tokens,
             prefix_queries, prefix_hits, spec_drafts, spec_draft_tokens,
             spec_accepted_tokens, waiting_deferred), spec_accepted_per_pos)
        kw = {_STEP_KEYS[k]: v for k, v in figures}
        if spec_accepted_per_pos is not None:
            kw["spec_accepted_per_pos"] = pos.tolist()
        return _C.step(self, t_ns=_t(t_ns), **kw)

    def _expert_load_slow(self, layer, counts, t_ns=0):
        layer = _uint("layer", layer, 0, MAX_MOE_LAYERS - 1)
        t = _t(t_ns)
        a = _counts_array(counts)
        if not 0 < len(a) <= MAX_MOE_EXPERTS:
            raise ValueError(f"counts has {len(a)} entries; an expert_load "
                             f"carries 1 .. {MAX_MOE_EXPERTS}")
        return _C.expert_load(self, layer, a, t)


    # ---- protocol 1.2 -----------------------------------------------------

    def register_value(self, value):
        _option_str("value", value, 1, MAX_LABEL_VALUE_BYTES)
        return _C._register_value(self, _exact_str(value))

    register_value.__doc__ = _REGISTER_VALUE_DOC

    def _admission_rejected_slow(self, reason, rid=None, t_ns=0):
        _, i = _label_value_or_id("reason", reason)
        t = _t(t_ns)
        r = None if rid is None else _id(rid)
        return _C.admission_rejected(self, i or _exact_str(reason), r, t)

    def _kv_transfer_slow(self, rid, role, start_ns, t_ns=0, bytes=None,
                          blocks=None, ok=True, reason=None, connector=None):
        role_i, start, t, nbytes, nblocks, ok, r, c = _kv_transfer_args(
            role, start_ns, t_ns, bytes, blocks, ok, reason, connector)
        return _C.kv_transfer(
            self, _id(rid), KV_ROLES[role_i], start, t, nbytes, nblocks, ok,
            None if reason is None else r[1] or _exact_str(reason),
            None if connector is None else c[1] or _exact_str(connector))

    def _sleep_state_slow(self, scheduler=None, weights=None, kv_cache=None,
                          t_ns=0):
        s, w, k = _sleep_state_args(scheduler, weights, kv_cache)
        return _C.sleep_state(
            self, None if s < 0 else SCHEDULER_STATES[s],
            None if w < 0 else WEIGHTS_STATES[w],
            None if k < 0 else KV_CACHE_STATES[k], _t(t_ns))

    # ---- protocol 1.3 -----------------------------------------------------

    def _request_summary_slow(self, reason, *, prompt_tokens,
                              generation_tokens, cached_tokens=None,
                              max_tokens=None, n=None, ttft_ns=None,
                              queue_ns=None, prefill_ns=None, decode_ns=None,
                              inference_ns=None, e2e_ns=None, tpot_ns=None,
                              rid=None, t_ns=0, max_generation_tokens=None):
        r, prompt, generation, fields = _request_summary_args(
            reason, prompt_tokens, generation_tokens,
            (cached_tokens, max_tokens, n, max_generation_tokens, ttft_ns,
             queue_ns, prefill_ns, decode_ns, inference_ns, e2e_ns, tpot_ns))
        t = _t(t_ns)
        return _C.request_summary(
            self, r, prompt_tokens=prompt, generation_tokens=generation,
            rid=None if rid is None else _id(rid), t_ns=t,
            **dict(zip(_SUMMARY_FIELDS, fields)))

    def _latencies_slow(self, ttft_ns=(), itl_ns=(), t_ns=0, *,
                        prompt_tokens=None, generation_tokens=None,
                        preemptions=None):
        rc = OK
        for a, b, t, counts in _latency_args(ttft_ns, itl_ns, t_ns,
                                             prompt_tokens, generation_tokens,
                                             preemptions):
            r = _C.latencies(self, a, b, t, **counts)
            if rc == OK:
                rc = r
        return rc

    # The library refused a call the fast path made (and counted it): the
    # C methods call these to raise naming the rule.
    @staticmethod
    def _arrived_refused(labels):
        _arrived_refused(labels)

    @staticmethod
    def _label_value_refused(what, value):
        _label_value_refused(what, value)

    @staticmethod
    def _kv_transfer_refused(start_ns, t_ns, reason, connector):
        _kv_transfer_refused(start_ns, t_ns, reason, connector)


# A slow path's TypeError (an unknown keyword, a missing argument) names the
# public method, as the ctypes binding's does: "tokens() got an unexpected
# keyword argument 'x'", not "_tokens_slow() ...".
for _name in ("tokens", "queued", "scheduled", "preempted", "finished",
              "arrived", "tokens_batch", "step", "expert_load",
              "admission_rejected", "kv_transfer", "sleep_state",
              "request_summary", "latencies"):
    _fn = getattr(Client, f"_{_name}_slow")
    _fn.__code__ = _fn.__code__.replace(co_name=_name)
    _fn.__name__, _fn.__qualname__ = _name, f"Client.{_name}"
del _name, _fn
