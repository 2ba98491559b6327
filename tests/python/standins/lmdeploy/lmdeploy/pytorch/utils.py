"""lmdeploy/pytorch/utils.py (v0.16.0): the singleton decorator that
metrics_processor.MetricsProcessor wears (one instance per class, the
decorated name becomes the factory)."""


def singleton(cls):
    made = {}

    def instance(*args, **kwargs):
        if cls not in made:
            made[cls] = cls(*args, **kwargs)
        return made[cls]

    return instance
