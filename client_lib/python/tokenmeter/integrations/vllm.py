"""tokenmeter's vLLM stat-logger plugin: vLLM's own statistics to tokenmeterd.

Installing the tokenmeter wheel into vLLM's environment is the whole
set-up: the wheel registers TokenmeterStatLogger under the
`vllm.stat_logger_plugins` entry point, which vLLM's AsyncLLM loads in its
front-end process (vllm/v1/metrics/loggers.py,
load_stat_logger_plugin_factories(), vLLM v0.12). vLLM's own Prometheus
logger keeps running beside it. TOKENMETER_VLLM=0 turns the plugin off (it
then makes no client and every call returns at once); TOKENMETER_SOCKET
names the daemon's socket (default /run/tokenmeter/ingest.sock).

What vLLM hands a stat logger, per engine-core iteration, and where it
goes (docs/integrations.md, "vLLM"):

* SchedulerStats (running, waiting, KV-cache usage, prefix-cache queries
  and hits, speculative decoding) and the iteration's token counts: one
  STEP (client.step()).
* IterationStats' times to first token and inter-token latencies (float
  seconds vLLM computed; no request ids, no timeline), its prompt and
  generation tokens and preemptions: one LATENCIES (client.latencies(),
  protocol 1.3), values in ns.
* Each FinishedRequestStats (finish reason, token counts, max_tokens, its
  durations: e2e, queue, prefill, decode, inference, mean time per output
  token; cached tokens where vLLM has them) and the iteration's n and
  max-generation-tokens per completed request group: one REQUEST_SUMMARY
  each (client.request_summary(), protocol 1.3).
* record_sleep_state(sleep, level): SLEEP (client.sleep_state()).

One client per engine index (the series' `engine` label is the index, as
in vLLM's own series), profile "vllm", model vLLM's served model name,
cache_config vLLM's cache_config_info labels, max_lora its LoRA slots. The
clients are made when vLLM reports its engines initialized (or at the first
record()).

Nothing here raises into vLLM: every call catches what goes wrong, counts
it (TokenmeterStatLogger.errors) and logs the first one; a daemon that is
down or slow only makes the library drop events (counted in the client's
stats), the calls never block.
"""
import logging
import os
import re

try:  # vLLM v0.11+: a logger that sees every engine (and sleep states)
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase as _Base
except ImportError:  # older vLLM v1: a per-engine logger
    from vllm.v1.metrics.loggers import StatLoggerBase as _Base

import tokenmeter

ENV_VAR = "TOKENMETER_VLLM"
SOCKET_VAR = "TOKENMETER_SOCKET"

_log = logging.getLogger("tokenmeter.integrations.vllm")

# vLLM's FinishReason strings (vllm/v1/engine/__init__.py) that the protocol
# has; another (a later vLLM's "repetition") is not sent and is counted.
_REASONS = ("stop", "length", "abort", "error")
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_NS = 1e9
_MAX_SPEC_POSITIONS = 64  # TM_MAX_SPEC_POSITIONS
_MAX_NS = tokenmeter.MAX_DURATION_NS
_RESERVED = frozenset((
    "model_name", "engine", "engine_family", "finished_reason", "position",
    "le", "quantile", "interval", "reason", "kind", "max_lora",
    "running_lora_adapters", "waiting_lora_adapters", "cache_source",
    "layer", "expert", "source", "role", "sleep_state", "resource", "state",
    "stage"))


def enabled():
    """False when TOKENMETER_VLLM is "0", "false", "no" or "off"."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in (
        "0", "false", "no", "off")


def _ns(seconds):
    """A duration vLLM computed (float seconds) in ns, or None when it is
    negative (a wall clock that stepped back) or out of the protocol's
    range."""
    ns = round(seconds * _NS)
    return ns if 0 <= ns <= _MAX_NS else None


def _cache_config(vllm_config):
    """vLLM's cache_config_info labels (CacheConfig.metrics_info(), all
    strings) that the HELLO rules take, at most 32."""
    try:
        info = vllm_config.cache_config.metrics_info()
    except Exception:  # an older CacheConfig, or none
        return {}
    out = {}
    for key, value in info.items():
        key, value = str(key), str(value)
        if (_NAME.match(key) and not key.startswith("__")
                and key not in _RESERVED and len(value.encode()) <= 256
                and len(out) < tokenmeter.MAX_CACHE_CONFIG):
            out[key] = value
    return out


class TokenmeterStatLogger(_Base):
    """A vLLM StatLoggerBase that reports to tokenmeterd.

    vLLM constructs it as an aggregate logger, (vllm_config,
    engine_indexes), or, with a vLLM without aggregate loggers, once per
    engine, (vllm_config, engine_index).
    """

    def __init__(self, vllm_config, engine_indexes=None):
        if engine_indexes is None:
            engine_indexes = [0]
        elif isinstance(engine_indexes, int):
            engine_indexes = [engine_indexes]
        self.engine_indexes = list(engine_indexes)
        self.vllm_config = vllm_config
        self.enabled = enabled()
        self.clients = {}
        # What went wrong, counted: calls that raised (caught here),
        # durations not sent (negative or too long), finished requests
        # whose reason the protocol lacks, group figures without a finished
        # request to carry them.
        self.errors = 0
        self.durations_dropped = 0
        self.reasons_dropped = 0
        self.group_figures_dropped = 0
        self._logged = False
        self._sleep = None  # the last state, sent to clients made later
        mc = getattr(vllm_config, "model_config", None)
        model = getattr(mc, "served_model_name", None) or getattr(
            mc, "model", None) or "unknown"
        if isinstance(model, (list, tuple)):
            model = model[0]
        self._options = {"engine": "vllm", "model": str(model),
                         "profile": "vllm"}
        path = os.environ.get(SOCKET_VAR)
        if path:
            self._options["socket_path"] = path
        lora = getattr(vllm_config, "lora_config", None)
        max_loras = getattr(lora, "max_loras", None)
        if isinstance(max_loras, int) and max_loras >= 0:
            self._options["max_lora"] = max_loras

    # ---- what went wrong ------------------------------------------------

    def _failed(self, where, exc):
        self.errors += 1
        if not self._logged:
            self._logged = True
            _log.warning("tokenmeter: %s failed (%s: %s); counting later "
                         "failures without logging them", where,
                         type(exc).__name__, exc)

    # ---- clients ---------------------------------------------------------

    def _make_clients(self):
        opts = dict(self._options)
        opts["cache_config"] = _cache_config(self.vllm_config)
        for idx in self.engine_indexes:
            if idx in self.clients:
                continue
            try:
                c = tokenmeter.Client(instance=str(idx), **opts)
            except Exception as e:  # a bad option: report without it
                self._failed("tokenmeter.Client()", e)
                try:
                    c = tokenmeter.Client(
                        instance=str(idx),
                        **{k: v for k, v in opts.items()
                           if k in ("engine", "model", "profile",
                                    "socket_path")})
                except Exception as e2:
                    self._failed("tokenmeter.Client()", e2)
                    continue
            self.clients[idx] = c
            if self._sleep is not None:
                c.sleep_state(*self._sleep)
            else:
                # vLLM's own logger starts every engine awake.
                c.sleep_state("running", "resident", "resident")

    def _client(self, engine_idx):
        c = self.clients.get(engine_idx)
        if c is None and self.enabled:
            if engine_idx not in self.engine_indexes:
                self.engine_indexes.append(engine_idx)
            self._make_clients()
            c = self.clients.get(engine_idx)
        return c

    # ---- StatLoggerBase --------------------------------------------------

    def log_engine_initialized(self):
        if not self.enabled:
            return
        try:
            self._make_clients()
        except Exception as e:
            self._failed("log_engine_initialized()", e)

    def log(self):
        pass  # tokenmeterd logs its own summary line

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx=0):
        if not self.enabled:
            return
        try:
            c = self.clients.get(engine_idx) or self._client(engine_idx)
            if c is not None:
                self._record(c, scheduler_stats, iteration_stats)
        except Exception as e:
            self._failed("record()", e)

    def record_sleep_state(self, sleep=0, level=0):
        if not self.enabled:
            return
        try:
            if not sleep:
                state = ("running", "resident", "resident")
            elif level == 2:
                state = ("paused", "discarded", "released")
            else:
                state = ("paused", "offloaded", "released")
            self._sleep = state
            for c in self.clients.values():
                c.sleep_state(*state)
        except Exception as e:
            self._failed("record_sleep_state()", e)

    # ---- the mapping -----------------------------------------------------

    def _record(self, c, s, it):
        step = {}
        if s is not None:
            step["running"] = s.num_running_reqs
            step["waiting"] = s.num_waiting_reqs
            step["kv_usage"] = min(max(float(s.kv_cache_usage), 0.0), 1.0)
            pcs = s.prefix_cache_stats
            if pcs is not None:
                step["prefix_queries"] = pcs.queries
                step["prefix_hits"] = pcs.hits
            sd = s.spec_decoding_stats
            if sd is not None:
                step["spec_drafts"] = sd.num_drafts
                step["spec_draft_tokens"] = sd.num_draft_tokens
                step["spec_accepted_tokens"] = sd.num_accepted_tokens
                per_pos = sd.num_accepted_tokens_per_pos
                # STEP carries 64 positions (vLLM proposes a handful).
                if per_pos and len(per_pos) <= _MAX_SPEC_POSITIONS:
                    step["spec_accepted_per_pos"] = per_pos
        if it is None:
            if step:
                c.step(**step)
            return
        step["prompt_tokens"] = it.num_prompt_tokens
        step["generation_tokens"] = it.num_generation_tokens
        c.step(**step)
        ttft = self._all_ns(it.time_to_first_tokens_iter)
        itl = self._all_ns(it.inter_token_latencies_iter)
        c.latencies(ttft, itl, prompt_tokens=it.num_prompt_tokens,
                    generation_tokens=it.num_generation_tokens,
                    preemptions=it.num_preempted_reqs)
        finished = it.finished_requests
        n_params = it.n_params_iter
        max_gen = it.max_num_generation_tokens_iter
        if len(n_params) > len(finished) or len(max_gen) > len(finished):
            self.group_figures_dropped += max(len(n_params), len(max_gen)) \
                - len(finished)
        for i, f in enumerate(finished):
            reason = str(f.finish_reason)
            if reason not in _REASONS:
                self.reasons_dropped += 1
                continue
            prompt = f.num_prompt_tokens
            cached = getattr(f, "num_cached_tokens", None)
            if cached is not None and not 0 <= cached <= prompt:
                cached = None
            c.request_summary(
                reason, prompt_tokens=prompt,
                generation_tokens=f.num_generation_tokens,
                cached_tokens=cached,
                max_tokens=f.max_tokens_param or None,
                n=n_params[i] if i < len(n_params) else None,
                max_generation_tokens=max_gen[i] if i < len(max_gen)
                else None,
                e2e_ns=self._one_ns(f.e2e_latency),
                queue_ns=self._one_ns(f.queued_time),
                prefill_ns=self._one_ns(f.prefill_time),
                decode_ns=self._one_ns(f.decode_time),
                inference_ns=self._one_ns(f.inference_time),
                tpot_ns=self._one_ns(f.mean_time_per_output_token))

    def _one_ns(self, seconds):
        ns = _ns(seconds)
        if ns is None:
            self.durations_dropped += 1
        return ns

    def _all_ns(self, values):
        out = [round(v * _NS) for v in values]
        if out and (min(out) < 0 or max(out) > _MAX_NS):
            kept = [v for v in out if 0 <= v <= _MAX_NS]
            self.durations_dropped += len(out) - len(kept)
            return kept
        return out
