"""``m3mem search`` and ``ask`` work on a store while it is being ingested.

The ingesting process is held, deterministically, in the middle of a write:
inside the transaction that writes its third clip's memory, with that memory
written and not committed. Readers then see the two committed clips and not
the third; once the writer goes on, a reader that stayed open sees all of it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from ingest_support import CLIP_ARGS, ENV, GRID, REPO, m3mem_cmd, skip_without_media

pytestmark = pytest.mark.slow
skip_without_media(pytest)

FILES = ["bbaf2n", "brbk7n", "lbax4n", "sbwe5n"]
MODES = {"one process": (), "ray, 2 workers": ("--workers", "2")}

# runs `m3mem ingest`, holding the third clip's memory transaction open until a file appears
_HOLD_DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pipelines import ingest
    ready, go = Path(sys.argv[1]), Path(sys.argv[2])
    original, calls = ingest.Ingestor.remember, [0]
    def remember(self, row, memory):
        calls[0] += 1
        if calls[0] != 3:
            return original(self, row, memory)
        with self.store.transaction():
            original(self, row, memory)
            ready.write_text(str(row.id))
            while not go.exists():
                time.sleep(0.05)
    ingest.Ingestor.remember = remember
    from m3mem.cli import main
    sys.exit(main(sys.argv[3:]))
""")


def _cli(*args: str) -> dict:
    out = subprocess.run(m3mem_cmd(*args, "--json"), capture_output=True, text=True, env=ENV, cwd=REPO,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("mode", list(MODES))
def test_search_and_ask_answer_from_committed_clips_while_a_batch_is_being_written(mode, tmp_path):
    if MODES[mode]:
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'm3mem[cluster]')")
    from m3mem.memory import Memory

    store, ready, go = tmp_path / "store", tmp_path / "ready", tmp_path / "go"
    paths = [str(GRID / f"{n}.mpg") for n in FILES]
    writer = subprocess.Popen(
        [sys.executable, "-c", _HOLD_DRIVER, str(ready), str(go), "ingest", *paths, "--store", str(store), "--json",
         *CLIP_ARGS, *MODES[mode]],
        env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900
        while not ready.exists():
            assert writer.poll() is None, writer.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the writer never reached its third clip"
            time.sleep(0.1)

        # the writer now holds a write transaction with the third clip's memory in it
        found = _cli("search", "someone is visible", "--store", str(store), "--top-k", "10")
        videos = {r["video"] for r in found["results"]}
        assert videos == {"bbaf2n.mpg", "brbk7n.mpg"}, found
        answer = _cli("ask", "Who is visible?", "--store", str(store))
        assert isinstance(answer["answer"], str) and answer["rounds"]
        assert {c["video"] for c in answer["citations"]} <= {"bbaf2n.mpg", "brbk7n.mpg"}, answer

        with Memory(store, read_only=True) as reader:
            early = {h.video for h in reader.search("someone is visible", top_k=10)}
            assert early == {"bbaf2n.mpg", "brbk7n.mpg"}
            assert reader.people(), "the committed clips' people are listed"
            assert writer.poll() is None, "the writer ended while it was held"

            go.write_text("go")
            out, err = writer.communicate(timeout=900)
            assert writer.returncode == 0, err[-3000:]
            assert json.loads(out)["clips_done"] == len(FILES)
            # the reader that stayed open sees what was committed after it opened
            late = {h.video for h in reader.search("someone is visible", top_k=10)}
            assert late == {f"{n}.mpg" for n in FILES}, late
    finally:
        go.write_text("go")
        if writer.poll() is None:
            writer.kill()
            writer.wait()
