"""The interface of every model role. Backends implement these Protocols.

Chat messages follow the OpenAI chat layout: ``{"role": ..., "content": str | list[part]}``
where a part is one of
``{"type": "text", "text": str}``,
``{"type": "image", "image": np.ndarray (H, W, 3) uint8 RGB}``,
``{"type": "video", "frames": list[np.ndarray], "fps": float}``,
``{"type": "audio", "audio": np.ndarray float32, "sr": int}``.
Backends that cannot take a part type drop it and say so in a debug log.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from m3mem.records import FaceObservation, SpeechSegment


@runtime_checkable
class FaceModel(Protocol):
    name: str
    dim: int
    # cosine similarity at or above which two faces are the same person; chosen on data
    match_threshold: float

    def detect(self, frames: Sequence[np.ndarray]) -> list[FaceObservation]:
        """Detect and embed every face in RGB uint8 frames (H, W, 3)."""


@runtime_checkable
class SpeechModel(Protocol):
    name: str

    def transcribe(self, audio: np.ndarray, sr: int) -> list[SpeechSegment]:
        """Utterances with word times, in seconds from the start of ``audio``."""


@runtime_checkable
class VoiceModel(Protocol):
    name: str
    dim: int
    match_threshold: float
    min_duration_s: float  # shorter segments are not embedded

    def embed(self, audio: np.ndarray, sr: int) -> np.ndarray:
        """One L2-normalised float32 speaker embedding for one speech segment."""


@runtime_checkable
class TextEmbedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised."""


@runtime_checkable
class ChatModel(Protocol):
    name: str

    def chat(self, messages: list[dict], **kwargs) -> str:
        """The assistant's reply to a chat, as text."""
