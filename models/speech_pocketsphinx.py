"""Speech offline: pocketsphinx with its bundled en-US acoustic model, language model and dictionary.

Only speech is decoded: a WebRTC voice activity detector (``webrtcvad``, a
dependency of resemblyzer) finds speech regions first, because pocketsphinx runs
at about half real time on one CPU core and most of a video is not speech.
"""
from __future__ import annotations

import logging
import re

import numpy as np

from m3mem.records import SpeechSegment, Word

log = logging.getLogger(__name__)

SR = 16000
_FRAME_MS = 30
_FILLER = re.compile(r"^(<s>|</s>|<sil>|\[.*\]|\+\+.*\+\+)$")


def resample_16k(audio: np.ndarray, sr: int) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim > 1:
        audio = audio.mean(axis=-1)
    if sr == SR:
        return audio
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(sr, SR)
    return resample_poly(audio, SR // g, sr // g).astype(np.float32)


def speech_regions(audio: np.ndarray, aggressiveness: int = 2, min_gap_s: float = 0.3,
                   min_len_s: float = 0.3, max_len_s: float = 10.0, pad_s: float = 0.15) -> list[tuple[float, float]]:
    """Speech regions (seconds) of 16 kHz mono audio, merged across short gaps, split when long."""
    import webrtcvad

    vad = webrtcvad.Vad(aggressiveness)
    n = SR * _FRAME_MS // 1000
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    flags = [vad.is_speech(pcm[i:i + n].tobytes(), SR) for i in range(0, len(pcm) - n + 1, n)]
    regions: list[list[float]] = []
    for k, speech in enumerate(flags):
        if not speech:
            continue
        t0, t1 = k * _FRAME_MS / 1000, (k + 1) * _FRAME_MS / 1000
        if regions and t0 - regions[-1][1] <= min_gap_s:
            regions[-1][1] = t1
        else:
            regions.append([t0, t1])
    dur = len(audio) / SR
    out = []
    for a, b in regions:
        if b - a < min_len_s:
            continue
        a, b = max(0.0, a - pad_s), min(dur, b + pad_s)
        while b - a > max_len_s:
            out.append((a, a + max_len_s))
            a += max_len_s
        out.append((a, b))
    return out


class PocketsphinxSpeechModel:
    name = "pocketsphinx"

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        from pocketsphinx import Decoder

        # arg: an alternative model folder holding acoustic model, lm and dict (pocketsphinx layout)
        kwargs = {"samprate": SR, "loglevel": "FATAL"}
        if arg:
            from pathlib import Path

            folder = Path(arg)
            kwargs.update(hmm=str(folder / "en-us"), lm=str(folder / "en-us.lm.bin"), dict=str(folder / "cmudict-en-us.dict"))
        self._decoder = Decoder(**kwargs)

    def transcribe(self, audio: np.ndarray, sr: int) -> list[SpeechSegment]:
        audio = resample_16k(audio, sr)
        out = []
        for a, b in speech_regions(audio):
            pcm = (np.clip(audio[int(a * SR):int(b * SR)], -1, 1) * 32767).astype("<i2").tobytes()
            d = self._decoder
            d.start_utt()
            d.process_raw(pcm, full_utt=True)
            d.end_utt()
            words = []
            for seg in d.seg():
                w = re.sub(r"\(\d+\)$", "", seg.word)
                if _FILLER.match(w):
                    continue
                words.append(Word(a + seg.start_frame / 100.0, a + (seg.end_frame + 1) / 100.0, w,
                                  float(np.exp(max(seg.prob, -700) / 1e4)) if hasattr(seg, "prob") else 1.0))
            if words:
                out.append(SpeechSegment(words[0].start_s, words[-1].end_s, " ".join(w.text for w in words),
                                         words=tuple(words)))
        return out
