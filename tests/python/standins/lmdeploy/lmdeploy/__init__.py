"""Stand-in for LMDeploy v0.16.0 (InternLM/lmdeploy, tag v0.16.0): only
the modules, classes, methods and fields of its metrics path, written for
tokenmeter's tests from a reading of that release (no LMDeploy code is
copied). tests/python/standins/lmdeploy/README.md lists what it reproduces
and from which file; nothing here needs torch or a GPU."""
__version__ = "0.16.0"
