"""vllm.plugins at v0.12: entry-point groups and their loader.

STAT_LOGGER_PLUGINS_GROUP's plugins are loaded in the front-end process
(AsyncLLM). VLLM_PLUGINS, when set, names the plugins to load (a comma
separated list of entry-point names; empty: none)."""
import logging
import os
from importlib.metadata import entry_points

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
IO_PROCESSOR_PLUGINS_GROUP = "vllm.io_processor_plugins"
PLATFORM_PLUGINS_GROUP = "vllm.platform_plugins"
STAT_LOGGER_PLUGINS_GROUP = "vllm.stat_logger_plugins"

logger = logging.getLogger(__name__)


def load_plugins_by_group(group):
    """{entry point name: what it loads} of `group`, filtered by
    VLLM_PLUGINS."""
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else [
        n for n in allowed.split(",") if n]
    plugins = {}
    for ep in entry_points(group=group):
        if names is not None and ep.name not in names:
            continue
        try:
            plugins[ep.name] = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s", ep.name)
    return plugins
