"""Ingestion benchmark: real-time factor and peak memory, 1 and 2 workers, short archive and long videos.

    python bench/ingest_bench.py            # GRID archive, a generated 10-minute and 2-hour video
    python bench/ingest_bench.py --quick    # CI: a smaller archive, generated 1- and 4-minute videos

Each run is ``m3mem ingest ... --json`` in a fresh process on a fresh store.
Times: "command s" is the whole command (imports, models, Ray); "ingest s" is the
report's ``wall_s``; "start-up s" is the part of it that Ray start-up and the
workers' model loading took (with one worker, models load during the first
clip). Real-time factor is ingest time over media duration, and "after
start-up" leaves start-up out; lower is faster.
Peak memory is sampled every 0.1 s from /proc: the driver process alone, and
the driver with every process it started (with 2 workers: Ray's processes and
the worker actors).

The long videos are generated (ffmpeg test pattern, 96x64 pixels at 2 fps, a
silent audio track) and ingested with ``frame_fps=0.2``: they measure what the
pipeline itself costs per clip and whether memory grows with the length of a
video (it must not), not what the models cost. The archive runs measure the
models on real media (GRID clips: faces and speech).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass
class Run:
    name: str
    workers: int
    media_s: float
    clips: int
    command_s: float
    wall_s: float
    startup_s: float
    rtf: float
    rtf_after_startup: float
    driver_peak_mb: float
    total_peak_mb: float
    failed: int


def generated_video(out: Path, seconds: int) -> Path:
    """A test pattern with a silent audio track: tiny frames, low frame rate, any length."""
    if not out.exists():
        subprocess.run([
            "ffmpeg", "-y", "-loglevel", "error",
            "-f", "lavfi", "-i", f"testsrc2=size=96x64:rate=2:duration={seconds}",
            "-f", "lavfi", "-i", f"anullsrc=r=16000:cl=mono:d={seconds}",
            "-c:v", "libx264", "-preset", "ultrafast", "-g", "60", "-c:a", "aac", "-b:a", "16k", "-shortest",
            str(out),
        ], check=True)
    return out


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE_KB
    except (OSError, ValueError, IndexError):
        return 0


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    # the command name may hold spaces; the fields after its closing ')' are fixed
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        out.extend(kids)
        frontier.extend(kids)
    return out


class PeakMemory:
    """Samples the RSS of a process and of it with its descendants until stopped."""

    def __init__(self, pid: int, every_s: float = 0.1):
        self.pid, self.every_s = pid, every_s
        self.driver_kb = self.total_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            driver = _rss_kb(self.pid)
            total = driver + sum(_rss_kb(p) for p in _descendants(self.pid))
            self.driver_kb, self.total_kb = max(self.driver_kb, driver), max(self.total_kb, total)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_ingest(name: str, paths: list[Path], workers: int, work: Path, extra: list[str]) -> Run:
    store = Path(tempfile.mkdtemp(prefix="store-", dir=work))
    cmd = [sys.executable, "-m", "m3mem", "ingest", *map(str, paths), "--store", str(store), "--json", *extra]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    log = work / f"{name.replace(' ', '_')}-{workers}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=REPO,
                                start_new_session=True)
        t0 = time.perf_counter()
        peak = PeakMemory(proc.pid)
        out, _ = proc.communicate()
        command_s = time.perf_counter() - t0
        peak.stop()
    if proc.returncode not in (0, 1) or not out.strip():
        raise SystemExit(f"{name} with {workers} workers failed (exit {proc.returncode}); see {log}")
    report = json.loads(out)
    media_s = sum(f["duration_s"] for f in report["files"])
    startup_s = (report.get("cluster") or {}).get("startup_s", 0.0)
    shutil.rmtree(store, ignore_errors=True)
    return Run(name, workers, media_s, report["clips_done"], command_s, report["wall_s"], startup_s,
               report["real_time_factor"] or 0.0, (report["wall_s"] - startup_s) / media_s if media_s else 0.0,
               peak.driver_kb / 1024, peak.total_kb / 1024, report["clips_failed"])


def table(runs: list[Run]) -> str:
    head = ("media", "workers", "media s", "clips", "command s", "ingest s", "start-up s", "real-time factor",
            "after start-up", "peak MB (driver)", "peak MB (all processes)")
    rows = [(r.name, str(r.workers), f"{r.media_s:.0f}", str(r.clips), f"{r.command_s:.1f}", f"{r.wall_s:.1f}",
             f"{r.startup_s:.1f}", f"{r.rtf:.3f}", f"{r.rtf_after_startup:.3f}", f"{r.driver_peak_mb:.0f}",
             f"{r.total_peak_mb:.0f}") for r in runs]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small inputs, for CI (about 5 minutes on 2 cores)")
    ap.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    ap.add_argument("--work", help="folder for generated media and stores (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print the runs as JSON after the table")
    args = ap.parse_args(argv)
    if shutil.which("ffmpeg") is None:
        raise SystemExit("ffmpeg is not installed")
    grid = sorted((DATA / "grid").glob("*.mpg"))
    if not grid:
        raise SystemExit(f"the GRID clips are missing from {DATA / 'grid'} (see the README)")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="m3mem-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    workers = [int(w) for w in args.workers.split(",")]

    if args.quick:
        archive, short_s, long_s = grid[:4], 60, 240
    else:
        archive, short_s, long_s = grid, 600, 7200
    long_args = ["--set", "frame_fps=0.2"]
    cases = [
        (f"GRID archive ({len(archive)} files)", archive, []),
        (f"generated {short_s // 60} min", [generated_video(work / f"generated_{short_s}s.mp4", short_s)], long_args),
        (f"generated {long_s // 60} min" if long_s < 3600 else f"generated {long_s // 3600} h",
         [generated_video(work / f"generated_{long_s}s.mp4", long_s)], long_args),
    ]
    runs = []
    for name, paths, extra in cases:
        for n in workers:
            print(f"running: {name}, {n} worker{'s' if n > 1 else ''} ...", file=sys.stderr, flush=True)
            runs.append(run_ingest(name, paths, n, work, extra))
    print(table(runs))
    if args.json:
        print(json.dumps([r.__dict__ for r in runs], indent=2))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.failed for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
