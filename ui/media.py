"""Files for the browser: where uploads go, which server paths may be read, what a clip plays from.

Everything the app reads or writes on the server passes through here:

- uploads are moved into ``<store>/uploads`` under a cleaned name and refused
  over the size limit;
- a server path is accepted only inside a folder the operator allowed (after
  resolving symlinks, so a link cannot lead out), and a folder yields only the
  media files inside it that stay inside;
- a cited clip plays from its source file when the browser can play that file
  and the app may serve it; otherwise from an excerpt of the clip re-encoded
  once into ``<store>/ui-cache``;
- voice samples are cut straight from the source with ffmpeg (a seek, not a
  decode of the whole file) and never touch the disk.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import subprocess
import threading
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from m3mem.errors import InputError, M3memError

log = logging.getLogger(__name__)

UPLOADS = "uploads"
CACHE = "ui-cache"
SAMPLE_RATE = 16000

# What Chromium, Firefox and Safari all play without plugins.
_VIDEO_CONTAINERS = {".mp4", ".m4v", ".mov", ".webm"}
_AUDIO_CONTAINERS = {".wav", ".mp3", ".m4a", ".ogg", ".oga", ".opus", ".flac", ".webm", ".aac"}
_VIDEO_CODECS = {"h264", "vp8", "vp9", "av1"}
_AUDIO_CODECS = {"aac", "mp3", "opus", "vorbis", "flac", "pcm_s16le", "pcm_s24le", "pcm_f32le", "pcm_u8"}


def _media_extensions() -> set[str]:
    from pipelines.ingest import MEDIA_EXTENSIONS

    return set(MEDIA_EXTENSIONS)


# --- uploads -------------------------------------------------------------------


def safe_name(name: str) -> str:
    """A file name with no folder part and no characters a shell or URL would trip on."""
    base = Path(name.replace("\\", "/")).name
    stem, suffix = os.path.splitext(base)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "upload"
    suffix = re.sub(r"[^A-Za-z0-9.]+", "", suffix).lower()
    return f"{stem[:100]}{suffix[:10]}"


def accept_upload(store_dir: Path, temp_path: str | os.PathLike, original_name: str, max_bytes: int) -> Path:
    """Move an uploaded file into ``<store>/uploads``; the same content keeps one copy."""
    src = Path(temp_path)
    size = src.stat().st_size
    if size > max_bytes:
        raise InputError(f"{original_name} is {size / 2**20:.1f} MB, over this server's upload limit of "
                         f"{max_bytes / 2**20:.0f} MB; ask the operator to raise --max-upload-mb or ingest it "
                         f"from a server folder")
    if size == 0:
        raise InputError(f"{original_name} is empty")
    folder = (store_dir / UPLOADS).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    name = safe_name(original_name)
    dst = folder / name
    digest = _sha256(src)
    n = 1
    while dst.exists():
        if _sha256(dst) == digest:
            src.unlink(missing_ok=True)
            _remove_if_empty(src.parent)
            return dst
        n += 1
        stem, suffix = os.path.splitext(name)
        dst = folder / f"{stem}-{n}{suffix}"
    if dst.resolve().parent != folder:
        raise InputError(f"{original_name}: cannot store an upload outside {folder}")
    shutil.move(str(src), dst)
    _remove_if_empty(src.parent)
    return dst


def _remove_if_empty(folder: Path) -> None:
    """Gradio gives each upload a folder of its own; drop it once the file has moved out."""
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty, or not ours to remove


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- server paths --------------------------------------------------------------


def inside(path: Path, roots: list[Path]) -> bool:
    """Whether ``path`` (resolved, symlinks followed) lies in one of ``roots`` (resolved)."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return any(real == r or r in real.parents for r in roots)


def server_files(text: str, allowed: list[Path]) -> list[Path]:
    """The media files a server path names, refused unless inside an allowed folder."""
    if not allowed:
        raise InputError("this server does not read server paths; upload the file, or start "
                         "'m3mem serve' with --allow DIR to allow a folder")
    raw = text.strip().strip('"').strip("'")
    if not raw:
        raise InputError("type a file or folder path on the server")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise InputError(f"{raw}: give an absolute path (it must lie inside {_roots_text(allowed)})")
    if not path.exists():
        raise InputError(f"{path}: no such file or folder on the server")
    if not inside(path, allowed):
        raise InputError(f"{path} is outside the folders this server allows ({_roots_text(allowed)})")
    if path.is_file():
        return [path.resolve()]
    exts = _media_extensions()
    found = []
    for folder, dirs, files in os.walk(path.resolve(), followlinks=False):
        dirs.sort()
        for name in sorted(files):
            f = Path(folder) / name
            if f.suffix.lower() in exts and inside(f, allowed):
                found.append(f.resolve())
    if not found:
        raise InputError(f"{path} holds no media files ({', '.join(sorted(exts))})")
    return found


def _roots_text(roots: list[Path]) -> str:
    return ", ".join(str(r) for r in roots) or "none"


# --- clip playback -------------------------------------------------------------


@dataclass(frozen=True)
class ClipMedia:
    path: Path          # the file the browser loads
    start_s: float      # where the clip starts in that file
    end_s: float
    kind: str           # video | audio


_probe_cache: dict[tuple[str, float], tuple[bool, bool, bool]] = {}
_encode_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _streams(path: Path) -> tuple[bool, bool, bool]:
    """(has video, has audio, a browser plays it as it is)."""
    key = (str(path), path.stat().st_mtime)
    if key in _probe_cache:
        return _probe_cache[key]
    import ffmpeg

    try:
        meta = ffmpeg.probe(str(path))
    except ffmpeg.Error as e:
        raise InputError(f"{path}: cannot read it for playback ({e.stderr.decode('utf-8', 'replace')[-200:]})") from e
    video = [s.get("codec_name") for s in meta.get("streams", [])
             if s.get("codec_type") == "video" and not s.get("disposition", {}).get("attached_pic")]
    audio = [s.get("codec_name") for s in meta.get("streams", []) if s.get("codec_type") == "audio"]
    ext = path.suffix.lower()
    if video:
        ok = ext in _VIDEO_CONTAINERS and video[0] in _VIDEO_CODECS and (not audio or audio[0] in _AUDIO_CODECS)
    else:
        ok = ext in _AUDIO_CONTAINERS and bool(audio) and audio[0] in _AUDIO_CODECS
    _probe_cache[key] = (bool(video), bool(audio), ok)
    return _probe_cache[key]


def clip_media(store_dir: Path, source: str, video_id: int, start_s: float, end_s: float,
               servable: list[Path]) -> ClipMedia:
    """What the browser plays for a clip: the source at the clip's start, or a re-encoded excerpt."""
    src = Path(source)
    if not src.is_file():
        raise InputError(f"the source of this clip is gone from the server ({src})")
    has_video, _, playable = _streams(src)
    kind = "video" if has_video else "audio"
    if playable and inside(src, servable):
        return ClipMedia(src.resolve(), start_s, end_s, kind)
    cache = store_dir / CACHE
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"video{video_id}_{int(round(start_s * 1000))}_{int(round(end_s * 1000))}.{'mp4' if has_video else 'wav'}"
    with _locks_guard:
        lock = _encode_locks.setdefault(str(out), threading.Lock())
    with lock:
        if not out.exists():
            _excerpt(src, start_s, end_s, out, has_video)
    return ClipMedia(out.resolve(), 0.0, end_s - start_s, kind)


def _excerpt(src: Path, start_s: float, end_s: float, out: Path, has_video: bool) -> None:
    tmp = out.with_name(out.stem + ".part" + out.suffix)
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-ss", f"{start_s:.3f}", "-i", str(src),
           "-t", f"{end_s - start_s:.3f}", "-map", "0:v:0?", "-map", "0:a:0?"]
    if has_video:
        # faststart puts the index first, so the browser can play before the whole file arrives
        cmd += ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", "-vf",
                "scale=trunc(iw/2)*2:trunc(ih/2)*2", "-c:a", "aac", "-movflags", "+faststart"]
    else:
        cmd += ["-c:a", "pcm_s16le"]
    cmd.append(str(tmp))
    try:
        proc = subprocess.run(cmd, capture_output=True)
    except FileNotFoundError as e:
        raise M3memError("ffmpeg was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)") from e
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        reason = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"{src.name}: cannot make a playable excerpt of {start_s:.1f}-{end_s:.1f} s "
                         f"({reason[-1] if reason else 'ffmpeg failed'})")
    os.replace(tmp, out)


def drop_cached_excerpts(store_dir: Path) -> None:
    shutil.rmtree(store_dir / CACHE, ignore_errors=True)


# --- voice samples -------------------------------------------------------------


def voice_sample_wav(source: str, start_s: float, end_s: float, max_s: float = 3.0) -> bytes:
    """A short mono 16 kHz WAV of ``source`` from ``start_s``; ffmpeg seeks instead of decoding it all."""
    dur = max(0.2, min(end_s - start_s, max_s))
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-ss", f"{max(0.0, start_s):.3f}", "-i", str(source),
           "-t", f"{dur:.3f}", "-vn", "-ac", "1", "-ar", str(SAMPLE_RATE), "-f", "f32le", "-"]
    try:
        proc = subprocess.run(cmd, capture_output=True)
    except FileNotFoundError as e:
        raise M3memError("ffmpeg was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)") from e
    if proc.returncode != 0:
        reason = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"{Path(source).name}: cannot cut a voice sample ({reason[-1] if reason else 'ffmpeg failed'})")
    return wav_bytes(np.frombuffer(proc.stdout, dtype="<f4"), SAMPLE_RATE)


def wav_bytes(audio: np.ndarray, sr: int) -> bytes:
    pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()
