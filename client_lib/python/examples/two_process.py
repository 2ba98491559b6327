#!/usr/bin/python3
"""Two processes, one request-id space: the serving layout of vLLM, SGLang
and LMDeploy, reporting through libtokenmeter.

* The frontend (this process) is an asyncio TCP server. It accepts a request
  line, reports ARRIVED, hands the request to the engine process and streams
  the tokens back.
* The engine process runs the scheduler loop: SCHEDULED when it admits a
  request, one tokens_batch() per step for every request that sampled a
  token, FINISHED, and a STEP with the scheduler's figures.

Both clients say scope="example-server", so tokenmeterd joins a request's
ARRIVED (frontend connection) with its first TOKENS (engine connection) into
time to first token, labelled with the engine's instance ("core-0"). With
prometheus_client in each process, the frontend's arrival time never meets
the engine's first token without shipping timestamps between processes by
hand (or a PROMETHEUS_MULTIPROC_DIR, which still cannot join two processes'
halves of one interval).

    two_process.py [--socket PATH] [--requests N] [--report FILE]

--report writes what each side stamped (JSON), for tests to compare with the
daemon's figures.
"""
import argparse
import asyncio
import json
import multiprocessing
import queue
import random
import time

import tokenmeter

ENGINE = "my-engine"
MODEL = "example-model"
SCOPE = "example-server"
STEP_S = 0.004  # one simulated forward pass


# ---- engine process ---------------------------------------------------------

def engine_main(socket_path, requests_q, outputs_q):
    """The engine core: admits requests, steps, reports."""
    meter = tokenmeter.Client(socket_path=socket_path, engine=ENGINE,
                              model=MODEL, instance="core-0", scope=SCOPE)
    waiting = []   # (rid, prompt_tokens, max_tokens)
    running = {}   # rid -> [tokens so far, max_tokens]
    max_running = 8
    open_for_work = True
    while open_for_work or waiting or running:
        # Take what the frontend sent; block only when idle.
        while open_for_work:
            try:
                item = requests_q.get(block=not (waiting or running))
            except queue.Empty:
                break
            if item is None:
                open_for_work = False
            else:
                waiting.append(item)
                meter.queued(item[0])
        while waiting and len(running) < max_running:
            rid, prompt_tokens, max_tokens = waiting.pop(0)
            meter.scheduled(rid)
            running[rid] = [0, max_tokens]
        if not running:
            continue
        time.sleep(STEP_S)  # the forward pass
        t = time.monotonic_ns()  # one timestamp for the whole step
        rids = list(running)
        meter.tokens_batch(rids, t_ns=t)  # one token each
        done = []
        for rid in rids:
            state = running[rid]
            state[0] += 1
            if state[0] == state[1]:
                meter.finished(rid, "length", t_ns=t)
                done.append(rid)
            outputs_q.put((rid, state[0], t, state[0] == state[1]))
        for rid in done:
            del running[rid]
        meter.step(running=len(running), waiting=len(waiting),
                   kv_usage=len(running) / max_running,
                   generation_tokens=len(rids), t_ns=t)
    outputs_q.put(None)
    meter.close()  # sends what is buffered


# ---- frontend process -------------------------------------------------------

class Frontend:
    def __init__(self, meter, requests_q):
        self.meter = meter
        self.requests_q = requests_q
        self.streams = {}      # rid -> asyncio.Queue of outputs
        self.arrived_ns = {}   # rid -> ARRIVED time
        self.first_token_ns = {}
        self.next_id = 0

    async def handle(self, reader, writer):
        """One connection: "GEN <prompt_tokens> <max_tokens>" per line."""
        while line := await reader.readline():
            _, prompt_tokens, max_tokens = line.split()
            prompt_tokens, max_tokens = int(prompt_tokens), int(max_tokens)
            rid = f"req-{self.next_id}"
            self.next_id += 1
            stream = self.streams[rid] = asyncio.Queue()
            t = time.monotonic_ns()
            self.arrived_ns[rid] = t
            self.meter.arrived(rid, prompt_tokens, max_tokens=max_tokens,
                               t_ns=t)
            self.requests_q.put((rid, prompt_tokens, max_tokens))
            while True:
                n, t_token, last = await stream.get()
                if n == 1:
                    self.first_token_ns[rid] = t_token
                writer.write(b"TOKEN\n")
                if last:
                    break
            writer.write(b"DONE\n")
            await writer.drain()
            del self.streams[rid]
        writer.close()

    def deliver(self, item):
        rid, n, t, last = item
        self.streams[rid].put_nowait((n, t, last))


async def load(port, requests):
    """A few users sending requests over TCP."""
    async def user(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(count):
            writer.write(f"GEN {random.randint(16, 512)} "
                         f"{random.randint(2, 12)}\n".encode())
            while await reader.readline() != b"DONE\n":
                pass
        writer.close()
        await writer.wait_closed()
    users = 4
    await asyncio.gather(*(user(requests // users + (i < requests % users))
                           for i in range(users)))


async def frontend_main(args, requests_q, outputs_q):
    meter = tokenmeter.Client(socket_path=args.socket, engine=ENGINE,
                              model=MODEL, instance="frontend", scope=SCOPE)
    front = Frontend(meter, requests_q)
    loop = asyncio.get_running_loop()

    def pump():  # engine outputs -> the request's stream, on the loop
        while (item := outputs_q.get()) is not None:
            loop.call_soon_threadsafe(front.deliver, item)
    pumping = loop.run_in_executor(None, pump)

    server = await asyncio.start_server(front.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    await load(port, args.requests)
    server.close()
    requests_q.put(None)  # the engine drains and exits
    await pumping
    stats = meter.close()
    ttft = [front.first_token_ns[r] - front.arrived_ns[r]
            for r in front.arrived_ns]
    print(f"{len(ttft)} requests; mean TTFT {sum(ttft) / len(ttft) / 1e6:.1f}"
          f" ms; frontend sent {stats.events_sent} events, dropped "
          f"{stats.events_dropped}")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"arrived_ns": front.arrived_ns,
                       "first_token_ns": front.first_token_ns,
                       "frontend_stats": stats._asdict()}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", default="/run/tokenmeter/ingest.sock")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--report", help="write the stamped times here (JSON)")
    args = p.parse_args()
    # spawn, not fork: each process creates its own tokenmeter.Client.
    ctx = multiprocessing.get_context("spawn")
    requests_q, outputs_q = ctx.Queue(), ctx.Queue()
    engine = ctx.Process(target=engine_main,
                         args=(args.socket, requests_q, outputs_q))
    engine.start()
    try:
        asyncio.run(frontend_main(args, requests_q, outputs_q))
    finally:
        engine.join(timeout=30)
    raise SystemExit(engine.exitcode)


if __name__ == "__main__":
    main()
