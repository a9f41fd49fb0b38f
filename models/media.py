"""Media helpers for the chat backends: message parts to JPEG data URLs, WAV bytes,
sampled frames and 16 kHz audio.

Message parts follow ``models.base``: ``text``, ``image`` (RGB uint8 array),
``video`` (``frames`` + ``fps``) and ``audio`` (float32 samples + ``sr``).
"""
from __future__ import annotations

import base64
import io
import wave
from typing import Sequence

import numpy as np

from m3mem.errors import InputError

PART_TYPES = ("text", "image", "video", "audio")


def parts_of(message: dict) -> list[dict]:
    """The content of a chat message as a list of parts; a plain string is one text part."""
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InputError(f"chat message content must be a string or a list of parts, got {type(content).__name__}")
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in PART_TYPES:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InputError(f"unknown chat message part {kind!r}; parts are one of {', '.join(PART_TYPES)}")
    return content


def as_rgb_uint8(image: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8; grey images are expanded and RGBA loses its alpha."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4) or a.shape[0] == 0 or a.shape[1] == 0:
        raise InputError(f"an image must be an (H, W, 3) RGB array, got shape {a.shape}")
    a = a[:, :, :3]
    if a.dtype != np.uint8:
        if np.issubdtype(a.dtype, np.floating) and a.size and float(np.nanmax(a)) <= 1.0:
            a = a * 255.0  # float images in [0, 1]
        a = np.clip(np.nan_to_num(a), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a)


def jpeg_bytes(image: np.ndarray, quality: int = 90, max_side_px: int | None = None) -> bytes:
    from PIL import Image

    pil = Image.fromarray(as_rgb_uint8(image))
    if max_side_px and max(pil.size) > max_side_px:
        scale = max_side_px / max(pil.size)
        pil = pil.resize((max(1, round(pil.width * scale)), max(1, round(pil.height * scale))), Image.BILINEAR)
    buf = io.BytesIO()
    pil.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def jpeg_data_url(image: np.ndarray, quality: int = 90, max_side_px: int | None = None) -> str:
    """``data:image/jpeg;base64,...``: the OpenAI vision format for inline images."""
    return "data:image/jpeg;base64," + base64.b64encode(jpeg_bytes(image, quality, max_side_px)).decode("ascii")


def decode_jpeg(data: bytes) -> np.ndarray:
    """JPEG bytes (for example ``FaceTrack.crop_jpeg``) to an RGB uint8 array."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def as_mono_float32(audio: np.ndarray) -> np.ndarray:
    a = np.asarray(audio)
    if a.ndim == 2:
        # (samples, channels) or (channels, samples): average the shorter axis away
        a = a.mean(axis=1 if a.shape[1] <= a.shape[0] else 0)
    if a.ndim != 1:
        raise InputError(f"audio must be a 1-d array of samples, got shape {a.shape}")
    if np.issubdtype(a.dtype, np.integer):
        a = a.astype(np.float32) / float(np.iinfo(a.dtype).max)
    return np.ascontiguousarray(a, dtype=np.float32)


def wav_bytes(audio: np.ndarray, sr: int) -> bytes:
    """16-bit PCM mono WAV (the format OpenAI's ``input_audio`` parts accept)."""
    a = np.clip(as_mono_float32(audio), -1.0, 1.0)
    pcm = (a * 32767.0).round().astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sr))
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def resample(audio: np.ndarray, sr: int, target_sr: int) -> np.ndarray:
    """Polyphase resampling to ``target_sr`` (processors such as Whisper's expect 16 kHz)."""
    a = as_mono_float32(audio)
    if int(sr) == int(target_sr) or a.size == 0:
        return a
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(int(sr), int(target_sr))
    return resample_poly(a, int(target_sr) // g, int(sr) // g).astype(np.float32)


def sample_frames(frames: Sequence[np.ndarray], fps: float, max_frames: int) -> list[tuple[float, np.ndarray]]:
    """At most ``max_frames`` frames spread evenly over the clip, each with its time in
    seconds from the first frame (frame i of a clip sampled at ``fps`` is at i / fps)."""
    n = len(frames)
    if n == 0 or max_frames <= 0:
        return []
    if fps <= 0:
        raise InputError(f"a video part needs a positive fps, got {fps}")
    if n <= max_frames:
        idx = list(range(n))
    else:
        idx = sorted(set(int(round(x)) for x in np.linspace(0, n - 1, max_frames)))
    return [(i / fps, frames[i]) for i in idx]
