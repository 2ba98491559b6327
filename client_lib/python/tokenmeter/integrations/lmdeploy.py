"""LMDeploy's metrics to tokenmeterd: a stat logger in LMDeploy's own list.

LMDeploy (0.12 and later; checked against 0.14.0, 0.15.0 and 0.16.0) keeps
its stat loggers in one list, made by AsyncEngine._build_stat_loggers()
and shared with lmdeploy.metrics.metrics_processor.metrics_processor,
whose asyncio task calls record_iteration() / record_specdecode() for
every engine output, record_finish() for every finished request, and
(every 10 s, from the API server) record_schedule() and log(). install()
adds a TokenmeterStatLogger to that list for every engine built after it
(and to `engine`, when given), which turns those stats into tokenmeter
events under the `lmdeploy` profile:

    import tokenmeter.integrations.lmdeploy as tm_lmdeploy
    tm_lmdeploy.install()   # before lmdeploy builds its engine

or, for the `lmdeploy` command, the launcher (it installs, then runs
LMDeploy's own CLI with the arguments given):

    python3 -m tokenmeter.integrations.lmdeploy serve api_server MODEL

LMDeploy has no plugin or environment hook of its own that would load
this module, hence the call or the launcher.

Clocks: LMDeploy's stamps are wall-clock (time.time(), float seconds);
tokenmeter's events carry CLOCK_MONOTONIC. WallClock converts with an
offset measured by bracketed reads (the tightest of five), measured again
every `resync_s` (10 s) of use; the error of a converted stamp is half
that bracket (about 90 ns) plus half an ulp of LMDeploy's float (119 ns),
between wall-clock steps. Only an event's time stamp is converted:
every duration tokenmeterd observes (TTFT, ITL, TPOT, queue, prefill,
decode, inference, e2e) is LMDeploy's own figure, a difference of its
wall-clock stamps, passed through unchanged in nanoseconds.

The logger never raises into LMDeploy and never blocks: each call catches
every Exception, counts it (`errors`, by method) and logs the first once;
a daemon that is down only makes the client count drops.
docs/integrations.md ("LMDeploy") has the whole story.
"""
import json
import logging
import os
import sys
import threading
import time

import tokenmeter

__all__ = ["TokenmeterStatLogger", "WallClock", "install", "uninstall",
           "loggers", "OPTIONS_VAR"]

_log = logging.getLogger("tokenmeter.integrations.lmdeploy")

# The launcher's options, for the processes LMDeploy spawns (--dp > 1).
OPTIONS_VAR = "TOKENMETER_LMDEPLOY_OPTIONS"

_NS_PER_S = 1_000_000_000
# LMDeploy's request-level finish reason (ResponseType member names) to
# tokenmeter's. Only FINISH reaches record_finish() in LMDeploy 0.16.0;
# the others are here for a later LMDeploy that reports them too.
_REASONS = {"FINISH": "stop", "CANCEL": "abort"}


class WallClock:
    """Converts LMDeploy's wall-clock stamps to CLOCK_MONOTONIC ns.

    offset = CLOCK_REALTIME - CLOCK_MONOTONIC, read as wall between two
    monotonic reads; of `tries` such brackets the narrowest is kept, and
    its half-width is the error of the offset (`bound_ns`). The two clocks
    run at the same rate (NTP's slewing applies to both), so the offset
    changes only when the wall clock is stepped (settimeofday, an NTP
    step, a leap second); a measurement every `resync_s` of use notices a
    step (`steps` counts those over 1 ms) and takes the new offset.
    Not thread-safe: one per logger, used from LMDeploy's metrics task.
    """

    STEP_NS = 1_000_000

    def __init__(self, resync_s=10.0, tries=5, wall_ns=time.time_ns,
                 mono_ns=time.monotonic_ns):
        if not resync_s > 0:
            raise ValueError("resync_s must be > 0")
        if tries < 1:
            raise ValueError("tries must be >= 1")
        self._resync_ns = int(resync_s * _NS_PER_S)
        self._tries = int(tries)
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self.offset_ns = 0
        self.bound_ns = 0
        self.syncs = 0
        self.steps = 0
        self.sync()

    def sync(self):
        """Measures the offset now; returns (offset_ns, bound_ns)."""
        best = None
        for _ in range(self._tries):
            m0 = self._mono_ns()
            w = self._wall_ns()
            m1 = self._mono_ns()
            if best is None or m1 - m0 < best[0]:
                best = (m1 - m0, w - (m0 + m1) // 2, m1)
        width, offset, at = best
        if self.syncs and abs(offset - self.offset_ns) > self.STEP_NS:
            self.steps += 1
            if self.steps == 1:
                _log.info("the wall clock was stepped by %.3f ms; "
                          "LMDeploy's stamps are converted with the new "
                          "offset from now on",
                          (offset - self.offset_ns) / 1e6)
        self.offset_ns = offset
        self.bound_ns = (width + 1) // 2
        self._next_sync_ns = at + self._resync_ns
        # The anchor: a whole second of wall time near now, exact as a
        # float, and its monotonic ns. A stamp minus the anchor is exact
        # (two doubles within a factor of 2 of each other), so the
        # conversion rounds only once, to the nanosecond.
        whole = (at + offset) // _NS_PER_S  # wall seconds at `at`
        self._anchor_s = float(whole)
        self._anchor_ns = whole * _NS_PER_S - offset
        self.syncs += 1
        return offset, self.bound_ns

    def to_mono_ns(self, wall_s):
        """LMDeploy's wall-clock seconds (time.time()) to CLOCK_MONOTONIC
        ns, re-measuring the offset first when resync_s has passed: a
        monotonic read and one rounding."""
        if self._mono_ns() >= self._next_sync_ns:
            self.sync()
        return self._anchor_ns + round((wall_s - self._anchor_s) * 1e9)


# tokenmeter's largest duration (protocol 1.3: 2^48 - 1 ns, 78 hours).
_MAX_DURATION_NS = (1 << 48) - 1
_MAX_DURATION_S = _MAX_DURATION_NS / 1e9


def _duration_ns(seconds):
    """LMDeploy's interval in float seconds to ns, or None when it is not a
    non-negative figure tokenmeter can carry (NaN, negative, over 78 h)."""
    if seconds is None or not 0 <= seconds <= _MAX_DURATION_S:
        return None
    return round(seconds * 1e9)


class TokenmeterStatLogger:
    """One LMDeploy stat logger that sends to tokenmeterd.

    Duck-types LMDeploy's StatLoggerBase (record_schedule,
    record_iteration, record_specdecode, record_finish, log) so that this
    module imports without LMDeploy. `client` is a tokenmeter.Client (its
    HELLO: engine "lmdeploy", profile "lmdeploy"); the logger owns it and
    close() closes it. Calls come from LMDeploy's one metrics task; each
    costs one tokenmeter event call at most (see docs/performance.md).

    What each call sends (docs/integrations.md has the table):
    * record_iteration(IterationStats): one LATENCIES at
      iteration_timestamp: LMDeploy's ttft or itl, when LMDeploy itself
      would observe it (truthy), and the output's prompt and new
      generation tokens (tokenmeterd's lmdeploy profile takes LMDeploy's
      tpot, itl / new tokens, and iteration tokens from these);
    * record_specdecode(SpeculativeDecodingStats): one STEP with the spec
      counts, when num_drafts > 0;
    * record_finish(RequestStats): one REQUEST_SUMMARY at finish_time with
      the reason, token counts, cached tokens and LMDeploy's queue,
      prefill, decode, inference and e2e intervals;
    * record_schedule(SchedulerStats): one STEP with running, waiting and
      KV usage;
    * log(): nothing is sent.
    An interval LMDeploy computed from a time it never set (0.0) or that
    is negative is not sent (LMDeploy would observe it as it is): counted
    in `skipped`.
    """

    def __init__(self, client, clock=None):
        self.client = client
        self.clock = clock if clock is not None else WallClock()
        self.errors = {}
        self.skipped = 0
        self._logged = False

    # -- LMDeploy's interface -------------------------------------------

    def record_schedule(self, stats):
        try:
            kv = float(stats.gpu_cache_usage)
            self.client.step(running=int(stats.num_running_reqs),
                             waiting=int(stats.num_waiting_reqs),
                             kv_usage=min(max(kv, 0.0), 1.0))
        except Exception as e:  # noqa: BLE001 (never into LMDeploy)
            self._failed("record_schedule", e)

    def record_iteration(self, stats):
        try:
            t = self.clock.to_mono_ns(stats.iteration_timestamp)
            # LMDeploy observes a latency only when it is truthy (its first
            # output has a ttft, the others an itl). Its tpot is itl / new
            # tokens: tokenmeterd's lmdeploy profile computes it so from
            # this one ITL and the generation count.
            ttft = itl = ()
            x = stats.ttft
            if x:
                if 0.0 <= x <= _MAX_DURATION_S:
                    ttft = (round(x * 1e9),)
                else:
                    self.skipped += 1
            x = stats.itl
            if x:
                if 0.0 <= x <= _MAX_DURATION_S:
                    itl = (round(x * 1e9),)
                else:
                    self.skipped += 1
            self.client.latencies(
                ttft, itl, t, prompt_tokens=stats.prompt_tokens,
                generation_tokens=stats.new_generation_tokens)
        except Exception as e:  # noqa: BLE001
            self._failed("record_iteration", e)

    def record_specdecode(self, stats):
        try:
            if stats.num_drafts <= 0:
                return
            per_pos = stats.num_accepted_tokens_per_pos
            if per_pos is not None:
                # LMDeploy's is a numpy array of floats: tolist() is the
                # cheap way to Python numbers.
                tolist = getattr(per_pos, "tolist", None)
                per_pos = [int(n) for n in (per_pos if tolist is None
                                            else tolist())]
            self.client.step(
                spec_drafts=int(stats.num_drafts),
                spec_draft_tokens=int(stats.num_draft_tokens),
                spec_accepted_tokens=int(stats.num_accepted_tokens),
                spec_accepted_per_pos=per_pos)
        except Exception as e:  # noqa: BLE001
            self._failed("record_specdecode", e)

    def record_finish(self, stats):
        try:
            reason = stats.finish_reason
            # None: a FINISH output without tokens (LMDeploy 0.16.0 sets
            # the reason only with tokens); record_finish runs for FINISH.
            name = "FINISH" if reason is None else getattr(reason, "name",
                                                           str(reason))
            arrival = stats.arrival_time
            queued = stats.queued_time
            scheduled = stats.scheduled_time
            first = stats.first_token_time
            finish = stats.finish_time
            prompt = int(stats.prompt_tokens)
            cached = getattr(stats, "cached_tokens", None)  # 0.14.0 on
            if cached is not None:
                cached = int(cached)
                if not 0 <= cached <= prompt:  # tokenmeter's rule
                    cached = None
                    self.skipped += 1
            self.client.request_summary(
                _REASONS.get(name, "error"),
                prompt_tokens=prompt,
                generation_tokens=int(stats.generation_tokens),
                cached_tokens=cached,
                queue_ns=self._interval(queued, scheduled),
                prefill_ns=self._interval(scheduled, first),
                decode_ns=self._interval(first, finish),
                inference_ns=self._interval(scheduled, finish),
                e2e_ns=self._interval(arrival, finish),
                t_ns=(self.clock.to_mono_ns(finish) if finish
                      else tokenmeter.now_ns()))
        except Exception as e:  # noqa: BLE001
            self._failed("record_finish", e)

    def log(self):
        pass

    # -- tokenmeter's side ----------------------------------------------

    def close(self):
        """Closes the client (flushes for up to its close timeout)."""
        return self.client.close()

    def stats(self):
        """The client's counters (tokenmeter.Stats) plus this logger's:
        a dict with 'client', 'errors' (by method), 'skipped',
        'clock_syncs', 'clock_steps', 'clock_bound_ns'."""
        return {"client": self.client.stats(), "errors": dict(self.errors),
                "skipped": self.skipped, "clock_syncs": self.clock.syncs,
                "clock_steps": self.clock.steps,
                "clock_bound_ns": self.clock.bound_ns}

    def _interval(self, start, end):
        """end - start as LMDeploy computes it, in ns; None (not sent) when
        a time is unset (0.0) or the difference is negative."""
        if not start or not end:
            self.skipped += 1
            return None
        ns = _duration_ns(end - start)
        if ns is None:
            self.skipped += 1
        return ns

    def _failed(self, method, error):
        self.errors[method] = self.errors.get(method, 0) + 1
        if not self._logged:
            self._logged = True
            _log.warning("tokenmeter's LMDeploy logger: %s failed (%r); "
                         "counted, and not logged again", method, error,
                         exc_info=error)


# -- install --------------------------------------------------------------

_lock = threading.Lock()
_options = {}
_original = None      # AsyncEngine._build_stat_loggers before install()
_engine_class = None
_loggers = []         # the TokenmeterStatLoggers this module added
_warned = set()


def loggers():
    """The TokenmeterStatLoggers install() added, oldest first."""
    with _lock:
        return list(_loggers)


def _warn_once(key, msg, *args):
    if key not in _warned:
        _warned.add(key)
        _log.warning(msg, *args)


def _client_for(engine, options):
    backend_config = getattr(engine, "backend_config", None)
    dp_rank = 0
    if getattr(engine, "backend", None) == "pytorch":
        dp_rank = int(getattr(backend_config, "dp_rank", 0) or 0)
    kwargs = dict(options.get("client_options", {}))
    if options.get("socket_path") is not None:
        kwargs["socket_path"] = options["socket_path"]
    if options.get("labels"):
        kwargs["labels"] = options["labels"]
    return tokenmeter.Client(model=str(engine.model_name), engine="lmdeploy",
                             instance=str(dp_rank), profile="lmdeploy",
                             **kwargs)


def _attach(engine, options):
    """Adds a TokenmeterStatLogger to `engine`'s loggers (the list
    metrics_processor holds), once; returns it, or None when LMDeploy's
    metrics are off for this engine."""
    from lmdeploy.metrics.metrics_processor import metrics_processor

    lst = getattr(engine, "stat_loggers", None)
    if not lst:
        _warn_once("off", "LMDeploy's metrics are off for this engine "
                   "(--disable-metrics or enable_metrics=False): nothing "
                   "reaches tokenmeterd")
        return None
    for lg in lst:
        if isinstance(lg, TokenmeterStatLogger):
            return lg
    lg = TokenmeterStatLogger(_client_for(engine, options),
                              WallClock(resync_s=options.get("resync_s",
                                                             10.0)))
    if options.get("replace_prometheus"):
        # In place: metrics_processor holds this very list.
        lst[:] = [x for x in lst
                  if type(x).__name__ != "PrometheusStatLogger"]
    lst.append(lg)
    if metrics_processor.stat_loggers is not lst:
        # LMDeploy's one processor calls the last engine's loggers.
        _warn_once("not-shared", "tokenmeter's LMDeploy logger was added to "
                   "an engine whose loggers metrics_processor does not call "
                   "(an engine was built after it)")
    with _lock:
        _loggers.append(lg)
    return lg


def _hooked_build_stat_loggers(self, *args, **kwargs):
    _original(self, *args, **kwargs)
    try:
        _attach(self, _options)
    except Exception as e:  # noqa: BLE001 (never into LMDeploy)
        _warn_once("attach", "tokenmeter's LMDeploy logger was not added: "
                   "%r", e)


def install(engine=None, *, socket_path=None, labels=None,
            replace_prometheus=False, resync_s=10.0, **client_options):
    """Makes every LMDeploy engine built from now on report to tokenmeterd,
    and `engine` (an AsyncEngine already built) too.

    socket_path, labels and client_options go to tokenmeter.Client (model:
    the engine's model_name; engine label: its dp_rank, as LMDeploy's own
    series). replace_prometheus=True also takes LMDeploy's
    PrometheusStatLogger out of the list (its /metrics then shows its
    series, never updated), leaving tokenmeterd to serve them.
    Raises ImportError without LMDeploy (0.12 or later), and what
    tokenmeter.Client raises for bad options when `engine` is given;
    engines built later never see an error from here (it is logged once).
    Calling it again replaces the options for engines built later.
    Returns the logger added to `engine`, or None.
    """
    global _original, _engine_class, _options
    from lmdeploy.serve.core.async_engine import AsyncEngine

    options = {"socket_path": socket_path, "labels": labels,
               "replace_prometheus": bool(replace_prometheus),
               "resync_s": float(resync_s),
               "client_options": client_options}
    with _lock:
        _options = options
        if _original is None:
            _original = AsyncEngine._build_stat_loggers
            _engine_class = AsyncEngine
            AsyncEngine._build_stat_loggers = _hooked_build_stat_loggers
    if engine is not None:
        return _attach(engine, options)
    return None


def uninstall():
    """Undoes install(): engines built later get LMDeploy's loggers only;
    every logger added is taken out of its list and its client closed."""
    global _original, _engine_class
    try:
        from lmdeploy.metrics.metrics_processor import metrics_processor
        shared = metrics_processor.stat_loggers
    except ImportError:
        shared = []
    with _lock:
        if _original is not None:
            _engine_class._build_stat_loggers = _original
            _original = _engine_class = None
        added, _loggers[:] = list(_loggers), []
    for lg in added:
        while lg in shared:
            shared.remove(lg)
        lg.close()


# -- the launcher -----------------------------------------------------------

USAGE = """\
usage: python3 -m tokenmeter.integrations.lmdeploy [--socket PATH]
           [--label NAME=VALUE]... [--replace-prometheus] LMDEPLOY-ARGS...
       python3 -m tokenmeter.integrations.lmdeploy --clock

Runs LMDeploy's command line (`lmdeploy LMDEPLOY-ARGS...`, e.g. `serve
api_server MODEL`) with tokenmeter's logger installed in every engine it
builds, the servers it spawns (--dp) included. --clock prints the
wall-to-monotonic offset and its error bound on this machine."""


def _parse(argv):
    opts = {"socket_path": None, "labels": {}, "replace_prometheus": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--socket" and i + 1 < len(argv):
            opts["socket_path"] = argv[i + 1]
            i += 2
        elif a == "--label" and i + 1 < len(argv) and "=" in argv[i + 1]:
            k, v = argv[i + 1].split("=", 1)
            opts["labels"][k] = v
            i += 2
        elif a == "--replace-prometheus":
            opts["replace_prometheus"] = True
            i += 1
        elif a == "--":
            i += 1
            break
        else:
            break
    return opts, argv[i:]


def _install_from_env():
    raw = os.environ.get(OPTIONS_VAR)
    if not raw:
        return
    try:
        opts = json.loads(raw)
        install(socket_path=opts.get("socket_path"),
                labels=opts.get("labels") or None,
                replace_prometheus=opts.get("replace_prometheus", False))
    except Exception as e:  # noqa: BLE001 (a spawned server goes on)
        _log.warning("tokenmeter's LMDeploy logger not installed: %r", e)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"], []):
        print(USAGE)
        return 0 if argv else 2
    if argv == ["--clock"]:
        c = WallClock(tries=5)
        print(f"offset {c.offset_ns} ns (CLOCK_REALTIME - CLOCK_MONOTONIC), "
              f"bound +-{c.bound_ns} ns (half the narrowest of 5 bracketed "
              "reads)")
        return 0
    opts, rest = _parse(argv)
    if not rest:
        print(USAGE, file=sys.stderr)
        return 2
    # Servers LMDeploy spawns import this module again as __mp_main__
    # (multiprocessing's spawn re-runs the main module) and install from
    # the environment.
    os.environ[OPTIONS_VAR] = json.dumps(opts)
    _canonical()._install_from_env()
    from lmdeploy.cli import run
    sys.argv = ["lmdeploy"] + rest
    return run()


def _canonical():
    """This module under its package name (run with -m, it is __main__ or
    __mp_main__ too): the one whose state install() and loggers() keep."""
    import tokenmeter.integrations.lmdeploy as canonical
    return canonical


if __name__ == "__mp_main__":
    _canonical()._install_from_env()
elif __name__ == "__main__":
    sys.exit(main())
