"""Voices offline: resemblyzer's VoiceEncoder (a 256-d d-vector), weights bundled in the package."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from m3mem.errors import ModelError
from m3mem.records import l2_normalize
from models.calibration import RESEMBLYZER_VOICE
from models.speech_pocketsphinx import SR, to_mono_16k

log = logging.getLogger(__name__)

# the encoder's training audio was levelled to -30 dBFS (resemblyzer.preprocess_wav);
# its mel input is not log-compressed, so the level changes the embedding
_TARGET_DBFS = -30.0
# one partial utterance of the encoder spans 160 frames of 10 ms
_PARTIAL_S = 1.6


class ResemblyzerVoiceModel:
    name = "resemblyzer"
    dim = 256
    match_threshold = RESEMBLYZER_VOICE["match_threshold"]
    min_duration_s = 1.0

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        from resemblyzer import VoiceEncoder

        kwargs: dict = {"device": device, "verbose": False}
        if arg:
            weights = Path(arg)
            if not weights.is_file():
                raise ModelError(
                    f"resemblyzer weights file {weights} does not exist; pass the path of a VoiceEncoder "
                    f"state dict (.pt), or use voice_model='resemblyzer' for the weights bundled with the package"
                )
            kwargs["weights_fpath"] = weights
        self._encoder = VoiceEncoder(**kwargs)

    def embed(self, audio: np.ndarray, sr: int) -> np.ndarray:
        wav = to_mono_16k(audio, sr)
        rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2))) if wav.size else 0.0
        if rms < 1e-6:
            # silence has no speaker; a zero vector matches nothing (cosine 0)
            log.debug("voice embedding of a silent segment (%d samples)", wav.size)
            return np.zeros(self.dim, dtype=np.float32)
        wav = wav * (10.0 ** (_TARGET_DBFS / 20.0) / rms)
        # segments shorter than one partial are repeated rather than padded with silence,
        # so every frame the encoder sees is speech
        need = int(_PARTIAL_S * SR)
        if len(wav) < need:
            wav = np.tile(wav, int(np.ceil(need / len(wav))))[:need]
        return l2_normalize(self._encoder.embed_utterance(wav.astype(np.float32)))
