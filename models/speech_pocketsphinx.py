"""Speech offline: pocketsphinx 5 with its bundled en-US acoustic model, language model and dictionary.

Only speech is decoded: a voice activity detector finds speech regions first,
because pocketsphinx runs at about a third to a half of real time on one CPU core
and most of a video is not speech. The detector is pocketsphinx's own
(WebRTC's, compiled into pocketsphinx), so no other package is needed.
Word times come from the decoder's segmentation (10 ms frames), word scores
are the decoder's posterior probabilities.
"""
from __future__ import annotations

import logging
import re
from math import gcd
from pathlib import Path

import numpy as np

from m3mem.errors import InputError, ModelError
from m3mem.records import SpeechSegment, Word

log = logging.getLogger(__name__)

SR = 16000
_FRAME_S = 0.01  # pocketsphinx frame rate: 100 frames per second
# <s>, </s>, <sil>, and fillers such as [NOISE] or ++UM++ are not words of the transcript
_FILLER = re.compile(r"^(<s>|</s>|<sil>|\[.*\]|\+\+.*\+\+)$")
_VARIANT = re.compile(r"\(\d+\)$")  # "and(2)": the second pronunciation of "and"


def to_mono_16k(audio: np.ndarray, sr: int) -> np.ndarray:
    """Float32 mono at 16 kHz, the rate every offline speech and voice model here expects."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 2:
        # (samples, channels) as soundfile returns it, or (channels, samples)
        audio = audio.mean(axis=1) if audio.shape[0] >= audio.shape[1] else audio.mean(axis=0)
    elif audio.ndim != 1:
        raise InputError(f"audio must be 1-d (mono) or 2-d (multichannel), got shape {audio.shape}")
    if sr <= 0:
        raise InputError(f"sample rate must be positive, got {sr}")
    if sr == SR:
        return audio
    from scipy.signal import resample_poly

    g = gcd(int(sr), SR)
    return resample_poly(audio, SR // g, int(sr) // g).astype(np.float32)


def _pcm16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")


def speech_regions(audio: np.ndarray, mode: int = 2, min_gap_s: float = 0.5, min_len_s: float = 0.3,
                   max_len_s: float = 15.0, pad_s: float = 0.15) -> list[tuple[float, float]]:
    """Speech regions (seconds) of 16 kHz mono float audio.

    Regions closer than ``min_gap_s`` are merged (a pause inside a sentence is not
    a new utterance); regions longer than ``max_len_s`` are split at their quietest
    frame, so that no word is cut and the decoder's search stays small.
    """
    from pocketsphinx import Vad

    vad = Vad(mode, SR)
    n = vad.frame_bytes // 2
    frame_s = n / SR
    pcm = _pcm16(audio)
    flags = np.array([vad.is_speech(pcm[i:i + n].tobytes()) for i in range(0, len(pcm) - n + 1, n)], dtype=bool)
    regions: list[list[int]] = []  # frame indices [a, b)
    for k in np.flatnonzero(flags):
        if regions and (k - regions[-1][1]) * frame_s < min_gap_s:
            regions[-1][1] = k + 1
        else:
            regions.append([int(k), int(k) + 1])
    energy = None
    out: list[tuple[float, float]] = []
    dur_s = len(audio) / SR
    for a, b in regions:
        if (b - a) * frame_s < min_len_s:
            continue
        pieces = [(a, b)]
        if (b - a) * frame_s > max_len_s:
            if energy is None:
                usable = len(flags) * n
                energy = (audio[:usable].reshape(-1, n) ** 2).mean(axis=1)
            pieces = _split_quiet(a, b, energy, int(max_len_s / frame_s))
        # pad only the outer edges: padding a cut would decode the audio around it twice
        for i, (pa, pb) in enumerate(pieces):
            start_s = pa * frame_s - (pad_s if i == 0 else 0.0)
            end_s = pb * frame_s + (pad_s if i == len(pieces) - 1 else 0.0)
            out.append((round(max(0.0, start_s), 3), round(min(dur_s, end_s), 3)))
    return out


def _split_quiet(a: int, b: int, energy: np.ndarray, max_frames: int) -> list[tuple[int, int]]:
    """Split frames [a, b) into pieces of at most ``max_frames``, each cut at the quietest
    frame of the second half of the allowed window."""
    pieces = []
    while b - a > max_frames:
        lo, hi = a + max_frames // 2, a + max_frames
        cut = lo + int(np.argmin(energy[lo:hi]))
        pieces.append((a, cut))
        a = cut
    pieces.append((a, b))
    return pieces


class PocketsphinxSpeechModel:
    """English ASR with word times and no diarization (``speaker`` stays None).

    ``arg`` is an optional model folder in pocketsphinx's layout: an acoustic model
    folder ``en-us/``, ``en-us.lm.bin`` and ``cmudict-en-us.dict`` (the layout of
    ``pocketsphinx/model/en-us``); by default the model bundled with the package.
    """

    name = "pocketsphinx"

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        from pocketsphinx import Decoder

        kwargs: dict = {"samprate": SR, "loglevel": "FATAL"}
        if arg:
            folder = Path(arg)
            files = {"hmm": folder / "en-us", "lm": folder / "en-us.lm.bin", "dict": folder / "cmudict-en-us.dict"}
            missing = [str(p) for p in files.values() if not p.exists()]
            if missing:
                raise ModelError(
                    f"pocketsphinx model folder {folder} lacks {', '.join(missing)}; pass a folder laid out like "
                    f"pocketsphinx's bundled model (en-us/, en-us.lm.bin, cmudict-en-us.dict), or use "
                    f"speech_model='pocketsphinx' for the bundled en-US model"
                )
            kwargs.update({k: str(v) for k, v in files.items()})
        try:
            self._decoder = Decoder(**kwargs)
        except (RuntimeError, ValueError) as e:
            raise ModelError(f"pocketsphinx could not load its model ({kwargs}): {e}") from e
        self.name = "pocketsphinx" if not arg else f"pocketsphinx:{arg}"

    def transcribe(self, audio: np.ndarray, sr: int) -> list[SpeechSegment]:
        audio = to_mono_16k(audio, sr)
        out = []
        for a_s, b_s in speech_regions(audio):
            words = self._decode(audio[int(a_s * SR):int(b_s * SR)], a_s)
            if words:
                out.append(SpeechSegment(words[0].start_s, words[-1].end_s, " ".join(w.text for w in words),
                                         words=tuple(words)))
        return out

    def _decode(self, audio: np.ndarray, offset_s: float) -> list[Word]:
        d = self._decoder
        # the decoder adapts its feature normalisation across utterances; reset it so a
        # segment decodes the same whatever was decoded before (a resumed run, another
        # worker), which keeps stores from a resumed or parallel ingest equal to one run's
        d.reinit_feat()
        d.start_utt()
        d.process_raw(_pcm16(audio).tobytes(), full_utt=True)
        d.end_utt()
        if d.hyp() is None:
            return []
        words = []
        for seg in d.seg():
            text = _VARIANT.sub("", seg.word)
            if _FILLER.match(text):
                continue
            words.append(Word(
                start_s=round(offset_s + seg.start_frame * _FRAME_S, 3),
                end_s=round(offset_s + (seg.end_frame + 1) * _FRAME_S, 3),
                text=text,
                score=float(min(1.0, max(0.0, seg.prob))),  # posterior probability of the word
            ))
        return words
