"""No speech recognition: for archives where only faces matter, or audio that is not speech."""
from __future__ import annotations

import numpy as np

from m3mem.records import SpeechSegment


class NoSpeechModel:
    name = "none"

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        pass

    def transcribe(self, audio: np.ndarray, sr: int) -> list[SpeechSegment]:
        return []
