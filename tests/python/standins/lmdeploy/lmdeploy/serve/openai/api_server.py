"""lmdeploy/serve/openai/api_server.py (v0.16.0): serve() builds the
AsyncEngine (here: lmdeploy.serve.core.AsyncEngine), and its lifespan
starts metrics_processor's handler when the backend config has
enable_metrics and runs the _force_log loop (update_schedule_stats, then
do_log_stats) every 10 s. The stand-in serves no HTTP: it replays
$STANDIN_REPLAY_REQUESTS requests (default 8) of the seeded workload
(replay.py beside the package) with one _force_log round at the end, then
stops the handler and returns (what
the loggers hold is left to the interpreter's exit, as LMDeploy does)."""
import asyncio
import os
import sys
import time

from lmdeploy.messages import ScheduleMetrics
from lmdeploy.metrics.metrics_processor import metrics_processor
from lmdeploy.serve.core import AsyncEngine


def serve(model_path, model_name=None, backend="pytorch",
          backend_config=None, **kwargs):
    engine = AsyncEngine(model_path, model_name=model_name, backend=backend,
                         backend_config=backend_config)
    asyncio.run(_lifespan(engine, backend_config))


async def _lifespan(engine, backend_config):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
    import replay
    if getattr(backend_config, "enable_metrics", False):
        metrics_processor.start_metrics_handler(enable_metrics=True)
    n = int(os.environ.get("STANDIN_REPLAY_REQUESTS", "8"))
    base = float(int(time.time()) - 60)
    timelines, _ = replay.workload(requests=n, base=base)
    clock = replay.VirtualClock(base)
    replay.use_clock(clock)
    if metrics_processor.enable_metrics:
        await replay.replay(engine, timelines, [], clock, base)
        await metrics_processor.update_schedule_stats(
            ScheduleMetrics(active_seqs=0, waiting_seqs=0, cache_usage=0.0))
        await engine.do_log_stats()
    await metrics_processor.stop_metrics_handler()
