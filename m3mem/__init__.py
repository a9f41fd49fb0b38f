"""m3mem: a long-term, entity-centric multimodal memory of video.

Imports are lazy so that ``import m3mem`` stays cheap; the public object is
``m3mem.Memory`` (ingest / search / ask / people).
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name == "Memory":
        from m3mem.memory import Memory

        return Memory
    if name == "Config":
        from m3mem.config import Config

        return Config
    raise AttributeError(name)
