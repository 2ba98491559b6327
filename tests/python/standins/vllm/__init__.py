"""A stand-in for vLLM v0.12 (tests/python/standins/README.md): the
interfaces tokenmeter.integrations.vllm meets, not vLLM."""
__version__ = "0.12.0+tokenmeter.standin"
