"""lmdeploy/serve/core/async_engine.py (v0.16.0), the metrics path only.

AsyncEngine.__init__ ends with self._build_stat_loggers(), which, when the
backend config has enable_metrics (the default since the CLI's
--disable-metrics), sets self.stat_loggers to a new list
[LoggingStatLogger(dp_rank), PrometheusStatLogger(model_name,
max_model_len=session_len, dp_rank)] and makes metrics_processor.stat_loggers
that same list. do_log_stats() calls log() on each. generate() keeps what
LMDeploy's generate() does for metrics, in its order: the total-requests
count, one RequestStats(prompt_tokens=input_len) made when the request
starts (its arrival_time: time.time() then), and for every engine output
one IterationStats() (its iteration_timestamp: time.time() then) and, with
speculative decoding, a SpeculativeDecodingStats(num_spec_token), queued
with the output; it stops at an error status and counts the request as
succeeded, aborted (CANCEL) or errored. The real engine, tokenizer and
sessions are not here: the outputs come from the caller.
"""
from lmdeploy.messages import EngineOutput, ResponseType
from lmdeploy.metrics.metrics_processor import metrics_processor
from lmdeploy.metrics.stats import (IterationStats, RequestStats,
                                    SpeculativeDecodingStats)
from lmdeploy.utils import get_logger

logger = get_logger("lmdeploy")


class AsyncEngine:

    def __init__(self, model_path, model_name=None, backend="pytorch",
                 backend_config=None, speculative_config=None, **kwargs):
        self.model_name = model_name or model_path
        self.backend = backend
        self.backend_config = backend_config
        self.session_len = backend_config.session_len
        self.speculative_config = speculative_config
        self.num_spec_token = (
            0 if backend == "turbomind" or speculative_config is None
            else speculative_config.num_speculative_tokens)
        self._build_stat_loggers()

    def _build_stat_loggers(self):
        self.stat_loggers = []
        if getattr(self.backend_config, "enable_metrics", False):
            from lmdeploy.metrics.loggers import (LoggingStatLogger,
                                                  PrometheusStatLogger)
            dp_rank = (self.backend_config.dp_rank
                       if self.backend == "pytorch" else 0)
            self.stat_loggers = [
                LoggingStatLogger(dp_rank=dp_rank),
                PrometheusStatLogger(model_name=self.model_name,
                                     max_model_len=self.session_len,
                                     dp_rank=dp_rank),
            ]
            metrics_processor.stat_loggers = self.stat_loggers

    async def do_log_stats(self):
        for stat_logger in self.stat_loggers:
            stat_logger.log()

    async def generate(self, input_len, outputs):
        """The metrics part of LMDeploy's generate(); `outputs` is an async
        iterable of EngineOutput. Yields each output back."""
        metrics_processor.increase_total_requests()
        req_stats = RequestStats(prompt_tokens=input_len)
        # LMDeploy's default, for an engine that yields nothing.
        out = EngineOutput(ResponseType.INTERNAL_ENGINE_ERROR, [])
        async for out in outputs:
            iteration_stats = IterationStats()
            spec_stats = (SpeculativeDecodingStats(self.num_spec_token)
                          if self.num_spec_token > 0 else None)
            metrics_processor.queue_update(
                (out, req_stats, iteration_stats, spec_stats))
            if _is_error(out.status):
                break
            yield out
        if not _is_error(out.status):
            if out.status == ResponseType.CANCEL:
                metrics_processor.increase_failed_requests("abort")
            else:
                metrics_processor.increase_succeeded_requests()
        else:
            metrics_processor.increase_failed_requests("error")


class VLAsyncEngine(AsyncEngine):
    """lmdeploy/serve/core/vl_async_engine.py: a subclass; it does not
    override _build_stat_loggers."""


def _is_error(status):
    return status not in (ResponseType.SUCCESS, ResponseType.FINISH,
                          ResponseType.CANCEL)

