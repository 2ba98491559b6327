"""A stand-in for SGLang's request-metrics file and Prometheus collector
(tests only; see README.md)."""
