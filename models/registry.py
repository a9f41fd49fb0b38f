"""Config string -> backend. ``"name"`` or ``"name:argument"`` (a folder, a URL, a size).

    load_face_model("dlib")
    load_face_model("insightface:/models/buffalo_l")
    load_speech_model("whisperx:/models/faster-whisper-large-v3")
    load_chat_model("openai:http://localhost:8000/v1")

Each backend class takes ``(arg: str | None, device: str)``. Models are loaded once
per process (or per Ray actor) and cached here.
"""
from __future__ import annotations

import importlib
import threading

from m3mem.errors import ConfigError, ModelError

# role -> backend name -> "module:Class"
BACKENDS: dict[str, dict[str, str]] = {
    "face": {
        "dlib": "models.face_dlib:DlibFaceModel",
        "insightface": "models.face_insightface:InsightFaceModel",
    },
    "speech": {
        "pocketsphinx": "models.speech_pocketsphinx:PocketsphinxSpeechModel",
        "whisperx": "models.speech_whisperx:WhisperXSpeechModel",
        "none": "models.speech_none:NoSpeechModel",
    },
    "voice": {
        "resemblyzer": "models.voice_resemblyzer:ResemblyzerVoiceModel",
    },
    "text": {
        "minilm": "models.text_st:SentenceTransformerEmbedder",
        "sentence-transformers": "models.text_st:SentenceTransformerEmbedder",
        "openai": "models.text_openai:OpenAIEmbedder",
    },
    "chat": {
        "transformers": "models.chat_transformers:TransformersChatModel",
        "openai": "models.chat_openai:OpenAIChatModel",
    },
}

_cache: dict[tuple[str, str, str], object] = {}
_lock = threading.Lock()


def parse_spec(spec: str) -> tuple[str, str | None]:
    name, sep, arg = spec.partition(":")
    return name.strip().lower(), (arg.strip() if sep and arg.strip() else None)


def resolve_device(device: str = "auto") -> str:
    """``auto`` means CUDA when torch sees a GPU, else CPU."""
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load(role: str, spec: str, device: str = "auto"):
    if role not in BACKENDS:
        raise ConfigError(f"unknown model role {role!r}; roles: {', '.join(BACKENDS)}")
    name, arg = parse_spec(spec)
    table = BACKENDS[role]
    if name not in table:
        raise ConfigError(
            f"unknown {role} backend {spec!r}; choose one of: {', '.join(sorted(table))} "
            f"(optionally 'name:folder-or-url')"
        )
    device = resolve_device(device)
    key = (role, spec, device)
    with _lock:
        if key in _cache:
            return _cache[key]
        module_name, class_name = table[name].split(":")
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
        try:
            model = cls(arg, device=device)
        except ImportError as e:
            raise ModelError(
                f"the {role} backend {name!r} needs a package that is not installed ({e}). "
                f"Install the matching extra, for example: pip install 'm3mem[{_EXTRA.get(name, name)}]'"
            ) from e
        _cache[key] = model
        return model


_EXTRA = {
    "dlib": "offline", "pocketsphinx": "offline", "resemblyzer": "offline", "minilm": "offline",
    "sentence-transformers": "offline", "insightface": "face", "whisperx": "asr",
    "transformers": "llm", "openai": "offline",
}


def load_face_model(spec: str = "dlib", device: str = "auto"):
    return load("face", spec, device)


def load_speech_model(spec: str = "pocketsphinx", device: str = "auto"):
    return load("speech", spec, device)


def load_voice_model(spec: str = "resemblyzer", device: str = "auto"):
    return load("voice", spec, device)


def load_text_embedder(spec: str = "minilm", device: str = "auto"):
    return load("text", spec, device)


def load_chat_model(spec: str = "lite", device: str = "auto"):
    return load("chat", spec, device)
