"""tokenmeter-sglang: SGLang's per-request metrics file, followed into
tokenmeterd.

SGLang has no plugin API for metrics. Started with
``--export-metrics-to-file --export-metrics-to-file-dir DIR``, it appends one
JSON object a line for every finished request to
``DIR/sglang-request-metrics-YYYYMMDD_HH.log`` (the hour in the server's
local time: a new file every hour, none renamed, none deleted), from
``FileRequestMetricsExporter`` in
``python/sglang/srt/observability/request_metrics_exporter.py`` (read at
sgl-project/sglang main 8905cbd, July 2026, after v0.5.15; the format has
been the same since ba6b501, March 2026). A line is
``{"request_parameters": "<the request, JSON in a string>", **meta_info}``
where meta_info is what the tokenizer manager returns to the client
(``python/sglang/srt/managers/tokenizer_manager.py``): ``id``,
``finish_reason`` ({"type": "stop" | "length" | "abort", ...}),
``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``e2e_latency`` (seconds, ``time.perf_counter`` differences) and, when the
server runs with ``--enable-metrics``, the stage times of
``python/sglang/srt/observability/req_time_stats.py``: ``queue_time``
(s), ``forward_entry_time`` and ``prefill_finished_time`` (Unix seconds),
``request_received_ts``, ``request_finished_ts`` and
``response_sent_to_client_ts`` (Unix seconds: perf_counter readings plus a
calibrated time.time() - perf_counter() offset), ``inference_time`` (s) and
``decode_throughput`` (completion tokens / (finish - first output), 1/s).

This follower reads those lines as ``tail -F`` does and sends each record
as one protocol 1.3 REQUEST_SUMMARY (a finished request with the durations
SGLang computed; no per-token timeline, which the file does not have), on
a connection whose HELLO says engine "sglang", profile "sglang". See
docs/integrations.md ("SGLang") for what each series gets and what
differs from SGLang's own /metrics.

    tokenmeter-sglang --model Qwen/Qwen2.5-7B-Instruct /var/log/sglang-metrics

Delivery: a record counts as handled once the library accepted its event;
the position (``--state``) is saved only after a flush that wrote every
event to the daemon. While the daemon is away the follower stops reading
(the file is the buffer), so nothing is dropped; what the library holds
unacknowledged is replayed on reconnect. A follower killed between a send
and the next save sends those records again on restart (at most one poll's
worth); a clean stop (SIGTERM, SIGINT, --once) saves after the last flush.
"""
import argparse
import hashlib
import json
import os
import re
import signal
import stat
import sys
import time

FILE_RE = re.compile(r"^sglang-request-metrics-\d{8}_\d{2}\.log$")
# Bytes read at a time (at least as many as are held, so that a long line
# costs O(its length)). A bigger read is slower: an allocation of a MiB or
# more is mmap()ed and faulted in anew each time.
CHUNK_BYTES = 1 << 18
MAX_LINE_BYTES = 64 << 20  # a request's prompt is in the line; longer: skipped
STATE_VERSION = 1
# The daemon skips an event more than an hour old (docs/protocol.md,
# bad_timestamp): a record whose finish is older than this is sent with the
# time it is read instead (a backfill: its series count it now).
BACKFILL_AFTER_NS = 50 * 60 * 10**9
# A file other than the newest, fully read and unchanged for this long, is
# closed: SGLang appends to an older hour's file only for a record whose
# hour was taken just before the hour turned.
CLOSE_AFTER_S = 120.0
# Files open at once in directory mode (a backfill of many hours reads them
# a few at a time).
MAX_OPEN_FILES = 16
# In single-file mode, how long the rest of a renamed file may stay an
# incomplete line before it is counted as malformed.
ROTATE_GRACE_S = 5.0
_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
_PROG = "tokenmeter-sglang"


def log(msg):
    print(f"{_PROG}: {msg}", file=sys.stderr, flush=True)


class Malformed(ValueError):
    """A line that is no SGLang request-metrics record."""


_INF = float("inf")
# SGLang's line: json.dump({"request_parameters": json.dumps(params),
# **meta_info}) with the default separators. The parameters (the prompt
# text in them) are most of the line and none of what is needed, so the
# fast path does not decode them: inside that JSON string every quote is
# escaped, so the first '}", "' ends it (params is a dict: its text ends
# with '}'), and the rest, from '"id"' on, is a small JSON object.
_HEAD = b'{"request_parameters": "'
_PARAMS_END = b'}", "'
# '"log_metrics": ' of the parameters, as it is inside that string (a
# prompt's own '"log_metrics": ' is escaped once more: no match). The key
# is always there (a bool), after the prompt text: looked for from the end.
_LOG_METRICS = b'\\"log_metrics\\": '


def _seconds_ns(x):
    """A duration in seconds as ns, or None when it is no finite value >= 0
    (SGLang writes None or a negative number for a stage that did not
    happen, e.g. queue_time of a request aborted in the queue)."""
    if (type(x) is float or type(x) is int) and 0 <= x < _INF:
        return int(x * 1e9 + 0.5)
    return None


def _bad(key, value, what):
    raise Malformed(f"{key} is {value!r}, {what}")


class Summary:
    """What one record gives: the request_summary() arguments, the finish
    time (Unix seconds, or None) and the speculative-decoding counts."""
    __slots__ = ("kwargs", "finished_ts", "spec")

    def __init__(self, kwargs, finished_ts, spec):
        self.kwargs = kwargs
        self.finished_ts = finished_ts
        self.spec = spec


_scan = json.JSONDecoder().scan_once  # (str, index) -> (value, end)


def _loads(text):
    """bytes -> a dict; Malformed if it is no JSON object. The decoder's
    scanner itself (json.loads() would look for the text's encoding and
    skip whitespace with regular expressions first)."""
    try:
        s = text.decode()
        rec, end = _scan(s, 0)
        if end != len(s):
            raise ValueError(f"extra data at {end}")
    except (StopIteration, ValueError, UnicodeDecodeError) as e:
        what = "nothing" if isinstance(e, StopIteration) else str(e)
        raise Malformed(f"not JSON ({what})") from None
    if type(rec) is not dict:
        raise Malformed(f"a JSON {type(rec).__name__}, not an object")
    return rec


def _log_metrics(params_json):
    """False when the request's parameters (their JSON text) say
    log_metrics false."""
    try:
        params = json.loads(params_json)
    except ValueError:
        params = None
    if type(params) is not dict:
        raise Malformed("request_parameters is no JSON object")
    return params.get("log_metrics") is not False


def parse_line(line):
    """A line's bytes (no newline) -> (the record dict, log_metrics); the
    dict may lack request_parameters (not decoded). Malformed if the line
    is no JSON object."""
    end = line.find(_PARAMS_END, len(_HEAD)) if line.startswith(_HEAD) \
        else -1
    if end < 0:  # not SGLang's layout: decode all of it
        rec = _loads(line)
        params = rec.get("request_parameters")
        if type(params) is str and '"log_metrics": false' in params:
            return rec, _log_metrics(params)
        return rec, True
    rec = _loads(b"{" + line[end + 4:])
    k = line.rfind(_LOG_METRICS, len(_HEAD), end)
    if k >= 0 and line.startswith(b"false", k + len(_LOG_METRICS)):
        quoted = line[len(_HEAD) - 1:end + 2]  # the JSON string, quotes too
        return rec, _log_metrics(_loads(b'{"p": ' + quoted + b"}")["p"])
    return rec, True


def summarize(rec, log_metrics=True, max_rid_bytes=128):
    """The Summary of one record, or None when SGLang itself would not
    observe the request (log_metrics false). Malformed when a required key
    is missing or of the wrong type."""
    if not log_metrics:
        return None
    get = rec.get
    fr = get("finish_reason")
    reason = fr.get("type") if type(fr) is dict else None
    if type(reason) is not str:
        _bad("finish_reason", fr, "not SGLang's {\"type\": ...}")
    reason = _REASONS.get(reason, "error")
    prompt = get("prompt_tokens")
    if type(prompt) is not int or prompt < 0:
        _bad("prompt_tokens", prompt, "not a count")
    completion = get("completion_tokens", 0)  # none: an embedding
    if type(completion) is not int or completion < 0:
        _bad("completion_tokens", completion, "not a count")
    e2e = get("e2e_latency")
    e2e_ns = _seconds_ns(e2e)
    if e2e_ns is None:
        _bad("e2e_latency", e2e, "not a duration")
    kw = {"reason": reason, "prompt_tokens": prompt,
          "generation_tokens": completion, "e2e_ns": e2e_ns}
    cached = get("cached_tokens")
    if cached is not None:
        if type(cached) is not int or not 0 <= cached <= prompt:
            _bad("cached_tokens", cached,
                 f"not a count up to prompt_tokens {prompt}")
        kw["cached_tokens"] = cached
    # Time to first token, as SGLang's collector observes it (first output
    # - received): decode_throughput = completion / (finish - first output),
    # so first output - received = e2e - completion / decode_throughput
    # (exact up to float rounding, ~1e-15 relative). With --enable-metrics
    # and no decode_throughput the first output was the last one (no
    # completion tokens, or finish = first output): TTFT = e2e, within the
    # microseconds between SGLang's two perf_counter() readings. Without
    # --enable-metrics the file has no stage times and TTFT is unknown.
    # Before SGLang #19984 (7a12255, March 2026) decode_throughput of a
    # request whose first output was its last divided by the finish time
    # itself: a "decode" longer than e2e means that case, TTFT = e2e.
    finished = get("request_finished_ts")
    dt = get("decode_throughput")
    if (type(dt) is float or type(dt) is int) and 0 < dt < _INF \
            and completion > 0:
        decode = completion / dt
        kw["ttft_ns"] = int((e2e - decode) * 1e9 + 0.5) \
            if decode <= e2e else e2e_ns
    elif finished is not None or "queue_time" in rec:  # --enable-metrics
        kw["ttft_ns"] = e2e_ns
    # Queue time: the scheduler's forward entry - waiting-queue entry; it
    # observes it only for a request that reached the forward pass.
    if "forward_entry_time" in rec:
        q = _seconds_ns(get("queue_time"))
        if q is not None:
            kw["queue_ns"] = q
    rid = get("id")
    if type(rid) is str and 0 < len(rid) <= max_rid_bytes and \
            len(rid.encode()) <= max_rid_bytes:
        kw["rid"] = rid
    if not ((type(finished) is float or type(finished) is int)
            and 0 < finished < _INF):
        finished = None
    spec = None
    verify = get("spec_verify_ct")
    if type(verify) is int and verify > 0:
        correct = get("spec_num_correct_drafts",
                      get("spec_accepted_drafts"))
        proposed = get("spec_num_proposed_drafts",
                       get("spec_proposed_drafts"))
        if type(correct) is int and type(proposed) is int:
            spec = (verify, proposed, correct)
    return Summary(kw, finished, spec)


class Clock:
    """Unix seconds (SGLang's *_ts keys) -> CLOCK_MONOTONIC ns.

    The offset time.time_ns() - time.monotonic_ns() is read once per poll.
    The error is the change of that offset between SGLang's reading and
    ours: none while the wall clock only runs, at most 500 us per second
    of delay while NTP slews it (the kernel's limit), the size of a step
    when the clock is set. Times ahead of now are clamped to now; times more
    than BACKFILL_AFTER_NS ago become now (the daemon drops events older
    than an hour)."""

    def __init__(self):
        self.refresh()
        self.backfilled = 0

    def refresh(self):
        self.mono_ns = time.monotonic_ns()
        self.offset_ns = time.time_ns() - self.mono_ns

    def monotonic_ns(self, unix_s):
        if unix_s is None:
            return self.mono_ns
        t = int(unix_s * 1e9) - self.offset_ns
        if t > self.mono_ns:
            return self.mono_ns
        if t < self.mono_ns - BACKFILL_AFTER_NS:
            self.backfilled += 1
            return self.mono_ns
        return t


class FileTail:
    """One followed file: the offset of its first unhandled line, the bytes
    read past it, and (known or None) the number of lines before it.

    next_line() returns (line, length) without consuming it; advance()
    consumes it once the caller has handled it, so a record the library
    could not take yet is read again later."""

    HEAD_BYTES = 128

    def __init__(self, path, key, offset=0, ident=None, lineno=0, head=None):
        self.path = path
        self.key = key  # the name in the state: basename (dir) or path
        self.offset = offset
        self.ident = ident  # (st_dev, st_ino) of the file read
        # From a state file: the hash of the file's first bytes, so that a
        # new file that got the old one's inode number is not taken for it.
        self.expect_head = head
        self.lineno = lineno
        self.fd = None
        self.mtime = 0.0
        self.size = offset
        self._buf = b""
        self._start = 0  # _buf[_start:] lies at self.offset
        self._skipping = False  # inside a line over MAX_LINE_BYTES
        self.malformed = 0

    # -- the descriptor -----------------------------------------------------
    def open(self):
        """Opens self.path; False when it is not there (or not a file)."""
        if self.fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:  # EACCES, EMFILE, ...: tried again next poll
            log(f"{self.path}: {e.strerror}")
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return False
        ident = (st.st_dev, st.st_ino)
        self.fd = fd
        if self.ident is not None and (ident != self.ident or (
                self.expect_head is not None
                and self.head() != self.expect_head)):
            # Another file under the name: it starts at its beginning.
            self._reset(f"{self.path}: another file than the one read "
                        "before; reading it from the start")
        self.expect_head = None
        self.ident = ident
        self.refresh()
        return True

    def head(self):
        """[n, sha1 hex] of the file's first n = min(offset, HEAD_BYTES)
        bytes (those before the position), for the state file."""
        n = min(self.offset, self.HEAD_BYTES)
        data = os.pread(self.fd, n, 0) if self.fd is not None else b""
        return [len(data), hashlib.sha1(data).hexdigest()]

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def refresh(self):
        """fstat: notes the size and mtime; a file shorter than what was
        read was truncated: reading starts again at 0."""
        st = os.fstat(self.fd)
        self.mtime = st.st_mtime
        self.size = st.st_size
        read_to = self.offset + self.pending()
        if st.st_size < read_to:
            self._reset(f"{self.path}: truncated to {st.st_size} bytes "
                        f"(was read to {read_to}); reading it from the "
                        "start")

    def _reset(self, why):
        log(why)
        self.offset = 0
        self.lineno = 0
        self._buf = b""
        self._start = 0
        self._skipping = False

    # -- lines ----------------------------------------------------------------
    def pending(self):
        """Bytes read but not consumed (an incomplete last line)."""
        return len(self._buf) - self._start

    def at_end(self):
        return self.offset + self.pending() >= self.size

    def next_line(self):
        """(line bytes without the newline, bytes to consume) of the next
        complete line, or None. Reads from the descriptor as needed. A line
        over MAX_LINE_BYTES is counted as malformed and skipped without
        being held in memory."""
        while True:
            nl = self._buf.find(b"\n", self._start)
            if nl >= 0:
                if self._skipping:  # the end of an over-long line
                    self._skipping = False
                    self.advance(nl + 1 - self._start)
                    continue
                return self._buf[self._start:nl], nl + 1 - self._start
            if self.fd is None:
                return None
            if self._start:
                self._buf = self._buf[self._start:]
                self._start = 0
            data = os.pread(self.fd, max(CHUNK_BYTES, len(self._buf)),
                            self.offset + len(self._buf))
            if not data:
                return None
            self._buf += data
            self.size = max(self.size, self.offset + len(self._buf))
            if b"\n" in data:
                continue
            if not self._skipping and len(self._buf) > MAX_LINE_BYTES:
                self.note_malformed(f"a line longer than {MAX_LINE_BYTES} "
                                    "bytes")
                self._skipping = True
            if self._skipping:  # forget what is read of it
                self.offset += len(self._buf)
                self._buf = b""

    def advance(self, n):
        self._start += n
        self.offset += n
        if self.lineno is not None:
            self.lineno += 1

    def drop_pending(self):
        """Counts the incomplete rest of a file as one malformed line."""
        if self.pending() and not self._skipping:
            self.note_malformed("an incomplete last line")
        self.offset += self.pending()
        self._buf, self._start, self._skipping = b"", 0, False

    def line_number(self):
        """1-based number of the line at self.offset (counted from the file
        when it is not known, e.g. after --from-end)."""
        if self.lineno is None and self.fd is not None:
            n, pos = 0, 0
            while pos < self.offset:
                data = os.pread(self.fd, min(CHUNK_BYTES, self.offset - pos),
                                pos)
                if not data:
                    break
                n += data.count(b"\n")
                pos += len(data)
            self.lineno = n
        return None if self.lineno is None else self.lineno + 1

    def note_malformed(self, why):
        """Counts a malformed line; the first of each file is logged with
        its file:line."""
        self.malformed += 1
        if self.malformed == 1:
            n = self.line_number()
            where = f"{self.path}:{n}" if n is not None else self.path
            log(f"{where}: skipped: {why} (further malformed lines of this "
                "file are only counted)")

    def start_at_end(self):
        """--from-end: after the last complete line (a record being
        written now is read once complete)."""
        size = self.size
        pos = size
        while pos > 0:
            step = min(CHUNK_BYTES, pos)
            data = os.pread(self.fd, step, pos - step)
            nl = data.rfind(b"\n")
            if nl >= 0:
                pos = pos - step + nl + 1
                break
            pos -= step
        self.offset = pos
        self.lineno = None


class Source:
    """The files to follow: a directory's sglang-request-metrics-*.log in
    name (= hour) order, or one file by path (followed across a rename and
    a new file at the path, like tail -F)."""

    def __init__(self, path, from_end, state):
        self.path = os.path.abspath(path)
        self.is_dir = os.path.isdir(self.path)
        self.tails = {}  # key -> FileTail
        self.closed_through = ""  # dir mode: every name <= this is done
        self._draining = []  # single-file mode: renamed files being drained
        self.malformed_closed = 0  # of the files no longer followed
        self._dir_mtime = None
        self._listed_at = 0.0
        self._names = []
        self._first = True
        self._from_end = from_end and state is None
        if state is not None:
            self._load(state)

    # -- state ----------------------------------------------------------------
    def _load(self, state):
        self.closed_through = state.get("closed_through", "")
        for key, f in state.get("files", {}).items():
            path = os.path.join(self.path, key) if self.is_dir else self.path
            if not self.is_dir and key != self.path:
                continue
            self.tails[key] = FileTail(path, key, f["offset"],
                                       tuple(f["ident"]), f.get("line"),
                                       f.get("head"))

    def state(self):
        files = {}
        for key, t in self.tails.items():
            if t.ident is not None:
                head = t.head() if t.fd is not None else t.expect_head
                files[key] = {"offset": t.offset, "ident": list(t.ident),
                              "line": t.lineno, "head": head}
        return {"version": STATE_VERSION, "source": self.path,
                "closed_through": self.closed_through, "files": files}

    # -- polling ------------------------------------------------------------
    def poll(self):
        """The tails to read now, oldest first (their descriptors open)."""
        if self.is_dir:
            return self._poll_dir()
        return self._poll_file()

    def _poll_dir(self):
        try:
            st = os.stat(self.path)
            now = time.monotonic()
            # Listed again when the directory changed, and every 5 s for a
            # file system with coarse timestamps.
            if st.st_mtime_ns != self._dir_mtime or now - self._listed_at > 5:
                self._dir_mtime = st.st_mtime_ns
                self._listed_at = now
                self._names = sorted(n for n in os.listdir(self.path)
                                     if FILE_RE.match(n))
        except OSError as e:
            log(f"{self.path}: {e.strerror}")
            return []
        names = [n for n in self._names if n > self.closed_through]
        if self._first and self._from_end:
            # The files of past hours, unchanged for CLOSE_AFTER_S, are done
            # (their end is where --from-end starts): not even opened.
            for n in names[:-1]:
                try:
                    mtime = os.stat(os.path.join(self.path, n)).st_mtime
                except FileNotFoundError:
                    continue
                if time.time() - mtime < CLOSE_AFTER_S:
                    break
                self.closed_through = n
            names = [n for n in names if n > self.closed_through]
        for key in [k for k in self.tails if k not in names]:
            gone = self.tails.pop(key)  # deleted
            gone.close()
            self.malformed_closed += gone.malformed
        # At most MAX_OPEN_FILES open: the oldest (a backfill reads them in
        # turn, each closed once read) and the two newest (SGLang's now).
        opened = set(names[:MAX_OPEN_FILES - 2]) | set(names[-2:])
        out = []
        for n in names:
            t = self.tails.get(n)
            if t is None:
                if n not in opened:
                    continue
                t = self.tails[n] = FileTail(os.path.join(self.path, n), n)
            if t.fd is None:
                if n not in opened or not t.open():
                    continue
                if self._first and self._from_end:
                    t.start_at_end()
            else:
                try:
                    st = os.stat(t.path)
                except FileNotFoundError:
                    continue
                if (st.st_dev, st.st_ino) != t.ident:
                    t.close()
                    if not t.open():
                        continue
                else:
                    t.refresh()
            out.append(t)
        self._first = False
        return out

    def after_read(self):
        """Dir mode: closes files that are done (not the newest, read to
        the end, unchanged for CLOSE_AFTER_S), advancing closed_through
        over a leading run of them. File mode: closes a renamed file once
        it is read to its end."""
        if not self.is_dir:
            self._after_read_file()
            return
        # In the directory's order: a file not read yet stops the run.
        names = [n for n in self._names if n > self.closed_through]
        now = time.time()
        for n in names[:-1]:
            t = self.tails.get(n)
            if (t is None or t.fd is None or not t.at_end() or t.pending()
                    or now - t.mtime < CLOSE_AFTER_S):
                break
            t.close()
            self.malformed_closed += t.malformed
            del self.tails[n]
            self.closed_through = n

    def _poll_file(self):
        key = self.path
        t = self.tails.get(key)
        if t is None:
            t = self.tails[key] = FileTail(self.path, key)
        out = [d for d, _ in self._draining]
        if t.fd is None:
            if t.open() and self._first and self._from_end:
                t.start_at_end()
        else:
            try:
                st = os.stat(self.path)
                ident = (st.st_dev, st.st_ino)
            except FileNotFoundError:
                ident = None  # renamed, the new one not there yet
            if ident != t.ident:
                # Rotated: drain the old descriptor, follow the new file.
                t.refresh()
                self._draining.append((t, time.monotonic()))
                out.append(t)
                t = self.tails[key] = FileTail(self.path, key)
                t.ident = None
                t.open()
            else:
                t.refresh()
        self._first = False
        if t.fd is not None:
            out.append(t)
        return out

    def _after_read_file(self):
        keep = []
        for d, since in self._draining:
            if d.at_end() and (not d.pending()
                               or time.monotonic() - since > ROTATE_GRACE_S):
                d.drop_pending()
                log(f"{d.path}: the renamed file is read to its end "
                    f"({d.offset} bytes)")
                d.close()
                self.malformed_closed += d.malformed
            else:
                keep.append((d, since))
        self._draining = keep

    def malformed(self):
        return (self.malformed_closed
                + sum(t.malformed for t in self.tails.values())
                + sum(d.malformed for d, _ in self._draining))

    def close(self):
        for t in self.tails.values():
            t.close()
        for d, _ in self._draining:
            d.close()


def load_state(path):
    """The state file's object, None when there is none; exits on a state
    file that cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            s = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        sys.exit(f"{_PROG}: --state {path}: cannot read it: {e}")
    if type(s) is not dict or s.get("version") != STATE_VERSION:
        sys.exit(f"{_PROG}: --state {path}: not a version {STATE_VERSION} "
                 "state file")
    return s


def save_state(path, state):
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Follower:
    """Reads the source's new lines and sends each record; see the module
    docstring for the delivery rules."""

    def __init__(self, client, source, *, max_per_poll=4096, rid_bytes=128,
                 ok=0, dropped=None):
        self.client = client
        self.source = source
        self.clock = Clock()
        self.max_per_poll = max_per_poll
        self.rid_bytes = rid_bytes
        self.ok = ok
        self.dropped = dropped
        self.sent = 0
        self.skipped = 0  # log_metrics false: SGLang does not observe them
        self.blocked = 0  # times the library's buffer was full
        # Counts of the records sent since the last send_step(): generation
        # tokens (gen_throughput), prompt tokens looked up and found in the
        # prefix cache (cached_tokens_total, cache_hit_rate), speculative
        # decoding (spec_accept_length, spec_accept_rate).
        self._step = [0] * 6

    IDLE, MORE, BLOCKED = "idle", "more", "blocked"

    def pump(self):
        """One poll: reads and sends at most max_per_poll records. Returns
        (lines handled, IDLE: all read | MORE: more to read | BLOCKED: the
        library's buffer is full, the line is read again later)."""
        self.clock.refresh()
        try:
            return self._pump()
        finally:
            self.send_step()

    def _pump(self):
        handled = 0
        for tail in self.source.poll():
            while handled < self.max_per_poll:
                item = tail.next_line()
                if item is None:
                    break
                line, length = item
                if not self.handle(tail, line):
                    self.blocked += 1
                    return handled, self.BLOCKED
                tail.advance(length)
                handled += 1
            if handled >= self.max_per_poll:
                return handled, self.MORE
        self.source.after_read()
        return handled, self.IDLE

    STEP_LIMIT = 1 << 31  # a STEP count is at most 2^32 - 1

    def send_step(self):
        """The counts of the records sent since the last call, at the
        poll's time (they finished within the poll interval): a STEP with
        the prompt tokens looked up in and found in the prefix cache and
        the speculative-decoding counts, and a LATENCIES with no latency
        and the generated tokens (the daemon adds them to its token
        counter; a STEP's tokens would be one iteration's)."""
        g, q, h, d, dt, a = self._step
        self._step = [0] * 6
        t = self.clock.mono_ns
        try:
            if q or d:
                kw = {"prefix_queries": q, "prefix_hits": h}
                if d:
                    kw.update(spec_drafts=d, spec_draft_tokens=dt,
                              spec_accepted_tokens=a)
                self.client.step(t_ns=t, **kw)
            if g:
                self.client.latencies((), (), t_ns=t, generation_tokens=g)
        except ValueError as e:  # a count above 2^32 - 1: not sent
            log(f"the token counts of a poll were not sent: {e}")

    def handle(self, tail, line):
        """Sends one line's record; False when the library's buffer is full
        (the line is read again later)."""
        try:
            s = summarize(*parse_line(line), max_rid_bytes=self.rid_bytes)
        except Malformed as e:
            tail.note_malformed(str(e))
            return True
        if s is None:
            self.skipped += 1
            return True
        t = self.clock.monotonic_ns(s.finished_ts)
        kw = s.kwargs
        try:
            rc = self.client.request_summary(kw.pop("reason"), t_ns=t, **kw)
        except (ValueError, TypeError) as e:
            tail.note_malformed(f"a value out of range ({e})")
            return True
        if rc == self.dropped:
            return False
        self.sent += 1
        st = self._step
        st[0] += kw["generation_tokens"]
        if "cached_tokens" in kw:
            st[1] += kw["prompt_tokens"]
            st[2] += kw["cached_tokens"]
        if s.spec is not None:
            st[3] += s.spec[0]
            st[4] += s.spec[1]
            st[5] += s.spec[2]
        if max(st) >= self.STEP_LIMIT:
            self.send_step()
        return True


def _connected(client):
    return bool(client.stats().connected)


def build_parser():
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Follow SGLang's per-request metrics file "
        "(--export-metrics-to-file) and report each finished request to "
        "tokenmeterd under the sglang profile.")
    p.add_argument("path", help="SGLang's --export-metrics-to-file-dir "
                   "(its sglang-request-metrics-*.log files, followed across "
                   "the hourly new file), or one file (followed across a "
                   "rename or truncation, like tail -F)")
    p.add_argument("--model", required=True,
                   help="the model_name label (SGLang's --served-model-name, "
                   "else its --model-path): the file does not carry it")
    p.add_argument("--instance", default=None,
                   help="the engine label (HELLO instance; default the "
                   "daemon's \"0\"): one per SGLang server on a host")
    p.add_argument("--socket", default=None,
                   help="tokenmeterd's ingest socket (default the library's, "
                   "/run/tokenmeter/ingest.sock)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-start", action="store_true",
                       help="without a --state position, read the files "
                       "from their beginning (a backfill)")
    start.add_argument("--from-end", action="store_true",
                       help="without a --state position, start after the "
                       "last complete line (the default)")
    p.add_argument("--state", default=None,
                   help="position file: read at start, written after each "
                   "flush, so a restart neither re-sends nor skips")
    p.add_argument("--once", action="store_true",
                   help="read what is there, send it, and exit")
    p.add_argument("--poll-interval", type=float, default=0.25,
                   help="seconds between looks at the files (default 0.25)")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="with --once: seconds to wait for the daemon before "
                   "giving up (exit 1; default 10)")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not os.path.exists(args.path):
        parser.error(f"{args.path}: no such file or directory")
    if not (0.01 <= args.poll_interval <= 60):
        parser.error("--poll-interval must be 0.01 .. 60 seconds")
    if not (0 <= args.connect_timeout <= 3600):
        parser.error("--connect-timeout must be 0 .. 3600 seconds")
    import tokenmeter

    state = load_state(args.state) if args.state else None
    # Without a position: --once reads from the start, a follower from the
    # end, unless told otherwise.
    from_end = args.from_end or not (args.from_start or args.once)
    source = Source(args.path, from_end, state)
    opts = {"model": args.model, "engine": "sglang", "profile": "sglang"}
    if args.instance is not None:
        opts["instance"] = args.instance
    if args.socket is not None:
        opts["socket_path"] = args.socket
    try:
        client = tokenmeter.Client(**opts)
    except ValueError as e:
        parser.error(str(e))
    follower = Follower(client, source, rid_bytes=tokenmeter.MAX_RID_BYTES,
                        ok=tokenmeter.OK, dropped=tokenmeter.DROPPED)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))

    def save():
        if args.state:
            try:
                save_state(args.state, source.state())
            except OSError as e:
                log(f"--state {args.state}: {e.strerror}")

    code = 0
    started = time.monotonic()
    waiting = None  # since when the daemon is away
    try:
        while not stop:
            if not _connected(client):
                now = time.monotonic()
                if args.once and now - started > args.connect_timeout:
                    log("tokenmeterd did not answer within "
                        f"{args.connect_timeout:g} s")
                    code = 1
                    break
                if waiting is None:
                    waiting = now
                elif waiting > 0 and now - waiting > 1:
                    log("waiting for tokenmeterd (reading paused)")
                    waiting = -1.0
                time.sleep(0.05)
                continue
            if waiting == -1.0:
                log("connected to tokenmeterd; reading")
            waiting = None
            handled, status = follower.pump()
            if (handled or status == Follower.BLOCKED) and \
                    client.flush(timeout=5.0):
                save()
            if status == Follower.MORE:
                continue
            if status == Follower.BLOCKED:
                time.sleep(0.01)
                continue
            if args.once:
                break
            time.sleep(args.poll_interval)
    finally:
        flushed = client.flush(timeout=5.0) if code == 0 else False
        st = client.close()
        # Saved only when every event was written and acknowledged: else
        # the next run sends the unsaved records again (none is lost).
        if flushed and st.events_dropped == 0 and st.events_unacked == 0:
            save()
        elif code == 0:
            log("not every event was acknowledged; the position is not "
                "saved past the last acknowledged flush")
            code = 1
        source.close()
        log(f"{follower.sent} records sent, {follower.skipped} skipped "
            f"(log_metrics false), {source.malformed()} malformed, "
            f"{follower.clock.backfilled} backfilled; library: "
            f"{st.events_sent} events sent, {st.events_dropped} dropped, "
            f"{st.events_unacked} unacked")
    return code

if __name__ == "__main__":
    sys.exit(main())
