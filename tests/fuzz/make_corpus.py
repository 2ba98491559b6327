#!/usr/bin/python3
"""Writes the seed corpora in tests/fuzz/corpus/<target>/ from the worked
bytes and examples of docs/protocol.md (and, for HTTP, the requests a real
Prometheus sends). Deterministic; rerun after changing a seed.

frame_decoder inputs start with one control byte (the split point and the
limits, see frame_decoder_fuzzer.cpp); http_server inputs likewise (the
split point).
"""
import os

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
H = 3600 * 10 ** 9
T = 3 * H  # the fuzzer's fake clock starts 3 h after boot

# Worked bytes, as docs/protocol.md writes them.
HELLO = bytes.fromhex("92 00 83 a5 70 72 6f 74 6f 01 a6 65 6e 67 69 6e 65"
                      " a4 76 6c 6c 6d a5 6d 6f 64 65 6c a1 6d")
BATCH_TOKENS = bytes.fromhex("94 01 00 00 91 94 04 cf 01 02 03 04 05 06 07 08"
                             " 07 03")
FINISHED_STR = bytes.fromhex("94 05 cf 01 02 03 04 05 06 07 08 a5 72 65 71 2d"
                             " 31 a4 73 74 6f 70")
GOODBYE = bytes.fromhex("91 02")
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def batch(events, seq=0, dropped=0):
    return pack([1, seq, dropped, events])


def hello(**extra):
    meta = {"proto": 1, "engine": "vllm", "model": "m"}
    meta.update(extra)
    return pack([0, meta])


LIFECYCLE = [
    [1, T, 7, 100, {"max_tokens": 64, "n": 1}],
    [2, T + 1, 7],
    [3, T + 2, 7],
    [4, T + 10, 7, 1],
    [6, T + 11, 7],
    [3, T + 12, 7],
    [4, T + 20, 7, 2],
    [5, T + 30, 7, "stop"],
    [1, T, "req-1", 5],
    [4, T + 5, "req-1", 1],
    [5, T + 6, "req-1", "length"],
    [5, T + 7, 8, "abort"],
    [5, T + 8, 9, "error"],
    [7, T, {"running": 3, "waiting": 2, "kv_usage": 0.5,
            "prompt_tokens": 7, "generation_tokens": 9,
            "prefix_queries": 10, "prefix_hits": 4, "spec_drafts": 2,
            "spec_draft_tokens": 6, "spec_accepted_tokens": 4,
            "spec_accepted_per_pos": [2, 1, 1]}],
    [7, T, {"kv_usage": 1}],
    [99, T, 1, 2],
]

DECODER = {
    "hello": b"\x40" + HELLO,
    "hello_batch_tokens": b"\x20" + HELLO + BATCH_TOKENS,
    "hello_finished_str": b"\x05" + HELLO + b"\x94\x01\x00\x00\x91"
    + FINISHED_STR,
    "hello_goodbye": b"\x7f" + HELLO + GOODBYE,
    "lifecycle": b"\x30" + hello(instance="dp0", scope="srv", pid=4711,
                                  labels={"team": "a", "zone": "b"})
    + batch(LIFECYCLE) + batch([[4, T + 40, 7, 1]], seq=1, dropped=3)
    + GOODBYE,
    "lifecycle_small_limits": b"\x90" + hello(labels={"a": "b"})
    + batch(LIFECYCLE[:4]),
    "invalid_msgpack": b"\x00" + HELLO + b"\xc1",
    "batch_before_hello": b"\x01" + BATCH_TOKENS,
    "second_hello": b"\x02" + HELLO + HELLO,
    "bad_events": b"\x03" + HELLO + batch([
        [4, T, 1, 0], [5, T, 1, "bogus"], [4, 2 ** 64 - 1, 1, 1],
        [4, T, "", 1], [4, T, -1, 1], 5, [], [7, T, "x"],
        [7, T, {"spec_accepted_per_pos": list(range(70))}]]),
    "lying_length": b"\x04" + HELLO + b"\x94\x01\x00\x00\xdd\xff\xff\xff\xff",
    "deep": b"\x06" + HELLO + b"\x94\x01\x00\x00\x91" + b"\x91" * 40 + b"\x00",
    "reserved_label": b"\x07" + hello(labels={"le": "1", "__x": "y"}),
    # Protocol 1.1: profiles, cache_config, max_lora, ARRIVED lora/labels.
    "protocol_1_1_sglang": b"\x31" + hello(
        engine="sglang", cache_config={"page_size": 1, "num_pages": 100,
                                       "ratio": 0.9, "on": True,
                                       "dtype": "auto", "neg": -3},
        max_lora=4) + batch([
            [1, T, 1, 10, {"lora": "a", "labels": {"tenant": "t1"}}],
            [1, T, 2, 10, {"lora": "b", "labels": {"tenant": "t2",
                                                   "team": "x"}}],
            [3, T + 1, 1], [4, T + 2, 1, 1], [4, T + 3, 1, 3],
            [6, T + 4, 1], [5, T + 5, 1, "abort"], [5, T + 6, 2, "stop"]]),
    "protocol_1_1_lmdeploy": b"\x32" + hello(
        engine="x", profile="lmdeploy", cache_config={"block_size": 16})
    + batch([[1, T, 1, 10, {"labels": {"tenant": "t9"}}], [3, T, 1],
             [4, T + 1, 1, 1], [4, T + 2, 1, 2], [5, T + 3, 1, "length"]]),
    "protocol_1_1_bad": b"\x09" + hello(profile="bogus"),
    "expert_load": b"\x33" + hello() + batch([
        [8, T, 0, [5, 0, 7, 1]], [8, T, 0, [0, 0, 0, 0]], [8, T, 0, [1, 2]],
        [8, T, 4095, list(range(64))], [8, T, 4096, [1]], [8, T, 1, []],
        [8, T, 2, [2 ** 32]], [8, T, 3, "x"]]),
    "protocol_1_1_bad_params": b"\x0a" + hello() + batch([
        [1, T, 1, 1, {"lora": ""}], [1, T, 2, 1, {"labels": {"le": "x"}}],
        [1, T, 3, 1, {"labels": {"a": "1", "b": "2", "c": "3", "d": "4",
                                 "e": "5"}}],
        [1, T, 4, 1, {"lora": "x" * 129}]]),
    # Protocol 1.2: the new kinds and fields, good and bad.
    "protocol_1_2": b"\x34" + hello() + batch([
        [1, T, 1, 100, {"priority": -3, "traceparent": TP,
                        "tracestate": "rojo=00f067aa0ba902b7,congo=t61"}],
        [3, T + 1, 1, {"cached_tokens": 30, "external_tokens": 20}],
        [10, T + 3, 1, {"role": "recv", "start": T + 2, "bytes": 1 << 20,
                        "blocks": 16, "ok": True, "connector": "nixl"}],
        [10, T + 4, 1, {"role": "send", "start": T + 2, "ok": False,
                        "reason": "timeout"}],
        [4, T + 5, 1, 1], [6, T + 6, 1], [4, T + 7, 1, 2],
        [5, T + 8, 1, "stop"],
        [9, T, "queue_full"], [9, T, "token_cap", 7], [9, T, "x", "r-1"],
        [11, T, {"scheduler": "paused", "weights": "offloaded",
                 "kv_cache": "released"}],
        [11, T + 1, {"kv_cache": "resident"}],
        [7, T, {"waiting": 5, "waiting_deferred": 2}]]),
    "protocol_1_2_bad": b"\x0b" + hello() + batch([
        [1, T, 2, 10, {"priority": 2 ** 31, "traceparent": TP.upper(),
                       "tracestate": "no-equals"}],
        [1, T, 3, 10, {"priority": "1", "traceparent": 7}],
        [3, T + 1, 2, {"cached_tokens": 9, "external_tokens": 9}],
        [3, T + 1, 3, "info"], [3, T + 1, 4, {"cached_tokens": -1}],
        [10, T + 3, 2, {"role": "both", "start": T}],
        [10, T + 3, 2, {"start": T}], [10, T + 3, 2, {"role": "send"}],
        [10, T + 3, 2, {"role": "send", "start": T + 9}],
        [10, T + 3, 2, {"role": "recv", "start": T, "bytes": 2 ** 48,
                        "ok": 1, "reason": "a\nb", "connector": "x" * 65}],
        [10, T + 3, 2, []],
        [9, T, ""], [9, T, "a\tb"], [9, T, 7], [9, T, "ok", 1.5], [9, T],
        [11, T, {"scheduler": "asleep", "weights": 1}], [11, T, []],
        [7, T, {"waiting": 1, "waiting_deferred": 2}],
        [7, T, {"waiting_deferred": 1}], [12, T, 1],
        # One key above 2^32 - 1: above any prompt, the whole map dropped.
        [3, T + 1, 5, {"cached_tokens": 2 ** 32, "external_tokens": 1}]]),
    # A tracestate over the string limit: dropped as bad_field, the
    # request starts; the same string as a lora ends the frame.
    "protocol_1_2_long_tracestate": b"\x0b" + hello() + batch([
        [1, T, 5, 10, {"tracestate": "k=" + "v" * 298, "max_tokens": 4}],
        [1, T, 6, 10, ["tracestate", "k=" + "v" * 298]],
        [4, T + 1, 5, 1], [5, T + 2, 5, "stop"]])
    + batch([[1, T, 7, 10, {"lora": "x" * 300}]]),
    # The key "tracestate" in a STEP's stats: only ARRIVED params let its
    # long value pass, so this ends the frame.
    "protocol_1_2_long_tracestate_step": b"\x0b" + hello() + batch([
        [1, T, 5, 10, {"tracestate": "k=v"}],
        [7, T, {"running": 1, "tracestate": "k=" + "v" * 298}]]),
    # HELLO keys of 1.1 and 1.2 that only inform or ask for ACKs, good ...
    "hello_session_ack": b"\x0b" + hello(
        session=2 ** 63 + 5, ack=True, pid=4242, max_lora=4,
        cache_config={"block_size": 16, "num_gpu_blocks": 8192,
                      "enable_prefix_caching": True, "gpu_util": 0.9})
    + batch(LIFECYCLE[:3], seq=1) + batch(LIFECYCLE[3:6], seq=2),
    # ... and bad (each dropped as bad_field, or a bad_hello).
    "hello_bad_informing": b"\x0b" + hello(
        pid="4242", max_lora=-1,
        cache_config={"k%d" % i: i for i in range(33)})
    + batch(LIFECYCLE[:3]),
    "hello_bad_session": b"\x0b" + hello(session="s", ack=1)
    + batch(LIFECYCLE[:3]),
    # Protocol 1.3: REQUEST_SUMMARY and LATENCIES, good and bad.
    "protocol_1_3": b"\x35" + hello() + batch([
        [12, T, "stop", {"prompt_tokens": 812, "generation_tokens": 256,
                         "cached_tokens": 512, "max_tokens": 1024, "n": 2,
                         "max_generation_tokens": 300, "ttft": 41_000_000,
                         "queue": 5, "prefill": 6, "decode": 7,
                         "inference": 8, "e2e": 2 ** 48 - 1, "tpot": 9}, 7],
        [12, T, "abort", {"prompt_tokens": 0, "generation_tokens": 0}],
        [12, T, "error", {"generation_tokens": 1, "prompt_tokens": 3},
         "req-1"],
        [13, T, [41_000_000, 1], [9_000_000, 8_000_000, 0]],
        [13, T, [], [], {"prompt_tokens": 812, "generation_tokens": 3,
                         "preemptions": 1}],
        [13, T, list(range(1, 1000)), list(range(25))],
        [7, T, {"running": 3, "waiting": 2, "prompt_tokens": 812,
                "generation_tokens": 3}]]),
    "protocol_1_3_bad": b"\x0c" + hello() + batch([
        [12, T, 1, {"prompt_tokens": 1, "generation_tokens": 1}],
        [12, T, "done", {"prompt_tokens": 1, "generation_tokens": 1}],
        [12, T, "stop", {"prompt_tokens": 1}],
        [12, T, "stop", {"prompt_tokens": -1, "generation_tokens": 1}],
        [12, T, "stop", {"prompt_tokens": 2, "generation_tokens": 1,
                         "cached_tokens": 3, "ttft": 2 ** 48, "n": -1,
                         "e2e": 1.5, "tpot": "9"}, 1.5],
        [12, T, "stop", []], [12, T, "stop"],
        [13, T, [2 ** 48], []], [13, T, [], [-1]], [13, T, [1.0], []],
        [13, T, list(range(1025)), []], [13, T, [], {}],
        [13, T, [1], [2], {"prompt_tokens": 2 ** 32, "preemptions": "1"}],
        [13, T, [1], [2], 7], [13, T, [1]], [14, T, 1]]),
    "wide_ints": b"\x08" + bytes.fromhex(
        "dc 00 02 d3 00 00 00 00 00 00 00 00 de 00 03"
        " d9 05 70 72 6f 74 6f cd 00 01"
        " da 00 06 65 6e 67 69 6e 65 db 00 00 00 04 76 6c 6c 6d"
        " a5 6d 6f 64 65 6c c4 01 6d"),
}

ACCEPT_PROM3 = (b"application/openmetrics-text;version=1.0.0;"
                b"escaping=allow-utf-8;q=0.6,application/openmetrics-text;"
                b"version=0.0.1;q=0.5,text/plain;version=1.0.0;"
                b"escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,"
                b"*/*;q=0.2")
ACCEPT_PROM2 = (b"application/openmetrics-text;version=1.0.0,"
                b"application/openmetrics-text;version=0.0.1;q=0.75,"
                b"text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def get(path, *headers):
    return (b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1:10062\r\n"
            + b"".join(h + b"\r\n" for h in headers) + b"\r\n")


HTTP = {
    "prometheus3": b"\x80" + get(b"/metrics", b"Accept: " + ACCEPT_PROM3,
                                 b"Accept-Encoding: gzip",
                                 b"User-Agent: Prometheus/3.0.0",
                                 b"X-Prometheus-Scrape-Timeout-Seconds: 10"),
    "prometheus2": b"\x40" + get(b"/metrics", b"Accept: " + ACCEPT_PROM2,
                                 b"Accept-Encoding: gzip"),
    "healthz": b"\xff" + get(b"/healthz"),
    "head": b"\x10" + b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "pipelined": b"\x33" + get(b"/metrics?x=1") + get(b"/healthz")
    + get(b"/throw") + get(b"/nope"),
    "http10": b"\x20" + b"GET /metrics HTTP/1.0\r\n\r\n",
    "close": b"\x21" + get(b"/metrics", b"Connection: close"),
    "post": b"\x22" + b"POST /metrics HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "chunked": b"\x23" + b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "folded": b"\x24" + b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    b"Accept: text/plain;\r\n version=0.0.4\r\nAccept: */*\r\n\r\n",
}

NEGOTIATION = {
    "prometheus3": ACCEPT_PROM3 + b"\ngzip",
    "prometheus2": ACCEPT_PROM2 + b"\ngzip, deflate",
    "text": b"text/plain; version=0.0.4; charset=utf-8\nidentity",
    "openmetrics": b"application/openmetrics-text; version=1.0.0; "
                   b"charset=utf-8\n*;q=0.5, gzip;q=0",
    "wildcards": b"text/*;q=0.3, */*;q=0.1, application/*;q=0.9\nx-gzip;q=1.0",
    "bad_q": b"text/plain;q=1.0001, application/openmetrics-text;q=abc\n"
             b"gzip;q=0.0000",
    "quoted": b'text/plain; version="0.0.4"; q=0.5\n*',
}


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("frame_decoder", DECODER)
write("http_server", HTTP)
write("negotiation", NEGOTIATION)
