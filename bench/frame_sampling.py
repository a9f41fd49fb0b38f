"""Frame sampling: m3mem's FrameReader against M3-Agent's way, on one 30-second clip.

M3-Agent reads a clip's frames with moviepy, one ``VideoFileClip.get_frame(t)`` per
frame at 5 fps. m3mem seeks with decord and decodes each needed frame once, in file
order (``pipelines.split.FrameReader``). Both get the same times, at full resolution,
from the same file, and the frames they return are compared, so the two did the same
work. A third row shows m3mem as ingest configures it (1 fps, frames at most 960 px).

    python bench/frame_sampling.py [--size ci|full]
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import REPO, bench_main  # noqa: E402  (path set above)

SOURCE = REPO.parent / "shared" / "data" / "vv_interview_2spk.mp4"  # 1280x720, 17.6 s
CLIP_S = 30.0
FPS = 5.0
SIZES = {"ci": {"repeats": 1}, "full": {"repeats": 5}}


def make_clip(out: Path, source: Path = SOURCE) -> Path:
    """A 30 s, 720p H.264 clip: the real interview, looped."""
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing; the benchmark reads the shared test media (see the README)")
    if shutil.which("ffmpeg") is None:
        raise FileNotFoundError("ffmpeg is not installed")
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-stream_loop", "-1", "-i", str(source), "-t", str(CLIP_S),
                    "-c:v", "libx264", "-preset", "veryfast", "-g", "250", "-c:a", "aac", str(out)],
                   check=True, capture_output=True)
    return out


def m3mem_frames(path: Path, times: list[float], max_side_px: int | None = None) -> np.ndarray:
    from pipelines.split import FrameReader

    with FrameReader(path) as reader:
        return reader.frames_at(times, max_side_px=max_side_px)


def m3mem_backend(path: Path) -> str:
    """Which decoder FrameReader picks for this file (it chooses by container)."""
    from pipelines.split import FrameReader

    with FrameReader(path) as reader:
        return getattr(reader, "backend", "decord")


def moviepy_frames(path: Path, times: list[float]) -> np.ndarray:
    from moviepy import VideoFileClip

    clip = VideoFileClip(str(path))
    try:
        return np.stack([clip.get_frame(t) for t in times])
    finally:
        clip.close()


def _time(fn, repeats: int):
    walls, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def run(size: str = "ci") -> dict:
    repeats = SIZES[size]["repeats"]
    times = [k / FPS for k in range(int(CLIP_S * FPS))]  # M3-Agent's times: 0, 0.2, ... 29.8
    notes = []
    with tempfile.TemporaryDirectory(prefix="m3mem-bench-") as tmp:
        clip = make_clip(Path(tmp) / "clip30.mp4")
        rows = []
        try:
            import moviepy  # noqa: F401
            base_s, base_frames = _time(lambda: moviepy_frames(clip, times), repeats)
        except ImportError:
            base_s, base_frames = None, None
            notes.append("moviepy is not installed (pip install 'm3mem[bench]'): no baseline, no ratio")
        m3_s, m3_frames = _time(lambda: m3mem_frames(clip, times), repeats)
        default_times = [(k + 0.5) for k in range(int(CLIP_S))]
        cfg_s, cfg_frames = _time(lambda: m3mem_frames(clip, default_times, max_side_px=960), repeats)
        diff = None
        if base_frames is not None:
            if base_frames.shape != m3_frames.shape:
                raise RuntimeError(f"the two readers disagree on the frames: {base_frames.shape} vs {m3_frames.shape}")
            diff = float(np.abs(base_frames.astype(np.int16) - m3_frames.astype(np.int16)).mean())

        def row(method: str, wall_s: float | None, frames: np.ndarray | None, fps: float) -> dict:
            if wall_s is None:
                return {"method": method, "fps": fps}
            return {
                "method": method, "fps": fps, "frames": int(len(frames)),
                "size": f"{frames.shape[2]}x{frames.shape[1]}", "wall_s": wall_s,
                "ms_per_frame": 1000 * wall_s / len(frames),
                "speedup": (base_s / wall_s) if base_s else None,
            }

        rows.append(row("M3-Agent style: moviepy get_frame", base_s, base_frames, FPS))
        rows.append(row(f"m3mem FrameReader ({m3mem_backend(clip)})", m3_s, m3_frames, FPS))
        rows.append(row("m3mem as ingest runs it (<=960 px)", cfg_s, cfg_frames, 1.0))
        rows[-1]["speedup"] = None  # other work than the baseline: no ratio
        if diff is not None:
            notes.append(f"mean absolute pixel difference between the two readers' frames: {diff:.2f} of 255")
    notes.append(f"one 30 s clip of {SOURCE.name} looped, 1280x720 H.264; open + decode; median of {repeats}")
    return {
        "name": "frame_sampling",
        "title": "Frame sampling of one 30 s clip at 5 fps",
        "columns": [("method", "method"), ("fps", "fps"), ("frames", "frames"), ("size", "frame size"),
                    ("wall_s", "wall s"), ("ms_per_frame", "ms/frame"), ("speedup", "x baseline")],
        "rows": rows,
        "notes": notes,
        "pixel_difference": diff,
    }


if __name__ == "__main__":
    bench_main(run, __doc__)
