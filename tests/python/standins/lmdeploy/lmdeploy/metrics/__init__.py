"""lmdeploy/metrics (v0.16.0): stats.py, loggers.py, metrics_processor.py."""
