"""lmdeploy/cli (v0.16.0): run(), the `lmdeploy` console script's entry
(setup.py: console_scripts 'lmdeploy = lmdeploy.cli:run')."""
from .entrypoint import run

__all__ = ["run"]
