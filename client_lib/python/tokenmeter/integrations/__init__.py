"""Drop-in integrations of tokenmeter with inference engines.

Each module is loaded by its engine, through the engine's own plugin
mechanism, when the tokenmeter package is installed into the engine's
environment; none is imported by `import tokenmeter`.

* tokenmeter.integrations.vllm: a vLLM stat-logger plugin (the
  `vllm.stat_logger_plugins` entry point).
"""
