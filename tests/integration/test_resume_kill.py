"""Ingestion survives SIGKILL at any moment: the resumed store equals an uninterrupted run's.

Two kinds of kill, for one process and for Ray with two workers:

- at chosen moments between stages: the ingesting process kills itself right
  before a stage commits (before a clip's identity, before its memory, before a
  file is finished, before the next file is opened), so every stage boundary is
  certainly hit;
- at random moments, from outside, after the run has made some progress.

After each kill the same command runs again. At the end the store must equal
the store of one uninterrupted run (nodes, edges, ids, embeddings byte for
byte) and pass SQLite's integrity check. A worker actor killed mid-run is
restarted by Ray and its clip retried.
"""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ingest_support import (BATCH_CLIPS, CLIP_ARGS, ENV, REPO, batch, canonical_dump, first_difference, ingest, integrity,
                            m3mem_cmd, reference_store, skip_without_media)

pytestmark = pytest.mark.slow
skip_without_media(pytest)

MODES = {"one process": (), "ray, 2 workers": ("--workers", "2")}
RANDOM_KILLS = 5
MIN_KILLS = 6  # stage-boundary cuts plus at least two random kills
# (Ingestor method, which call): the run kills itself right before that call
STAGE_CUTS = [("identify", 1), ("remember", 1), ("finish_file", 1), ("open_file", 2)]

# runs `m3mem ingest` in this process after arranging a SIGKILL of itself before the Nth call of a stage
_CUT_DRIVER = textwrap.dedent("""
    import os, signal, sys
    from pipelines import ingest
    stage, nth = sys.argv[1], int(sys.argv[2])
    original, calls = getattr(ingest.Ingestor, stage), [0]
    def cut(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)
    setattr(ingest.Ingestor, stage, cut)
    from m3mem.cli import main
    sys.exit(main(sys.argv[3:]))
""")


def _state(store: Path) -> tuple:
    """What the store shows of the run's progress (clip and file statuses), read without writing."""
    db = store / "memory.db"
    if not db.exists():
        return ()
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            clips = tuple(conn.execute("SELECT status FROM clips ORDER BY id"))
            videos = tuple(conn.execute("SELECT status FROM videos ORDER BY id"))
        finally:
            conn.close()
    except sqlite3.OperationalError:  # the schema is being created
        return ()
    return clips, videos


def _between_stages(state: tuple) -> bool:
    return bool(state) and any(s in ("perceived", "identified") for (s,) in state[0])


def _start(args: list[str], log: Path, cut: tuple[str, int] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", _CUT_DRIVER, cut[0], str(cut[1]), *args] if cut else m3mem_cmd(*args)
    # a session of its own: what the run started (a local Ray instance) can be ended with it
    return subprocess.Popen(cmd, env=ENV, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _end_group(proc: subprocess.Popen) -> None:
    """End what the killed run left behind (Ray's agents outlive their driver), by its process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("mode", list(MODES))
def test_killed_at_stage_boundaries_and_at_random_the_resumed_store_equals_an_uninterrupted_run(
        mode, tmp_path, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    paths = batch(base / "media")
    reference = reference_store(base, paths)
    store = tmp_path / "store"
    args = ["ingest", *map(str, paths), "--store", str(store), "--json", *CLIP_ARGS, *MODES[mode]]
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills: list[tuple[str, bool]] = []

    for stage, nth in STAGE_CUTS:
        proc = _start(args, tmp_path / f"cut-{stage}.log", cut=(stage, nth))
        rc = proc.wait(timeout=900)
        _end_group(proc)
        assert rc == -signal.SIGKILL, f"the run was not cut before {stage} #{nth}: " + \
            (tmp_path / f"cut-{stage}.log").read_text(errors="replace")[-3000:]
        kills.append((f"before {stage} #{nth}", _between_stages(_state(store))))
        assert integrity(store) == "ok"

    while sum(1 for what, _ in kills if what == "random") < RANDOM_KILLS:
        log = tmp_path / f"random-{len(kills)}.log"
        before = _state(store)
        proc = _start(args, log)
        # kill only once the run has committed something, so every run moves the store on
        while proc.poll() is None and _state(store) == before:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is not None:
            _end_group(proc)
            # on a quiet machine the batch can outrun the last random kills; the store is
            # still checked below, and at least MIN_KILLS kills must have landed
            assert len(kills) >= MIN_KILLS, (
                f"the batch finished after {len(kills)} kills (seed {seed}); at least {MIN_KILLS} are needed: "
                + log.read_text(errors="replace")[-2000:])
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        _end_group(proc)
        kills.append(("random", _between_stages(_state(store))))
        assert integrity(store) == "ok"

    rc, report, err = ingest(paths, store, *MODES[mode])
    assert rc == 0, err[-3000:]
    assert report["clips_failed"] == 0 and report["clips_done"] + report["clips_skipped"] == BATCH_CLIPS, report
    print(f"{mode}: {len(kills)} kills survived (seed {seed}); between stages: "
          f"{sum(1 for _, b in kills if b)}; {kills}")
    assert sum(1 for _, b in kills if b) >= 2, kills  # the cuts before identify and remember at least
    assert integrity(store) == "ok"
    ours, theirs = canonical_dump(store), canonical_dump(reference)
    assert ours == theirs, f"after kills {kills} (seed {seed}): " + first_difference(ours, theirs)


_ACTOR_KILL_DRIVER = textwrap.dedent("""
    import json, os, signal, sys
    from m3mem.config import load_config
    from m3mem.store import Store
    from pipelines.ingest import Ingestor
    from pipelines.ray_ingest import RayIngest

    store_dir, paths = sys.argv[1], sys.argv[2:]
    killed, later = [], []
    def progress(label, done, total):
        # once the first clip is written, kill a worker that has clips queued
        if label == "all files":
            return
        if not killed and done == 1:
            pid = runner.worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        elif killed and not later:
            later.extend(runner.worker_pids())
    with Store.open(store_dir) as store:
        runner = RayIngest(Ingestor(store, load_config(overrides={"clip_seconds": 3, "workers": 2}), progress))
        report = runner.ingest(paths)
        print(json.dumps({"report": report.to_json(), "killed": killed, "later": later}))
""")


def test_a_killed_worker_is_restarted_and_its_clip_retried(tmp_path, tmp_path_factory):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'm3mem[cluster]')")
    import json

    base = tmp_path_factory.getbasetemp()
    paths = batch(base / "media")
    reference = reference_store(base, paths)
    store = tmp_path / "store"
    out = subprocess.run([sys.executable, "-c", _ACTOR_KILL_DRIVER, str(store), *map(str, paths)],
                         capture_output=True, text=True, env=ENV, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["killed"], "no worker was killed"
    # the killed worker was replaced by a new process, and there are as many workers as before
    assert len(result["later"]) == 2 and result["killed"][0] not in result["later"], result
    report = result["report"]
    assert report["clips_done"] == BATCH_CLIPS and report["clips_failed"] == 0, report
    ours, theirs = canonical_dump(store), canonical_dump(reference)
    assert ours == theirs, first_difference(ours, theirs)
