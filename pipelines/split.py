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


# Containers whose demuxers keep a per-frame index, where decord seeks exactly (each
# checked frame by frame in the tests). MPEG program/transport streams (.mpg, .ts,
# .m2ts, .vob) and Ogg have no index: decord lands up to half a second off there
# (measured on the GRID .mpg files), so those are decoded by ffmpeg in one pass.
_INDEXED_FORMATS = {"mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "avi", "flv"}
_SEEK_MARGIN_S = 1.0  # the ffmpeg pass seeks this far before the first time asked
_WINDOW_S = 0.25  # ...and converts only frames that start this long before a time
_SLACK_S = 1e-4


class FrameReader:
    """Frames of a video at given times, on the file's timeline.

    A time maps to the frame on screen then (the last frame that starts at or before
    it) through each frame's own presentation timestamp, so variable frame rate is
    handled. Indexed containers (mp4, mov, mkv, webm, avi, flv) are read by seeking
    with decord; others by one ffmpeg decoding pass per ``frames_at`` call.
    ``backend`` forces one ("decord" or "ffmpeg"). Not thread-safe: one reader per thread.
    """

    def __init__(self, path: str | os.PathLike, backend: str = "auto"):
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
        self._fmt_start_s = _float(meta.get("format", {}).get("start_time"))
        # a stream may start after the file does (video after audio): its own clock
        # starts at its first frame, the timeline at the earliest stream
        offset_s = max(0.0, _float(v.get("start_time")) - self._fmt_start_s) if "start_time" in v else 0.0
        fps = _rate(v.get("avg_frame_rate")) or _rate(v.get("r_frame_rate")) or 25.0
        self._fps = fps
        if backend == "auto":
            backend = "decord" if meta.get("format", {}).get("format_name") in _INDEXED_FORMATS else "ffmpeg"
        if backend not in ("decord", "ffmpeg"):
            raise ConfigError(f"unknown frame backend {backend!r}; use 'auto', 'decord' or 'ffmpeg'")
        self.backend = backend
        self._vr = None
        self._closed = False
        # frame_starts_s: each frame's start on the timeline (decord only: the ffmpeg
        # pass learns the times as it decodes)
        self.frame_starts_s: np.ndarray | None = None
        if backend == "decord":
            self._open_decord(offset_s, fps)
        else:
            self.start_s = offset_s
            stream_dur = _float(v.get("duration"))
            self.end_s = offset_s + stream_dur if stream_dur > 0 else _float(meta.get("format", {}).get("duration"))

    def _open_decord(self, offset_s: float, fps: float) -> None:
        import decord

        try:
            self._vr = decord.VideoReader(os.path.abspath(self.path), ctx=decord.cpu(0))
            ts = np.asarray(self._vr.get_frame_timestamp(range(len(self._vr))), dtype=np.float64)
        except (decord.DECORDError, RuntimeError) as e:
            raise InputError(
                f"{self.path}: cannot read video frames ({_decord_reason(e)}); the file may be damaged or truncated"
            ) from e
        if len(ts) == 0:
            raise InputError(f"{self.path}: the video stream has no frames")
        self.frame_starts_s = ts[:, 0] + offset_s
        self.start_s = float(self.frame_starts_s[0])
        # a packet without a duration ends where it starts: give the last frame one
        # frame interval on screen
        self.end_s = max(float(ts[-1, 1]) + offset_s, float(self.frame_starts_s[-1]) + 1.0 / fps)

    def __enter__(self) -> "FrameReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._vr = None
        self._closed = True

    def sample_times(self, clip: Clip, fps: float) -> list[float]:
        """Times ``start_s + (k + 0.5) / fps`` inside the clip where the video has frames.

        At least one time for any clip that overlaps the video (the middle of the
        overlap when the clip is shorter than one sample step); none for a clip past
        the end of the video (a file whose audio outlasts its picture).
        """
        if not (math.isfinite(fps) and fps > 0):
            raise ConfigError(f"frame sampling rate must be positive, got {fps!r}")
        lo = max(clip.start_s, self.start_s)
        hi = min(clip.end_s, self.end_s)
        if hi <= lo:
            return []
        n = math.ceil(clip.duration_s * fps) + 1
        times = [clip.start_s + (k + 0.5) / fps for k in range(n)]
        return [t for t in times if lo <= t < hi] or [(lo + hi) / 2]

    def frames_at(self, times, max_side_px: int | None = None) -> np.ndarray:
        """Frames on screen at ``times`` (seconds): (n, H, W, 3) uint8 RGB, in the order asked.

        With ``max_side_px`` the frames are downscaled, aspect kept, so that the
        longer side is at most that many pixels (never upscaled).
        """
        if self._closed:
            raise ValueError(f"FrameReader for {self.path} is closed")
        times = np.asarray([float(t) for t in times], dtype=np.float64)
        h, w = _fit(self.height, self.width, max_side_px)
        if len(times) == 0:
            return np.zeros((0, h, w, 3), dtype=np.uint8)
        # each distinct time once, in file order: seeking and decoding only go forward
        unique, inverse = np.unique(times, return_inverse=True)
        frames = self._decord_frames(unique) if self.backend == "decord" else self._ffmpeg_frames(unique)
        if (h, w) != frames.shape[1:3]:
            from PIL import Image

            frames = np.stack([
                np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BILINEAR)) for f in frames
            ])
        return frames[inverse.reshape(-1)]

    def _decord_frames(self, times: np.ndarray) -> np.ndarray:
        import decord

        # decord keeps timestamps as float32: a time that is exactly a frame's start
        # may read as just before it, hence the slack
        idx = np.searchsorted(self.frame_starts_s, times + _SLACK_S, side="right") - 1
        idx = np.clip(idx, 0, len(self.frame_starts_s) - 1)
        try:
            frames = self._vr.get_batch(idx.tolist()).asnumpy()
            # after a batch, decord keeps decoding ahead in a background thread without
            # bound (measured: ~500 MB/s of RSS on a 10-minute file while the caller
            # runs face detection); seeking back to the start stops it
            self._vr.seek(0)
            return frames
        except (decord.DECORDError, RuntimeError) as e:
            bad = float(times[0])
            for t, i in zip(times, idx):  # find the first frame that fails, to name its time
                try:
                    self._vr.get_batch([int(i)])
                except (decord.DECORDError, RuntimeError):
                    bad = float(t)
                    break
            raise InputError(
                f"{self.path}: cannot decode the frame at {bad:.3f} s ({_decord_reason(e)}); "
                "the file may be damaged or truncated"
            ) from e

    def _ffmpeg_frames(self, times: np.ndarray) -> np.ndarray:
        # First pass: only frames that start within a short window before a time are
        # converted to RGB and piped (about 40% less CPU at 1 fps than piping all).
        # Times that pass leaves open (a frame on screen longer than the window, a time
        # past the end, a seek that went too far) are decoded again without a window,
        # from near them and at last from the start.
        window_s = max(_WINDOW_S, 2.5 / self._fps)
        found: list[np.ndarray | None] = [None] * len(times)
        reason = ""
        for window, seek_from_start in ((window_s, False), (None, False), (None, True)):
            todo = [i for i, f in enumerate(found) if f is None]
            if not todo:
                break
            sub = times[todo]
            seek_s = 0.0 if seek_from_start else max(0.0, float(sub[0]) - (window or 0.0) - _SEEK_MARGIN_S)
            got, reason = self._ffmpeg_pass(sub, seek_s, window)
            for i, frame in zip(todo, got):
                found[i] = frame
            if seek_s == 0.0 and window is None:
                break
        missing = [i for i, f in enumerate(found) if f is None]
        if missing:
            raise InputError(
                f"{self.path}: cannot decode the frame at {times[missing[0]]:.3f} s ({reason}); "
                "the file may be damaged or truncated"
            )
        return np.stack(found)

    def _ffmpeg_pass(self, times: np.ndarray, seek_s: float, window_s: float | None) -> tuple[list, str]:
        """One decoding pass from ``seek_s``: frames stream through a pipe, their timestamps
        through ffmpeg's showinfo log, and only the frames on screen at ``times`` are kept.

        With ``window_s``, only frames that start at most that long before a time are
        decoded to RGB, and a time with no such frame stays unanswered (None). Returns
        the frame for each time (or None) and ffmpeg's error lines.
        """
        import queue
        import threading

        vf = "showinfo"
        if window_s is not None:
            spans: list[list[float]] = []
            for t in times + self._fmt_start_s:  # select sees the stream's own timestamps
                if spans and t - window_s <= spans[-1][1]:
                    spans[-1][1] = t + _SLACK_S
                else:
                    spans.append([t - window_s, t + _SLACK_S])
            vf = "select='" + "+".join(f"between(t,{a:.6f},{b:.6f})" for a, b in spans) + "',showinfo"
        cmd = [
            "ffmpeg", "-nostdin", "-hide_banner", "-nostats", "-loglevel", "info",
            # -noaccurate_seek: keep the frames between the keyframe and seek_s, one of them
            # may be on screen at the first time; -copyts: keep the stream's own timestamps
            "-noaccurate_seek", "-ss", f"{seek_s:.6f}", "-copyts", "-i", os.path.abspath(self.path),
            "-map", "0:v:0", "-vf", vf, "-vsync", "passthrough",
            "-an", "-sn", "-dn", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1",
        ]
        frame_bytes = self.width * self.height * 3
        starts: queue.Queue = queue.Queue()
        errors: list[str] = []
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError as e:
            raise M3memError("ffmpeg was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)") from e

        def read_log() -> None:
            for raw in proc.stderr:
                line = raw.decode("utf-8", "replace")
                m = re.search(r"Parsed_showinfo.*\bn:\s*\d+\s+pts:\s*\S+\s+pts_time:\s*(\S+)", line)
                if m:
                    starts.put(_float(m.group(1)) - self._fmt_start_s)
                elif "error" in line.lower() or "invalid" in line.lower():
                    errors.append(re.sub(r"^\[[^\]]*@ 0x[0-9a-f]+\]\s*", "", line.strip()))
            starts.put(None)

        def on_screen(t: float, prev, prev_start, first):
            if prev is not None and (window_s is None or prev_start >= t - window_s - _SLACK_S):
                return prev
            if prev is None and first is not None and seek_s == 0.0 and window_s is None:
                return first  # a time before the first frame of the video shows that frame
            return None

        log_reader = threading.Thread(target=read_log, daemon=True)
        log_reader.start()
        out: list[np.ndarray | None] = []
        prev = prev_start = None
        try:
            while len(out) < len(times):
                buf = proc.stdout.read(frame_bytes)
                if len(buf) < frame_bytes:
                    break
                # showinfo logs a frame before the frame is written, so its line is due
                start = starts.get(timeout=60)
                if start is None:
                    break
                frame = np.frombuffer(buf, dtype=np.uint8).reshape(self.height, self.width, 3)
                while len(out) < len(times) and times[len(out)] + _SLACK_S < start:
                    # this frame starts after the time: the previous frame was on screen
                    out.append(on_screen(times[len(out)], prev, prev_start, frame))
                prev, prev_start = frame, start
            while len(out) < len(times):  # the end of the stream: the last frame stays on screen
                out.append(on_screen(times[len(out)], prev, prev_start, None))
        except queue.Empty:
            out += [None] * (len(times) - len(out))
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log_reader.join(timeout=5)
        return out, "; ".join(dict.fromkeys(errors))[:300] or "no frame decoded"


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
