"""One typed configuration. Defaults run offline.

Precedence, lowest to highest: defaults, a TOML file (``--config FILE`` or
``$M3MEM_CONFIG``), environment variables ``M3MEM_<FIELD>`` (upper case), CLI flags.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from m3mem.errors import ConfigError


@dataclass
class Config:
    # splitting
    clip_seconds: float = 30.0
    frame_fps: float = 1.0  # frames per second sampled for faces
    max_frame_side_px: int = 960  # frames are downscaled to this before detection
    # model backends, chosen by config string (see models/registry.py)
    face_model: str = "dlib"
    speech_model: str = "pocketsphinx"
    voice_model: str = "resemblyzer"
    text_model: str = "minilm"
    memorize_model: str = "lite"
    control_model: str = "lite"
    device: str = "auto"
    # identity; None means the backend's calibrated threshold
    face_threshold: float | None = None
    voice_threshold: float | None = None
    min_face_px: int = 32
    max_exemplars: int = 8
    # memorization
    memorize_retries: int = 2
    # control
    max_rounds: int = 5
    top_k: int = 5
    # execution
    workers: int = 1
    ray_address: str | None = None

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _coerce(name: str, typ: Any, value: Any) -> Any:
    typ = str(typ)
    if value is None:
        return None
    try:
        if typ.startswith("float"):
            return float(value)
        if typ.startswith("int"):
            return int(value)
        if typ.startswith("bool"):
            if isinstance(value, bool):
                return value
            return str(value).lower() in ("1", "true", "yes", "on")
        return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config value {name}={value!r} is not a valid {typ}") from e


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                env: dict[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    types = {f.name: f.type for f in fields(Config)}
    values: dict[str, Any] = {}
    path = path or env.get("M3MEM_CONFIG")
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from e
        data = data.get("m3mem", data)
        for k, v in data.items():
            if k not in types:
                raise ConfigError(f"unknown key {k!r} in {p}; known keys: {', '.join(types)}")
            values[k] = _coerce(k, types[k], v)
    for k, t in types.items():
        ev = env.get(f"M3MEM_{k.upper()}")
        if ev is not None:
            values[k] = _coerce(k, t, ev)
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k not in types:
            raise ConfigError(f"unknown config key {k!r}; known keys: {', '.join(types)}")
        values[k] = _coerce(k, types[k], v)
    cfg = Config(**values)
    if cfg.clip_seconds < 1:
        raise ConfigError("clip_seconds must be at least 1")
    if cfg.frame_fps <= 0:
        raise ConfigError("frame_fps must be positive")
    if cfg.max_rounds < 1:
        raise ConfigError("max_rounds must be at least 1")
    return cfg
