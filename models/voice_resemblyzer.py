"""Voices offline: resemblyzer's VoiceEncoder (a 256-d d-vector), weights bundled in the package."""
from __future__ import annotations

import numpy as np

from m3mem.records import l2_normalize
from models.calibration import RESEMBLYZER_VOICE
from models.speech_pocketsphinx import resample_16k


class ResemblyzerVoiceModel:
    name = "resemblyzer"
    dim = 256
    match_threshold = RESEMBLYZER_VOICE["match_threshold"]
    min_duration_s = 1.0

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        from resemblyzer import VoiceEncoder

        kwargs = {"device": device, "verbose": False}
        if arg:
            from pathlib import Path

            kwargs["weights_fpath"] = Path(arg)
        self._encoder = VoiceEncoder(**kwargs)

    def embed(self, audio: np.ndarray, sr: int) -> np.ndarray:
        wav = resample_16k(audio, sr)
        peak = float(np.abs(wav).max()) if wav.size else 0.0
        if peak > 0:
            wav = wav / peak * 0.9  # level-normalise: the encoder is not gain invariant
        # at least 1.6 s of frames are needed for one partial; pad short segments by repetition
        need = int(1.6 * 16000)
        if 0 < len(wav) < need:
            wav = np.tile(wav, int(np.ceil(need / len(wav))))[:need]
        return l2_normalize(self._encoder.embed_utterance(wav.astype(np.float32)))
