"""Model backends. Each role has a small Protocol (``models.base``) and backends are
chosen by a config string through ``models.registry``. Heavy libraries are imported
inside each backend's constructor, so importing this package is cheap."""

from models.registry import (  # noqa: F401
    load_chat_model,
    load_face_model,
    load_speech_model,
    load_text_embedder,
    load_voice_model,
)
