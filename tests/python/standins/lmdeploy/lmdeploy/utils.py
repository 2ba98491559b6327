"""lmdeploy/utils.py (v0.16.0): get_logger, here a plain logging logger."""
import logging


def get_logger(name):
    return logging.getLogger(name)
