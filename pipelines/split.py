"""Split: media files into clips that are time windows; frames by seeking, audio decoded once.

No clip file is cut. M3-Agent cuts clips with ``ffmpeg -c copy``, which snaps them
to keyframes so they drift; here a clip is ``(start_s, end_s)`` on the file's own
timeline, frames are picked by their presentation timestamps (so variable frame
rate is handled), and the audio is decoded once per file to 16 kHz mono.

The timeline is ffmpeg's: 0 is the file's start time, the moment of its earliest
stream. A video stream that starts later than the audio is shifted by its start
offset, and an audio stream that starts later is padded with silence, so that a
frame and a sample with the same time were meant to be played together.
"""
from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import tempfile
import weakref
from pathlib import Path

import numpy as np

from m3mem.errors import ConfigError, InputError, M3memError
from m3mem.records import Clip, VideoInfo

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MIN_TAIL_S = 1.0  # a shorter remainder joins the previous clip


# --- probing ----------------------------------------------------------------------


def _ffmpeg_reason(stderr: bytes | None, path: str | os.PathLike | None = None) -> str:
    """The error lines of ffmpeg's stderr, without '[demuxer @ 0x...]' and path prefixes."""
    prefix = f"{os.path.abspath(path)}: " if path is not None else None
    lines = []
    for raw in (stderr or b"").decode("utf-8", "replace").splitlines():
        line = re.sub(r"^\[[^\]]*@ 0x[0-9a-f]+\]\s*", "", raw.strip())
        if prefix and line.startswith(prefix):
            line = line[len(prefix):]  # the caller's message names the file
        if not line or line.startswith(("ffprobe version", "ffmpeg version")):
            continue
        if line not in lines:
            lines.append(line)
    text = "; ".join(lines)
    return (text[:300] + "...") if len(text) > 300 else (text or "no details")


def _ffprobe(path: str) -> dict:
    import ffmpeg

    try:
        # -v error: stderr then holds only the reason, not the banner
        return ffmpeg.probe(os.path.abspath(path), v="error")
    except ffmpeg.Error as e:
        raise InputError(
            f"{path} is not a readable video or audio file (ffprobe: {_ffmpeg_reason(e.stderr, path)})"
        ) from e
    except FileNotFoundError as e:
        raise M3memError("ffprobe was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)") from e


def _video_streams(meta: dict) -> list[dict]:
    # cover art in music files (mp3, m4a) is a one-picture "video" stream: not video
    return [
        s for s in meta.get("streams", [])
        if s.get("codec_type") == "video" and not s.get("disposition", {}).get("attached_pic")
    ]


def _float(x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def _rate(r: str | None) -> float:
    num, _, den = (r or "").partition("/")
    try:
        v = float(num) / float(den or 1)
    except (ValueError, ZeroDivisionError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def _rotation_deg(stream: dict) -> int:
    for side in stream.get("side_data_list", []) or []:
        if "rotation" in side:
            return int(_float(side["rotation"])) % 360
    return int(_float(stream.get("tags", {}).get("rotate"))) % 360


def probe(path: str | os.PathLike) -> VideoInfo:
    """What a media file holds, or an InputError that says what is wrong with it.

    ``width``/``height`` are the displayed size (rotation applied, as decoding applies it).
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file; check the path")
    if p.is_dir():
        raise InputError(f"{p} is a directory, not a media file; pass the video files inside it")
    if p.stat().st_size == 0:
        raise InputError(f"{p} is empty (0 bytes); copy or download it again")
    meta = _ffprobe(str(p))
    streams = meta.get("streams", [])
    video = _video_streams(meta)
    audio = [s for s in streams if s.get("codec_type") == "audio"]
    if not video and not audio:
        raise InputError(f"{p} is not a readable video or audio file (it has no video or audio stream)")
    duration = _float(meta.get("format", {}).get("duration"))
    if duration <= 0:
        duration = max((_float(s.get("duration")) for s in video + audio), default=0.0)
    if duration <= 0:
        raise InputError(
            f"{p} has zero or unknown duration (a still image or an empty stream?); "
            "m3mem needs video or audio that plays for some time"
        )
    fps = 0.0
    width = height = 0
    if video:
        v = video[0]
        fps = _rate(v.get("avg_frame_rate")) or _rate(v.get("r_frame_rate"))
        width, height = int(v.get("width") or 0), int(v.get("height") or 0)
        if _rotation_deg(v) in (90, 270):
            width, height = height, width
    return VideoInfo(str(p), float(duration), bool(video), bool(audio), float(fps), width, height)


# --- clip plan --------------------------------------------------------------------


def plan_clips(info: VideoInfo, video_id: str, clip_s: float = 30.0) -> list[Clip]:
    """Consecutive windows of ``clip_s`` seconds covering the whole file.

    No empty trailing clip, and a remainder shorter than ``MIN_TAIL_S`` joins the
    previous clip (65 s -> [0,30] [30,60] [60,65]; 60.4 s -> [0,30] [30,60.4]).
    """
    if not (math.isfinite(clip_s) and clip_s > 0):
        raise ConfigError(f"clip length must be a positive number of seconds, got {clip_s!r}")
    duration = info.duration_s
    if not (math.isfinite(duration) and duration > 0):
        raise InputError(f"{info.path} has zero or unknown duration; nothing to split")
    n = max(1, math.ceil(duration / clip_s - 1e-9))
    starts = [round(i * clip_s, 6) for i in range(n)]
    if n > 1 and duration - starts[-1] < MIN_TAIL_S:
        starts.pop()
    ends = starts[1:] + [round(duration, 6)]
    return [Clip(video_id, i, s, e) for i, (s, e) in enumerate(zip(starts, ends))]


# --- frames -----------------------------------------------------------------------


def _decord_reason(e: Exception) -> str:
    # decord errors carry a C++ log prefix: "[22:51:05] /src/video/video_reader.cc:486: Error: ..."
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[\d:]+\]\s*\S+:\d+:\s*", "", text)


class FrameReader:
    """Frames of a video at given times, decoded by seeking (decord).

    Times map to frames through each frame's own presentation timestamp, so a
    variable-frame-rate file gives the frame that is on screen at that time.
    Not thread-safe: one reader per thread.
    """

    def __init__(self, path: str | os.PathLike, num_threads: int = 0):
        import decord

        self.path = str(path)
        meta = _ffprobe(self.path)
        streams = _video_streams(meta)
        if not streams:
            raise InputError(f"{self.path} has no video stream to read frames from")
        v = streams[0]
        width, height = int(v.get("width") or 0), int(v.get("height") or 0)
        if _rotation_deg(v) in (90, 270):
            width, height = height, width
        self.width, self.height = width, height
        # decord counts time from the video stream's start; the file's timeline starts
        # at its earliest stream (often the audio)
        fmt_start = _float(meta.get("format", {}).get("start_time"))
        offset_s = max(0.0, _float(v.get("start_time")) - fmt_start) if "start_time" in v else 0.0
        try:
            self._vr = decord.VideoReader(os.path.abspath(self.path), ctx=decord.cpu(0), num_threads=num_threads)
            ts = np.asarray(self._vr.get_frame_timestamp(range(len(self._vr))), dtype=np.float64)
        except (decord.DECORDError, RuntimeError) as e:
            raise InputError(
                f"{self.path}: cannot read video frames ({_decord_reason(e)}); the file may be damaged or truncated"
            ) from e
        if len(ts) == 0:
            raise InputError(f"{self.path}: the video stream has no frames")
        self.starts_s = ts[:, 0] + offset_s
        # a packet without a duration ends where it starts; give the last frame one
        # typical frame interval so that it is on screen for a while
        step = float(np.median(np.diff(self.starts_s))) if len(ts) > 1 else 1.0 / (_rate(v.get("avg_frame_rate")) or 25.0)
        self.end_s = max(float(ts[-1, 1]) + offset_s, float(self.starts_s[-1]) + step)

    def __enter__(self) -> "FrameReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._vr = None

    def __len__(self) -> int:
        return len(self.starts_s)

    def sample_times(self, clip: Clip, fps: float) -> list[float]:
        """Times ``start_s + (k + 0.5) / fps`` inside the clip where the video has frames.

        At least one time for any clip that overlaps the video (the middle of the
        overlap when the clip is shorter than one sample step); none for a clip past
        the end of the video (a file whose audio outlasts its picture).
        """
        if not (math.isfinite(fps) and fps > 0):
            raise ConfigError(f"frame sampling rate must be positive, got {fps!r}")
        lo = max(clip.start_s, float(self.starts_s[0]))
        hi = min(clip.end_s, self.end_s)
        if hi <= lo:
            return []
        n = math.ceil(clip.duration_s * fps) + 1
        times = [clip.start_s + (k + 0.5) / fps for k in range(n)]
        return [t for t in times if lo <= t < hi] or [(lo + hi) / 2]

    def frame_indices(self, times) -> np.ndarray:
        """The frame on screen at each time: the last frame that starts at or before it."""
        t = np.asarray(times, dtype=np.float64)
        # 0.1 ms of slack: decord keeps timestamps as float32, so a time that is exactly a
        # frame's start may read as just before it
        idx = np.searchsorted(self.starts_s, t + 1e-4, side="right") - 1
        return np.clip(idx, 0, len(self.starts_s) - 1)

    def frames_at(self, times, max_side_px: int | None = None) -> np.ndarray:
        """Frames on screen at ``times`` (seconds): (n, H, W, 3) uint8 RGB.

        With ``max_side_px`` the frames are downscaled, aspect kept, so that the
        longer side is at most that many pixels (never upscaled).
        """
        import decord

        if self._vr is None:
            raise ValueError(f"FrameReader for {self.path} is closed")
        times = [float(t) for t in times]
        h, w = _fit(self.height, self.width, max_side_px)
        if not times:
            return np.zeros((0, h, w, 3), dtype=np.uint8)
        # decode each distinct frame once, in file order (seeking forward is cheap)
        unique, inverse = np.unique(self.frame_indices(times), return_inverse=True)
        try:
            frames = self._vr.get_batch(unique.tolist()).asnumpy()
        except (decord.DECORDError, RuntimeError) as e:
            bad = self._first_bad_time(times)
            raise InputError(
                f"{self.path}: cannot decode the frame at {bad:.3f} s ({_decord_reason(e)}); "
                "the file may be damaged or truncated"
            ) from e
        if max_side_px and (h, w) != frames.shape[1:3]:
            from PIL import Image

            frames = np.stack([
                np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BILINEAR)) for f in frames
            ])
        return frames[inverse.reshape(-1)]

    def _first_bad_time(self, times: list[float]) -> float:
        import decord

        for t in sorted(times):
            try:
                self._vr.get_batch([int(self.frame_indices([t])[0])])
            except (decord.DECORDError, RuntimeError):
                return t
        return min(times)


def _fit(height: int, width: int, max_side_px: int | None) -> tuple[int, int]:
    if not max_side_px or max(height, width) <= max_side_px:
        return height, width
    scale = max_side_px / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


# --- audio ------------------------------------------------------------------------


class AudioTrack:
    """The whole audio of a file, decoded once to 16 kHz mono float32 in a temporary raw file.

    Slices are read from that file on demand, so memory stays flat however long
    the video: a memory map of the whole file would make every page it touched
    resident (measured: +40 MB peak RSS for 10 minutes read once, 230 MB an hour),
    a positioned read keeps only the slice. The file costs 64 kB of disk per second
    of audio and is deleted on ``close`` (or when the track is garbage-collected).

    A file without an audio stream has no track: ``AudioTrack.open`` returns None.
    Reading slices is thread-safe.
    """

    sr = SAMPLE_RATE

    def __init__(self, path: str, raw_path: str):
        self.path = path
        self._raw_path = raw_path
        self._fd = os.open(raw_path, os.O_RDONLY)
        self.num_samples = os.fstat(self._fd).st_size // 4
        self._finalizer = weakref.finalize(self, _remove_raw, self._fd, raw_path)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        info: VideoInfo | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> "AudioTrack | None":
        """Decode the audio of ``path``; None when the file has no audio stream."""
        import ffmpeg

        path = str(path)
        info = info if info is not None else probe(path)
        if not info.has_audio:
            return None
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
        fd, raw = tempfile.mkstemp(prefix="m3mem-audio-", suffix=".f32", dir=cache_dir)
        os.close(fd)
        try:
            _, err = (
                ffmpeg.input(os.path.abspath(path))
                # first_pts=0 pads a late-starting audio stream with silence, and async
                # fills timestamp gaps, so that sample i is at time i / sr on the file's
                # timeline. rematrix_maxval=1 makes the downmix an average: ffmpeg's default
                # keeps each stereo channel at -3 dB, so a loud stereo track would exceed 1.0.
                .output(raw, format="f32le", acodec="pcm_f32le", ac=1, ar=SAMPLE_RATE,
                        af=f"aresample=async=1:first_pts=0:rematrix_maxval=1:ocl=mono:osr={SAMPLE_RATE}:osf=flt",
                        vn=None, sn=None, dn=None)
                .global_args("-nostdin", "-v", "error")
                .overwrite_output()
                .run(capture_stdout=True, capture_stderr=True)
            )
        except ffmpeg.Error as e:
            _remove_raw(None, raw)
            raise InputError(f"{path}: cannot decode its audio ({_ffmpeg_reason(e.stderr, path)})") from e
        except FileNotFoundError as e:
            _remove_raw(None, raw)
            raise M3memError("ffmpeg was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)") from e
        except BaseException:
            _remove_raw(None, raw)
            raise
        track = cls(path, raw)
        if err and err.strip():
            # a damaged stream still decodes up to the damage; say so, keep what decoded
            log.warning("%s: audio decoded with errors (%s); %.1f of %.1f s decoded",
                        path, _ffmpeg_reason(err, path), track.duration_s, info.duration_s)
        return track

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sr

    def slice(self, start_s: float, end_s: float) -> np.ndarray:
        """Samples in [start_s, end_s) as a float32 copy; shorter where the audio ends."""
        if not self._finalizer.alive:
            raise ValueError(f"AudioTrack for {self.path} is closed")
        a = min(self.num_samples, max(0, int(round(start_s * self.sr))))
        b = min(self.num_samples, max(0, int(round(end_s * self.sr))))
        if b <= a:
            return np.zeros(0, dtype=np.float32)
        buf = os.pread(self._fd, (b - a) * 4, a * 4)
        return np.frombuffer(buf, dtype="<f4").astype(np.float32)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "AudioTrack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove_raw(fd: int | None, raw_path: str) -> None:
    if fd is not None:
        os.close(fd)
    try:
        os.unlink(raw_path)
    except FileNotFoundError:
        pass


# --- clip files -------------------------------------------------------------------


def write_clip_file(src: str | os.PathLike, clip: Clip, dst: str | os.PathLike) -> Path:
    """Re-encode a clip's exact bounds to a file (H.264 + AAC), for backends that need one.

    ``-ss`` before ``-i`` seeks to the keyframe before the start and then decodes and
    drops up to the exact start (ffmpeg's accurate seek when re-encoding), so the
    bounds are exact without decoding the file from its beginning.
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "ffmpeg", "-nostdin", "-v", "error", "-y",
        "-ss", f"{clip.start_s:.6f}", "-i", os.path.abspath(src), "-t", f"{clip.duration_s:.6f}",
        "-map", "0:v:0?", "-map", "0:a:0?",
        "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", "-c:a", "aac",
        str(dst),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True)
    except FileNotFoundError as e:
        raise M3memError("ffmpeg was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)") from e
    if proc.returncode != 0:
        raise InputError(
            f"{src}: cannot write clip {clip.index} ({clip.start_s:.3f}-{clip.end_s:.3f} s) "
            f"to {dst} ({_ffmpeg_reason(proc.stderr, src)})"
        )
    return dst
