"""Split: media files into 30-second clips as time windows, frames by seeking, audio decoded once.

No clip file is cut. M3-Agent cuts clips with ``ffmpeg -c copy``, which snaps
them to keyframes so they drift; here a clip is ``(start_s, end_s)`` and frames
are picked by their own timestamps, so variable frame rate is handled too.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from m3mem.errors import InputError
from m3mem.records import Clip, VideoInfo

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MIN_TAIL_S = 1.0  # a shorter remainder joins the previous clip


def _ffprobe_error(e) -> str:
    text = (getattr(e, "stderr", b"") or b"").decode("utf-8", "replace").strip().splitlines()
    lines = [ln for ln in text if ln.strip() and not ln.startswith(("ffprobe version", "  "))]
    return lines[-1] if lines else "no details"


def probe(path: str | os.PathLike) -> VideoInfo:
    """What the file holds, or an InputError that says what is wrong with it."""
    import ffmpeg

    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    if p.is_dir():
        raise InputError(f"{p} is a folder, not a media file")
    if p.stat().st_size == 0:
        raise InputError(f"{p}: the file is empty")
    try:
        meta = ffmpeg.probe(str(p))
    except ffmpeg.Error as e:
        raise InputError(f"{p.name} is not a readable video or audio file (ffprobe: {_ffprobe_error(e)})") from e
    except FileNotFoundError as e:
        raise InputError("ffprobe was not found; install ffmpeg (apt-get install ffmpeg)") from e
    streams = meta.get("streams", [])
    video = [
        s for s in streams
        if s.get("codec_type") == "video" and not s.get("disposition", {}).get("attached_pic")
    ]
    audio = [s for s in streams if s.get("codec_type") == "audio"]
    if not video and not audio:
        raise InputError(f"{p.name} is not a readable video or audio file (no video or audio stream)")
    duration = _float(meta.get("format", {}).get("duration"))
    if not duration:
        duration = max((_float(s.get("duration")) for s in video + audio), default=0.0)
    if not duration or duration <= 0:
        raise InputError(f"{p.name} is not a readable video or audio file (its duration is zero or unknown)")
    fps = width = height = 0
    if video:
        v = video[0]
        fps = _rate(v.get("avg_frame_rate")) or _rate(v.get("r_frame_rate"))
        width, height = int(v.get("width", 0)), int(v.get("height", 0))
    return VideoInfo(str(p), float(duration), bool(video), bool(audio), float(fps), width, height)


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _rate(r: str | None) -> float:
    if not r or r in ("0/0",):
        return 0.0
    num, _, den = r.partition("/")
    try:
        return float(num) / float(den or 1)
    except (ValueError, ZeroDivisionError):
        return 0.0


def plan_clips(info: VideoInfo, video_id: str, clip_s: float = 30.0) -> list[Clip]:
    n = max(1, math.ceil(info.duration_s / clip_s - 1e-9))
    bounds = [min(i * clip_s, info.duration_s) for i in range(n)] + [info.duration_s]
    if n > 1 and bounds[-1] - bounds[-2] < MIN_TAIL_S:
        bounds.pop(-2)
    return [Clip(video_id, i, round(bounds[i], 6), round(bounds[i + 1], 6)) for i in range(len(bounds) - 1)]


class FrameReader:
    """Frames at given times, decoded by seeking (decord), mapped through each frame's own timestamp."""

    def __init__(self, path: str, max_side_px: int | None = None):
        import decord

        self.path = path
        try:
            probe_reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
            h, w = probe_reader[0].shape[:2] if len(probe_reader) else (0, 0)
            size = {}
            if max_side_px and max(h, w) > max_side_px:
                scale = max_side_px / max(h, w)
                size = {"width": int(round(w * scale / 2) * 2), "height": int(round(h * scale / 2) * 2)}
            self._vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1, **size) if size else probe_reader
            self._starts = np.asarray(self._vr.get_frame_timestamp(range(len(self._vr))))[:, 0]
        except (decord.DECORDError, RuntimeError, IndexError) as e:
            raise InputError(f"{Path(path).name}: cannot decode video frames ({e})") from e
        if len(self._starts) == 0:
            raise InputError(f"{Path(path).name}: the video stream has no frames")

    def __enter__(self) -> "FrameReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._vr = None

    def __len__(self) -> int:
        return len(self._starts)

    @staticmethod
    def sample_times(clip: Clip, fps: float) -> list[float]:
        """Times ``start + (k + 0.5) / fps`` inside the clip; at least one for any clip."""
        step = 1.0 / fps
        n = max(1, int(math.floor(clip.duration_s * fps + 1e-9)))
        times = [clip.start_s + (k + 0.5) * step for k in range(n)]
        return [t for t in times if t < clip.end_s] or [clip.start_s + clip.duration_s / 2]

    def frame_indices(self, times: list[float]) -> np.ndarray:
        """The frame shown at each time: the last frame that starts at or before it."""
        idx = np.searchsorted(self._starts, np.asarray(times) + 1e-6, side="right") - 1
        return np.clip(idx, 0, len(self._starts) - 1)

    def frames_at(self, times: list[float], max_side_px: int | None = None) -> np.ndarray:
        """(n, H, W, 3) uint8 RGB."""
        import decord

        idx = self.frame_indices(times)
        try:
            frames = self._vr.get_batch(idx.tolist()).asnumpy()
        except (decord.DECORDError, RuntimeError) as e:
            raise InputError(
                f"{Path(self.path).name}: cannot decode frames near {times[0]:.1f}-{times[-1]:.1f} s ({e})"
            ) from e
        if max_side_px and max(frames.shape[1:3]) > max_side_px:
            from PIL import Image

            h, w = frames.shape[1:3]
            scale = max_side_px / max(h, w)
            size = (max(1, int(w * scale)), max(1, int(h * scale)))
            frames = np.stack([np.asarray(Image.fromarray(f).resize(size, Image.BILINEAR)) for f in frames])
        return frames


class AudioTrack:
    """The whole audio of a file, decoded once to 16 kHz mono float32 in a memory-mapped temp file.

    Memory stays flat however long the file: slices are read from the map.
    """

    sr = SAMPLE_RATE

    def __init__(self, path: str, raw_path: Path, tmpdir: Path | None):
        self.path = path
        self._raw = raw_path
        self._tmpdir = tmpdir
        n = raw_path.stat().st_size // 4
        self._data = np.memmap(raw_path, dtype="<f4", mode="r", shape=(n,)) if n else np.zeros(0, np.float32)

    @classmethod
    def open(cls, path: str, info: VideoInfo | None = None, cache_dir: str | os.PathLike | None = None) -> "AudioTrack | None":
        """None when the file has no audio stream."""
        if info is not None and not info.has_audio:
            return None
        tmpdir = Path(tempfile.mkdtemp(prefix="m3mem-audio-", dir=cache_dir))
        raw = tmpdir / "audio.f32"
        import ffmpeg

        try:
            (
                ffmpeg.input(str(path))
                .output(str(raw), format="f32le", acodec="pcm_f32le", ac=1, ar=SAMPLE_RATE, vn=None)
                .global_args("-nostdin", "-v", "error")
                .overwrite_output()
                .run(capture_stdout=True, capture_stderr=True)
            )
        except ffmpeg.Error as e:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise InputError(f"{Path(path).name}: cannot decode audio ({_ffprobe_error(e)})") from e
        except FileNotFoundError as e:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise InputError("ffmpeg was not found; install ffmpeg (apt-get install ffmpeg)") from e
        return cls(str(path), raw, tmpdir)

    @property
    def duration_s(self) -> float:
        return len(self._data) / self.sr

    def slice(self, start_s: float, end_s: float) -> np.ndarray:
        a = max(0, int(round(start_s * self.sr)))
        b = min(len(self._data), int(round(end_s * self.sr)))
        return np.array(self._data[a:b], dtype=np.float32) if b > a else np.zeros(0, np.float32)

    def close(self) -> None:
        self._data = np.zeros(0, np.float32)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "AudioTrack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_clip_file(src: str | os.PathLike, clip: Clip, dst: str | os.PathLike) -> Path:
    """Re-encode a clip's exact bounds to a file, for backends that need one.

    Seeking after ``-i`` decodes from the previous keyframe, so the bounds are exact.
    """
    dst = Path(dst)
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(src), "-ss", f"{clip.start_s:.3f}",
           "-to", f"{clip.end_s:.3f}", "-c:v", "libx264", "-preset", "veryfast", "-c:a", "aac", str(dst)]
    proc = subprocess.run(cmd, capture_output=True)
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"{Path(src).name}: cannot write clip {clip.index} ({msg[-1] if msg else 'ffmpeg failed'})")
    return dst
