"""One error hierarchy: messages say what was wrong, with which file, and what to do."""


class M3memError(Exception):
    """Base of every error m3mem raises on purpose."""


class InputError(M3memError):
    """A video, audio file, path or argument that m3mem cannot use."""


class ModelError(M3memError):
    """A model that is missing, fails to load, or replies with something unusable."""


class StoreError(M3memError):
    """A memory store that is missing, from a newer version, or inconsistent."""


class ConfigError(M3memError):
    """A configuration value that is unknown or out of range."""
