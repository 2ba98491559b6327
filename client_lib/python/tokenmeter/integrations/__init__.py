"""Drop-in integrations of tokenmeter with inference engines.

Each module is loaded by its engine, through the engine's own plugin
mechanism, or runs beside it, when the tokenmeter package is installed;
none is imported by `import tokenmeter`.

* tokenmeter.integrations.vllm: a vLLM stat-logger plugin (the
  `vllm.stat_logger_plugins` entry point).
* tokenmeter.integrations.sglang: the command tokenmeter-sglang, which
  follows SGLang's per-request metrics file (--export-metrics-to-file).
"""
