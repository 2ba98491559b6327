"""lmdeploy/metrics/metrics_processor.py (v0.16.0), its behaviour
reproduced: one MetricsProcessor (a singleton) whose stat_loggers list
AsyncEngine._build_stat_loggers() fills, and whose asyncio task takes
(outputs, req_stats, iteration_stats, specdecode_stats) off a queue, in
order, and calls, for each logger: record_iteration(iteration_stats),
then record_specdecode(specdecode_stats) when there is one; and, for an
output whose status is FINISH, record_finish(req_stats) on every logger.
An exception from a logger is logged and the next item taken (the
remaining loggers of that item are skipped, as in LMDeploy).
update_schedule_stats() (every 10 s from the API server) calls
record_schedule() on each."""
import asyncio

from lmdeploy.messages import ResponseType
from lmdeploy.pytorch.utils import singleton
from lmdeploy.utils import get_logger

from .stats import SchedulerStats

logger = get_logger("lmdeploy")


@singleton
class MetricsProcessor:

    def __init__(self):
        self.enable_metrics = False
        self.scheduler_stats = SchedulerStats()
        self.stat_loggers = []
        self.metrics_queue = None
        self.metrics_handler = None

    def start_metrics_handler(self, enable_metrics):
        self.enable_metrics = enable_metrics
        if enable_metrics and self.metrics_handler is None:
            self.metrics_queue = asyncio.Queue()
            self.metrics_handler = asyncio.create_task(
                self._run_metrics_handler())

    async def stop_metrics_handler(self):
        if self.metrics_handler is not None:
            self.metrics_handler.cancel()
            try:
                await self.metrics_handler
            except asyncio.CancelledError:
                pass
            finally:
                self.metrics_handler = None

    async def _run_metrics_handler(self):
        while True:
            try:
                outputs, req_stats, iteration_stats, spec_stats = \
                    await self.metrics_queue.get()
                if outputs and outputs.req_metrics:
                    req_stats.cached_tokens = outputs.req_metrics.cached_tokens
                    req_stats.update_from_events(
                        outputs.req_metrics.engine_events)
                iteration_stats.update_from_output(outputs, req_stats)
                if spec_stats is not None:
                    spec_stats.update_from_output(outputs)
                for stat_logger in self.stat_loggers:
                    stat_logger.record_iteration(iteration_stats)
                    if spec_stats is not None:
                        stat_logger.record_specdecode(spec_stats)
                if outputs.status == ResponseType.FINISH:
                    for stat_logger in self.stat_loggers:
                        stat_logger.record_finish(req_stats)
                self.metrics_queue.task_done()
            except asyncio.CancelledError:
                break
            except Exception as e:  # noqa: BLE001 (LMDeploy's own catch-all)
                logger.exception(f"Metrics handler background task failed: {e}")

    async def update_schedule_stats(self, schedule_metrics):
        self.scheduler_stats.update_from_schedule_metrics(schedule_metrics)
        for stat_logger in self.stat_loggers:
            stat_logger.record_schedule(self.scheduler_stats)

    def queue_update(self, update_data):
        if not self.enable_metrics or self.metrics_queue is None:
            return
        self.metrics_queue.put_nowait(update_data)

    def increase_total_requests(self):
        self.scheduler_stats.num_total_reqs += 1

    def increase_succeeded_requests(self):
        self.scheduler_stats.num_succeeded_reqs += 1

    def increase_failed_requests(self, failure_type="error"):
        attr = {"cancel": "num_cancelled_reqs", "abort": "num_aborted_reqs",
                "error": "num_errored_reqs"}.get(failure_type)
        if attr is not None:
            setattr(self.scheduler_stats, attr,
                    getattr(self.scheduler_stats, attr) + 1)

    def increase_api_routed_requests(self):
        self.scheduler_stats.num_api_routed_reqs += 1

    def decrease_api_routed_requests(self):
        self.scheduler_stats.num_api_routed_reqs -= 1


metrics_processor = MetricsProcessor()
