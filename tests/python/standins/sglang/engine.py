"""The stand-in SGLang server: request lifecycles replayed through SGLang's
request bookkeeping, writing its metrics file (exporter.py) and feeding its
own Prometheus collector (collector.py) side by side.

The lifecycles are the reference engine's (tokenmeter-engine, a real
continuous-batching scheduler with a prefix cache, preemption and a model
on the CPU): capture_reference_engine() runs it against a socket that
records its events instead of a daemon, and each request's ARRIVED,
QUEUED, SCHEDULED (with its cached prompt tokens), TOKENS, PREEMPTED and
FINISHED times become SGLang's stage times. What the reference engine does
not do is added with a fixed seed: streamed and non-streamed requests,
client aborts (in the queue and while decoding), requests with
log_metrics false.

SGLang's clocks and rules, from reading sgl-project/sglang main 8905cbd
(after v0.5.15), no code copied:

* every stage time is a time.perf_counter() reading (CLOCK_MONOTONIC here,
  as on Linux), made Unix time by adding a calibrated time.time() -
  perf_counter() offset (observability/req_time_stats.py);
* the scheduler keeps wait_queue_entry_time (moved to the re-entry on a
  retraction), forward_entry_time (the first only), prefill_finished_time;
  it observes queue_time_seconds at the first forward entry; its meta_info
  gives forward_entry_time, prefill_finished_time (Unix), queue_time =
  forward entry - the last waiting-queue entry (negative after a
  retraction), prefill_waiting_latency, prefill_launch_latency;
* the scheduler sends a request's output every step when it is streamed,
  every 50 tokens otherwise (SGLANG_FORCE_STREAM_INTERVAL), and when it
  finishes (managers/scheduler_components/output_streamer.py);
* the tokenizer manager (managers/tokenizer_manager.py) sets
  first_token_time at the first output, finished_time at the last (two
  perf_counter() readings, microseconds apart), e2e_latency = finished -
  created, and with --enable-metrics request_received_ts,
  api_server_dispatch_finish_ts, response_sent_to_client_ts (a streamed
  request's first chunk, else the finish), request_finished_ts,
  inference_time = finished - forward entry, decode_throughput =
  completion / (finished - first output); it observes TTFT at the first
  output, ITL at each later one, the finished request at the last;
  abort_request() counts an aborted request.
"""
import collections
import os
import random
import socket
import subprocess
import threading
import time

import msgpack

IPC_S = 0.0003  # scheduler -> detokenizer -> tokenizer manager
TOKENIZE_S = 0.0002
READINGS_S = 2e-6  # between the first_token_time and finished_time readings
FORCE_STREAM_INTERVAL = 50

Timeline = collections.namedtuple(
    "Timeline", "rid arrived prompt max_tokens queued scheduled cached "
    "tokens preempted finished reason")


class _Capture(threading.Thread):
    """A Unix socket that takes one engine connection and decodes its
    frames (docs/protocol.md) instead of a daemon."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.events = []
        self.error = None

    def run(self):
        try:
            conn, _ = self.sock.accept()
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            with conn:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    unpacker.feed(data)
                    for frame in unpacker:
                        if frame[0] == 1:  # BATCH
                            self.events.extend(frame[3])
        except Exception as e:  # reported by capture_reference_engine
            self.error = e
        finally:
            self.sock.close()


def capture_reference_engine(engine, workdir, *args, timeout=120):
    """Runs tokenmeter-engine (path `engine`) with `args` against a
    capturing socket; returns its requests' Timelines, by arrival."""
    path = os.path.join(workdir, "capture.sock")
    cap = _Capture(path)
    cap.start()
    out = subprocess.run(
        [engine, "--metrics-socket", path, "--no-ack", "--quiet", *args],
        capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"tokenmeter-engine exited {out.returncode}: "
                           f"{out.stderr[-2000:]}")
    cap.join(timeout)
    if cap.error is not None or cap.is_alive():
        raise RuntimeError(f"capture failed: {cap.error!r}")
    reqs = collections.OrderedDict()
    for ev in cap.events:
        kind, t = ev[0], ev[1] / 1e9
        if kind in (7, 8, 9, 10, 11):  # not per request
            continue
        rid = ev[2]
        if kind == 1:
            params = ev[4] if len(ev) > 4 and ev[4] else {}
            reqs[rid] = {"arrived": t, "prompt": ev[3],
                         "max_tokens": params.get("max_tokens"),
                         "queued": None, "scheduled": None, "cached": 0,
                         "tokens": [], "preempted": [], "finished": None,
                         "reason": None}
            continue
        r = reqs[rid]
        if kind == 2 and r["queued"] is None:
            r["queued"] = t
        elif kind == 3 and r["scheduled"] is None:
            r["scheduled"] = t
            if len(ev) > 3 and ev[3]:
                r["cached"] = ev[3].get("cached_tokens", 0)
        elif kind == 4:
            r["tokens"].append((t, ev[3]))
        elif kind == 5:
            r["finished"], r["reason"] = t, ev[3]
        elif kind == 6:
            r["preempted"].append(t)
    out = []
    for rid, r in reqs.items():
        assert r["finished"] is not None, f"request {rid} never finished"
        out.append(Timeline(rid=rid, queued=r["queued"] or r["arrived"],
                            **{k: v for k, v in r.items() if k != "queued"}))
    return out


def scaled(timelines, scale, end=None):
    """The timelines slowed down `scale` times about their last finish,
    which is put at `end` (default: now on CLOCK_MONOTONIC): the reference
    engine's tiny model on the CPU takes well under a millisecond a step,
    a GPU serving a real model tens of milliseconds; the order of events,
    the batching, queueing and preemptions stay the engine's."""
    end = time.monotonic() if end is None else end
    last = max(tl.finished for tl in timelines)

    def f(t):
        return end - (last - t) * scale
    return [tl._replace(
        arrived=f(tl.arrived), queued=f(tl.queued),
        scheduled=None if tl.scheduled is None else f(tl.scheduled),
        tokens=[(f(t), n) for t, n in tl.tokens],
        preempted=[f(t) for t in tl.preempted], finished=f(tl.finished))
        for tl in timelines]


class StandInServer:
    """One SGLang server: its collector (SGLangCollector) and its metrics
    file (FileExporter). replay() turns Timelines into SGLang requests."""

    def __init__(self, collector, exporter, *, seed=1, stream_share=0.6,
                 abort_every=13, no_log_every=29, health_every=37,
                 enable_metrics=True):
        self.collector = collector
        self.exporter = exporter
        self.rng = random.Random(seed)
        self.stream_share = stream_share
        self.abort_every = abort_every
        self.no_log_every = no_log_every
        self.health_every = health_every
        self.enable_metrics = enable_metrics
        # Unix - perf_counter, as SGLang calibrates it.
        self.diff = time.time() - time.perf_counter()
        self.requests = []  # (obj, out_dict) in finish order
        self.retracted = 0  # finished requests with num_retractions > 0
        self.aborted = 0
        self.sched_aborts = 0

    def _real(self, t):
        return t + self.diff

    def build(self, timelines):
        """Each Timeline as one SGLang request: (finish time, obj,
        out_dict, collector calls). Returns them in finish order."""
        built = []
        for i, tl in enumerate(timelines):
            built.append(self._one(i, tl))
        built.sort(key=lambda b: b[0])
        return built

    def _one(self, i, tl):
        rng = self.rng
        stream = rng.random() < self.stream_share
        log_metrics = not (self.no_log_every and i % self.no_log_every == 7)
        # /health_generate's requests: log_metrics false, never written.
        health = bool(self.health_every and i % self.health_every == 11)
        log_metrics = log_metrics and not health
        created = tl.arrived
        dispatch_finish = created + TOKENIZE_S
        tokens = list(tl.tokens)
        finished_engine = tl.finished
        reason = {"type": tl.reason, "matched": 2} if tl.reason == "stop" \
            else {"type": "length", "length": tl.max_tokens} \
            if tl.reason == "length" else {"type": tl.reason}
        preempted = list(tl.preempted)
        scheduled = tl.scheduled
        client_abort = None
        if self.abort_every and i % self.abort_every == 3:
            # A client abort: in the queue (before the first schedule) or
            # while decoding, after a part of the tokens.
            if i % (2 * self.abort_every) == 3 or len(tokens) < 4:
                at = (tl.queued + (scheduled or tl.queued)) / 2
                tokens, preempted, scheduled = [], [], None
            else:
                keep = rng.randrange(2, len(tokens) - 1)
                at = tokens[keep - 1][0] + 0.0005
                tokens = tokens[:keep]
                preempted = [p for p in preempted if p < at]
            finished_engine = at + 0.001  # the scheduler's next step
            client_abort = at
            reason = {"type": "abort", "message": "Abort before...",
                      "status_code": None, "err_type": None}
        # The scheduler's times.
        wait_entry_first = tl.queued
        wait_entry = max([tl.queued] + preempted)
        forward_entry = scheduled or 0.0
        prefill_finished = tokens[0][0] if tokens else 0.0
        # Outputs reaching the tokenizer manager: (time, completion).
        outputs = []
        done = 0
        for k, (t, n) in enumerate(tokens):
            done += n
            last = k == len(tokens) - 1
            if last and client_abort is None:
                continue  # the finishing output, below
            if stream or done % FORCE_STREAM_INTERVAL == 0:
                outputs.append((t + IPC_S, done))
        outputs.append((finished_engine + IPC_S, done))
        first_output = outputs[0][0]
        finished = outputs[-1][0] + READINGS_S
        completion = done
        calls = []
        if client_abort is not None:
            calls.append(("observe_one_aborted_request",))
        # The scheduler observes it whatever log_metrics says.
        if forward_entry > 0:
            calls.append(("observe_queue_time",
                          forward_entry - wait_entry_first))
        if log_metrics:
            last_t, last_c = None, None
            for k, (t, c) in enumerate(outputs):
                if k == 0:
                    calls.append(("observe_time_to_first_token",
                                  t - created))
                    last_t, last_c = t, c
                elif c > last_c:
                    calls.append(("observe_inter_token_latency",
                                  t - last_t, c - last_c))
                    last_t, last_c = t, c
            calls.append(("observe_one_finished_request", tl.prompt,
                          completion, tl.cached if forward_entry else 0,
                          finished - created))
        rid = f"{i:04x}" + "".join(rng.choice("0123456789abcdef")
                                   for _ in range(28))
        if health:
            rid = "HEALTH_CHECK_" + rid
        obj = {"rid": rid, "session_id": None,
               "text": "Summarize the report. " * (tl.prompt // 5 + 1),
               "input_ids": None, "input_embeds": None, "image_data": None,
               "video_data": None, "audio_data": None, "mm_hashes": None,
               "use_audio_in_video": False,
               "sampling_params": {"max_new_tokens": tl.max_tokens,
                                   "temperature": 0.7},
               "return_logprob": False, "logprob_start_len": -1,
               "top_logprobs_num": 0, "token_ids_logprob": None,
               "return_sampling_mask": None,
               "return_text_in_logprobs": False, "stream": stream,
               "log_metrics": log_metrics, "return_hidden_states": False,
               "return_routed_experts": False, "routed_experts_start_len": 0,
               "return_indexer_topk": False, "modalities": None,
               "lora_path": None, "background": False,
               "require_reasoning": False, "priority": None,
               "no_logs": False, "custom_labels": None,
               "return_bytes": False, "return_entropy": False,
               "return_prompt_token_ids": False,
               "received_time": self._real(created)}
        meta = {"id": rid, "finish_reason": reason,
                "prompt_tokens": tl.prompt, "weight_version": "default",
                "num_retractions": len(preempted)}
        if self.enable_metrics:
            if forward_entry > 0:
                meta["forward_entry_time"] = self._real(forward_entry)
            if prefill_finished > 0:
                meta["prefill_finished_time"] = self._real(prefill_finished)
            meta["queue_time"] = forward_entry - wait_entry
            meta["prefill_waiting_latency"] = 0.00012 if tokens else None
            meta["prefill_launch_latency"] = (
                max(prefill_finished - forward_entry - 0.0002, 0.0)
                if tokens else None)
        meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = completion
        meta["cached_tokens"] = tl.cached if forward_entry else 0
        meta["e2e_latency"] = finished - created
        if self.enable_metrics:
            meta["request_received_ts"] = self._real(created)
            meta["api_server_dispatch_finish_ts"] = self._real(
                dispatch_finish)
            if stream:
                meta["response_sent_to_client_ts"] = self._real(
                    first_output)
            meta["request_finished_ts"] = self._real(finished)
            if forward_entry > 0:
                meta["inference_time"] = finished - forward_entry
            decode = finished - first_output
            if decode > 0 and completion > 0:
                meta["decode_throughput"] = completion / decode
        if not stream:
            meta["response_sent_to_client_ts"] = self._real(finished)
        if client_abort is not None:
            self.aborted += 1
        if log_metrics and preempted:
            self.retracted += 1
        return finished, obj, {"text": "...", "output_ids": [],
                               "meta_info": meta}, calls

    def run(self, built, pause_at=None, pause=None, on_written=None):
        """Feeds the collector and writes the file for `built` (from
        build()), in finish order. pause(i) is called in the middle of
        record pause_at's line; on_written(i) after each record."""
        for i, (_, obj, out, calls) in enumerate(built):
            for call in calls:
                getattr(self.collector, call[0])(*call[1:])
            self.exporter.write_record(
                obj, out, pause=(lambda: pause(i)) if i == pause_at else None)
            if on_written is not None:
                on_written(i)


def summary_stats(built):
    """Counts of the built requests the tests check the follower against:
    records (written), logged (log_metrics true), health (not written),
    queue_observed_not_sent (a queue time SGLang's scheduler observed that
    no record can give: health checks, log_metrics false, and a retracted
    request's negative queue_time), aborts (finished as abort)."""
    c = collections.Counter()
    for _, obj, out, calls in built:
        m = out["meta_info"]
        queue_observed = any(k[0] == "observe_queue_time" for k in calls)
        if obj["rid"].startswith("HEALTH_CHECK"):
            c["health"] += 1
            c["queue_observed_not_sent"] += queue_observed
            continue
        c["records"] += 1
        c["logged"] += obj["log_metrics"]
        if queue_observed and not (obj["log_metrics"]
                                   and m.get("queue_time", -1) >= 0):
            c["queue_observed_not_sent"] += 1
        if m["finish_reason"]["type"] == "abort" and obj["log_metrics"]:
            c["aborts"] += 1
    return c
