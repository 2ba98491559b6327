"""lmdeploy/serve/core/__init__.py (v0.16.0)."""
from .async_engine import AsyncEngine, VLAsyncEngine

__all__ = ["AsyncEngine", "VLAsyncEngine"]
