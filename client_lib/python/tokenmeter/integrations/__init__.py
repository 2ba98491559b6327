"""Drop-in integrations of tokenmeter with inference engines.

Each module is loaded by its engine, through the engine's own plugin
mechanism where it has one, when the tokenmeter package is installed into
the engine's environment; none is imported by `import tokenmeter`.

* tokenmeter.integrations.vllm: a vLLM stat-logger plugin (the
  `vllm.stat_logger_plugins` entry point).
* tokenmeter.integrations.lmdeploy: a stat logger for LMDeploy's list
  (LMDeploy has no plugin mechanism: install() or the launcher
  `python3 -m tokenmeter.integrations.lmdeploy`).
* tokenmeter.integrations.sglang: the command tokenmeter-sglang, which
  runs beside SGLang and follows its per-request metrics file
  (--export-metrics-to-file).
"""
