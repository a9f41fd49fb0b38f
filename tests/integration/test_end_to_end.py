"""End to end on real media: ingest, identities, search, ask, people, bad input, CLI contract."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"

pytestmark = pytest.mark.slow

if not DATA.is_dir():
    pytest.skip(f"real media not found at {DATA} (see the README)", allow_module_level=True)
if shutil.which("ffmpeg") is None:
    pytest.skip("ffmpeg is not installed", allow_module_level=True)

# The joined video (the evaluation's own, m3mem/eval/perception.py): 5 real people, and
# katie comes back at the end, in the second 30 s clip, so her id must survive the boundary.


def join_people(out: Path) -> list[tuple[float, float, str]]:
    from m3mem.eval.perception import join_people as join

    return join(DATA, out)


@pytest.fixture(scope="module")
def joined(tmp_path_factory):
    d = tmp_path_factory.mktemp("joined")
    video = d / "joined_people.mp4"
    truth = join_people(video)
    return video, truth


@pytest.fixture(scope="module")
def store(tmp_path_factory, joined):
    from m3mem.memory import Memory

    root = tmp_path_factory.mktemp("store")
    with Memory(root) as mem:
        report = mem.ingest([joined[0], DATA / "jfk.wav"])
    assert not report.failed, report.to_json()
    return root


def _face_ids_by_person(root: Path, truth) -> dict[str, set[str]]:
    from m3mem.memory import Memory

    with Memory(root, read_only=True) as mem:
        people = mem.people()
    by_person: dict[str, set[str]] = {}
    for p in people:
        for a in p.appearances:
            if a["kind"] != "face" or a["video"] != "joined_people.mp4":
                continue
            mid = (a["start"] + a["end"]) / 2
            # the person on screen for most of this span
            overlap = {}
            for s, e, who in truth:
                overlap[who] = overlap.get(who, 0) + max(0.0, min(e, a["end"]) - max(s, a["start"]))
            who = max(overlap, key=overlap.get)
            if overlap[who] > 0.5 * (a["end"] - a["start"]):
                by_person.setdefault(who, set()).add(p.id)
    return by_person


def test_joined_video_gives_one_id_per_person_and_the_same_id_when_a_person_returns(store, joined):
    by_person = _face_ids_by_person(store, joined[1])
    assert set(by_person) == {"katie", "man1", "aoc", "woman4", "man2"}, by_person
    for who, ids in by_person.items():
        assert len(ids) == 1, f"{who} got several ids: {ids}"
    all_ids = [next(iter(v)) for v in by_person.values()]
    assert len(set(all_ids)) == len(all_ids), f"two people share an id: {by_person}"


def test_katie_is_seen_in_both_clips_under_one_id(store, joined):
    from m3mem.memory import Memory

    (katie,) = _face_ids_by_person(store, joined[1])["katie"]
    with Memory(store, read_only=True) as mem:
        person = next(p for p in mem.people() if p.id == katie)
    spans = [a for a in person.appearances if a["kind"] == "face" and a["video"] == "joined_people.mp4"]
    assert any(a["start"] < 1.5 for a in spans), spans
    assert any(a["start"] > 30.0 and a["end"] > 38.0 for a in spans), spans


def test_the_jfk_speech_is_found_by_a_paraphrased_query(store):
    from m3mem.memory import Memory

    with Memory(store, read_only=True) as mem:
        hits = mem.search("a president urging citizens to serve their nation", top_k=3)
    assert hits and hits[0].video == "jfk.wav"
    assert hits[0].start_s == 0.0 and 10.0 < hits[0].end_s < 12.0
    assert any("country" in line for line in hits[0].lines)


def test_ask_cites_the_clip_that_holds_the_answer(store):
    from m3mem.memory import Memory

    with Memory(store, read_only=True) as mem:
        answer = mem.ask("What should you ask about your country?")
    assert "country" in answer.answer
    assert answer.citations[0]["video"] == "jfk.wav"
    assert [r["action"] for r in answer.rounds] == ["search", "answer"]


def test_a_second_ingest_of_the_same_file_skips_finished_clips(store, joined):
    from m3mem.memory import Memory

    with Memory(store) as mem:
        before = mem.store.counts()
        report = mem.ingest([joined[0]])
        after = mem.store.counts()
    assert report.files[0].status == "skipped" and report.files[0].clips_skipped == 2
    assert before == after


def _bad_files(d: Path) -> list[Path]:
    corrupt = d / "corrupt.mp4"
    raw = (DATA / "retalking_face5.mp4").read_bytes()
    corrupt.write_bytes(raw[: len(raw) // 3])
    empty = d / "empty.mp4"
    empty.write_bytes(b"")
    text = d / "notes.mp4"
    text.write_text("this is not a video\n" * 20)
    return [corrupt, empty, text]


def test_bad_files_each_give_a_clear_error_and_leave_the_store_as_it_was(store, tmp_path):
    from m3mem.memory import Memory

    bad = _bad_files(tmp_path)
    with Memory(store) as mem:
        before = mem.store.counts()
        report = mem.ingest(bad + [tmp_path / "missing.mp4"])
        after = mem.store.counts()
        assert mem.store.integrity_check() == "ok"
    assert before == after
    errors = {Path(f.path).name: f.error for f in report.files}
    assert all(f.status == "failed" for f in report.files), report.to_json()
    assert "empty" in errors["empty.mp4"]
    for name in ("corrupt.mp4", "notes.mp4"):
        assert name in errors[name] and "not a readable" in errors[name], errors[name]
    assert "no such file" in errors["missing.mp4"]


def test_cli_contract_json_shapes(store, tmp_path):
    def cli(*args):
        out = subprocess.run([sys.executable, "-m", "m3mem", *args, "--store", str(store), "--json"],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    s = cli("search", "ask not what your country can do for you", "--top-k", "2")
    assert s["query"].startswith("ask not") and 1 <= len(s["results"]) <= 2
    r = s["results"][0]
    assert {"video", "start", "end", "score", "lines"} <= set(r) and r["video"] == "jfk.wav"
    assert all(isinstance(x, str) for x in r["lines"])
    a = cli("ask", "What did the speaker say about the country?")
    assert isinstance(a["answer"], str) and isinstance(a["rounds"], list)
    assert {"video", "start", "end"} <= set(a["citations"][0])
    p = cli("people")
    assert p["people"]
    person = p["people"][0]
    assert {"id", "faces", "voices", "name", "appearances"} <= set(person)
    assert {"video", "start", "end", "kind"} <= set(person["appearances"][0])


def test_cli_ingest_reports_a_failed_file_and_exits_non_zero_while_the_rest_goes_on(tmp_path):
    bad = _bad_files(tmp_path)[1]
    good = DATA / "grid" / "bbaf2n.mpg"
    out = subprocess.run([sys.executable, "-m", "m3mem", "ingest", str(bad), str(good), "--store",
                          str(tmp_path / "s"), "--json"], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    status = {Path(f["path"]).name: f["status"] for f in report["files"]}
    assert status == {"empty.mp4": "failed", "bbaf2n.mpg": "done"}
