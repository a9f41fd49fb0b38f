"""Shared by the ingestion tests: real media, CLI runs, and a canonical dump of a store.

The canonical dump is for tests that demand two stores be the same.

Everything a reader of the store can see is in it: videos, clips (status,
cached perception, identity), nodes (ids, text, weight, and their order within
each kind), edges with weights, embeddings with their vectors byte for byte (in
arrival order within each space), appearances, face crops and the id counters.
Left out: SQLite row ids that only number rows across kinds, timestamps and
the journal, which records when things happened, not what is stored.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
GRID = DATA / "grid"

# Numeric libraries (dlib's BLAS, torch) give results that differ in the last bits with the
# number of threads; Ray gives each one-CPU worker one thread. Every run in these tests uses
# one thread, so stores from one process and from Ray workers can be compared byte for byte.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
# short clips: more clips, so more stage and file boundaries, from a few seconds of media
CLIP_ARGS = ("--set", "clip_seconds=3")


def skip_without_media(pytest) -> None:
    if not GRID.is_dir():
        pytest.skip(f"real media not found at {DATA} (see the README)", allow_module_level=True)
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed", allow_module_level=True)


def joined_grid(out: Path, names: list[str]) -> Path:
    """One video of several GRID clips (3 s each, a different speaker each) joined end to end."""
    if out.exists():
        return out
    listing = out.with_suffix(".txt")
    listing.write_text("".join(f"file '{GRID / n}'\n" for n in names))
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-f", "concat", "-safe", "0", "-i", str(listing),
                    "-c:v", "libx264", "-preset", "veryfast", "-c:a", "aac", str(out)], check=True)
    return out


BATCH_CLIPS = 8


def batch(base: Path) -> list[Path]:
    """A small archive: a four-clip video and four single-clip files (eight clips, five files).

    pwij3p and swwp2s look like the same man, so identities must carry across files.
    """
    base.mkdir(parents=True, exist_ok=True)
    video = joined_grid(base / "four_speakers.mp4", ["lrwp9a.mpg", "pwij3p.mpg", "sbia1a.mpg", "lbax4n.mpg"])
    return [video, GRID / "bbaf2n.mpg", GRID / "brbk7n.mpg", GRID / "sbwe5n.mpg", GRID / "swwp2s.mpg"]


def m3mem_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "m3mem", *args]


def ingest(paths, store: Path, *extra: str, timeout: float = 900) -> tuple[int, dict | None, str]:
    """``m3mem ingest PATHS --store STORE --json`` in a fresh process: exit status, report, stderr."""
    out = subprocess.run(m3mem_cmd("ingest", *map(str, paths), "--store", str(store), "--json", *CLIP_ARGS, *extra),
                         capture_output=True, text=True, env=ENV, cwd=REPO, timeout=timeout)
    try:
        report = json.loads(out.stdout) if out.stdout.strip() else None
    except json.JSONDecodeError:
        report = None
    return out.returncode, report, out.stderr


def reference_store(base: Path, paths) -> Path:
    """The store one uninterrupted single-process run makes of ``paths`` (built once per test session)."""
    key = hashlib.sha256("\n".join(map(str, paths)).encode()).hexdigest()[:12]
    store = base / f"reference-{key}"
    if not (store / "done").exists():
        shutil.rmtree(store, ignore_errors=True)
        rc, report, err = ingest(paths, store)
        assert rc == 0, f"the reference run failed: {err[-3000:]}"
        (store / "done").write_text(json.dumps(report))
    return store


def canonical_dump(store_dir: str | Path) -> dict:
    db = Path(store_dir) / "memory.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        q = lambda sql: [tuple(r) for r in conn.execute(sql).fetchall()]  # noqa: E731
        clips = []
        for row in q("SELECT id, video_id, idx, start_s, end_s, status, error, perception, identity FROM clips ORDER BY id"):
            *head, perception, identity = row
            clips.append((*head, json.loads(perception) if perception else None, json.loads(identity) if identity else None))
        kinds = [k for (k,) in q("SELECT DISTINCT kind FROM nodes ORDER BY kind")]
        return {
            "meta": q("SELECT key, value FROM meta ORDER BY key"),
            "videos": q("SELECT id, sha256, path, name, duration_s, has_video, has_audio, status, error FROM videos ORDER BY id"),
            "clips": clips,
            "nodes": q("SELECT id, kind, text, clip_id, weight, name FROM nodes ORDER BY id"),
            "node_order": {k: [n for (n,) in q(f"SELECT id FROM nodes WHERE kind='{k}' ORDER BY seq")] for k in kinds},
            "edges": q("SELECT src, dst, kind, weight FROM edges ORDER BY src, dst, kind"),
            "embeddings": {
                space: q(f"SELECT node_id, clip_id, quality, hex(vector) FROM embeddings WHERE space='{space}' ORDER BY id")
                for (space,) in q("SELECT DISTINCT space FROM embeddings ORDER BY space")
            },
            "appearances": q("SELECT node_id, clip_id, start_s, end_s, kind FROM appearances "
                             "ORDER BY node_id, clip_id, start_s, end_s, kind"),
            "crops": [(n, c, qual, hashlib.sha256(j).hexdigest())
                      for n, c, qual, j in q("SELECT node_id, clip_id, quality, jpeg FROM crops ORDER BY node_id, clip_id")],
            "counters": q("SELECT kind, next FROM counters ORDER BY kind"),
        }
    finally:
        conn.close()


def integrity(store_dir: str | Path) -> str:
    conn = sqlite3.connect(f"file:{Path(store_dir) / 'memory.db'}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def first_difference(a: dict, b: dict) -> str:
    """Where two dumps differ, in a line a person can read (for assertion messages)."""
    for key in a.keys() | b.keys():
        if a.get(key) != b.get(key):
            x, y = a.get(key), b.get(key)
            if isinstance(x, list) and isinstance(y, list):
                for i, (u, v) in enumerate(zip(x, y)):
                    if u != v:
                        return f"{key}[{i}]: {str(u)[:300]} != {str(v)[:300]}"
                return f"{key}: {len(x)} rows != {len(y)} rows"
            return f"{key}: {str(x)[:300]} != {str(y)[:300]}"
    return "no difference"
