"""A corpus of bad and odd inputs, generated here: each gets one clear error or is handled.

The batch always goes on, and nothing already in the store is harmed. The
corpus is ingested in one process and through Ray (two workers), where
decoding happens in the workers.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ingest_support import DATA, ENV, GRID, canonical_dump, integrity, skip_without_media
from pipelines.archive import display

pytestmark = pytest.mark.slow
skip_without_media(pytest)

NON_UTF8_NAME = os.fsdecode(b"latin1_caf\xe9.mpg")
NON_UTF8_BAD = os.fsdecode(b"unreadable_\xff\xfe.mp4")


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", *args], check=True, capture_output=True)


def _grid(name: str) -> Path:
    return GRID / f"{name}.mpg"


def make_corpus(root: Path) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Writes the corpus; returns the inputs to pass, the files that must be ingested (name -> kind),
    and the inputs that must fail (name -> a phrase their error must contain)."""
    root.mkdir(parents=True, exist_ok=True)
    ok: dict[str, str] = {}
    bad: dict[str, str] = {}
    inputs: list[str] = []

    def good(path: Path, kind: str) -> None:
        inputs.append(str(path))
        ok[path.name] = kind

    def fails(path: Path | str, phrase: str) -> None:
        inputs.append(str(path))
        bad[Path(path).name] = phrase

    # unreadable files
    raw = (DATA / "retalking_face5.mp4").read_bytes()
    (root / "truncated.mp4").write_bytes(raw[: len(raw) // 3])
    fails(root / "truncated.mp4", "not a readable")
    (root / "zero_bytes.mp4").write_bytes(b"")
    fails(root / "zero_bytes.mp4", "empty")
    (root / "text_named.mp4").write_text("this is not a video\n" * 50)
    fails(root / "text_named.mp4", "not a readable")
    (root / NON_UTF8_BAD).write_text("neither UTF-8 in its name nor a video in its bytes")
    inputs.append(str(root / NON_UTF8_BAD))
    bad[display(NON_UTF8_BAD)] = "not a readable"
    (root / "random_bytes.mkv").write_bytes(os.urandom(200_000))
    fails(root / "random_bytes.mkv", "not a readable")
    fails(root / "does_not_exist.mp4", "no such file")
    fails(str(root / "nothing_here" / "*.mp4"), "matches no files")
    (root / "broken_link.mp4").symlink_to(root / "gone_target.mp4")
    fails(root / "broken_link.mp4", "broken symbolic link")
    os.mkfifo(root / "a_pipe.mp4")  # opening a pipe would block: it must be refused before that
    fails(root / "a_pipe.mp4", "not a regular file")

    # streams that are missing or odd
    _ffmpeg("-i", str(_grid("bbaf2n")), "-an", "-c:v", "libx264", "-preset", "veryfast", str(root / "no_audio.mp4"))
    good(root / "no_audio.mp4", "video without audio")
    _ffmpeg("-i", str(_grid("brbk7n")), "-vn", "-c:a", "aac", str(root / "no_video.m4a"))
    good(root / "no_video.m4a", "audio without video")
    _ffmpeg("-i", str(_grid("lbax4n")), "-vf", "setpts='N/(25*TB)+0.6*floor(N/10)/TB'", "-fps_mode", "vfr",
            "-c:v", "libx264", "-preset", "veryfast", "-c:a", "aac", str(root / "variable_frame_rate.mkv"))
    good(root / "variable_frame_rate.mkv", "variable frame rate")
    _ffmpeg("-i", str(_grid("lbbc2a")), "-t", "2", "-vf", "scale=4096:3276,fps=5", "-c:v", "libx264",
            "-preset", "ultrafast", "-c:a", "aac", str(root / "huge_frames_4096.mp4"))
    good(root / "huge_frames_4096.mp4", "very large frames")
    _ffmpeg("-i", str(_grid("lrwp9a")), "-t", "0.3", "-c:v", "libx264", "-preset", "veryfast", "-c:a", "aac",
            str(root / "a_third_of_a_second.mp4"))
    good(root / "a_third_of_a_second.mp4", "shorter than one frame sample")
    _ffmpeg("-i", str(_grid("lwbsza")), "-vn", "-ar", "8000", "-ac", "1", str(root / "phone_8khz.wav"))
    good(root / "phone_8khz.wav", "8 kHz audio")
    _ffmpeg("-f", "lavfi", "-i", "anullsrc=r=44100:cl=stereo", "-t", "4", str(root / "silence.wav"))
    good(root / "silence.wav", "silence")
    middle = bytearray(_grid("sbia1a").read_bytes())
    n = len(middle)
    middle[n // 3: n // 3 + n // 10] = bytes(n // 10)
    (root / "zeroed_middle.mpg").write_bytes(bytes(middle))
    good(root / "zeroed_middle.mpg", "damaged in the middle")

    # names
    for name, src, kind in [("with spaces (1).mpg", "sbwe5n", "spaces"), ("ünïcødé 名前.mpg", "swiz3n", "unicode"),
                            (NON_UTF8_NAME, "swwp2s", "not UTF-8"), ("-leading-dash.mpg", "pwij3p", "leading dash")]:
        shutil.copy(_grid(src), root / name)
        good(root / name, kind)

    # a folder of mixed files: only media is taken, and each file stands alone
    mixed = root / "mixed"
    (mixed / "sub" / "deeper").mkdir(parents=True)
    (mixed / "README.txt").write_text("notes")
    (mixed / "photo.jpg").write_bytes((DATA / "faces").glob("*.jpg").__next__().read_bytes())
    shutil.copy(_grid("sbia1a"), mixed / "sub" / "good.mpg")
    ok["good.mpg"] = "in a mixed folder"
    (mixed / "sub" / "deeper" / "bad.mp4").write_text("not a video")
    bad["bad.mp4"] = "not a readable"
    (mixed / "sub" / "loop").symlink_to(mixed)  # a link loop the walk must not follow
    inputs.append(str(mixed))

    # the same content twice: once ingested, once skipped
    shutil.copy(_grid("bbaf2n"), root / "copy_a.mpg")
    shutil.copy(_grid("bbaf2n"), root / "copy_b.mpg")
    good(root / "copy_a.mpg", "duplicate content (first copy)")
    good(root / "copy_b.mpg", "duplicate content (second copy)")

    # a file that disappears while the batch runs (see the test)
    shutil.copy(_grid("lbbc2a"), root / "zz_vanishes.mpg")
    inputs.append(str(root / "zz_vanishes.mpg"))

    # an M3-Agent manifest with bad lines, and a list file with a missing entry
    (root / "data.jsonl").write_text("\n".join([
        '{"id": "clip_in_manifest", "video_path": "mixed/sub/good.mpg", "mem_path": "mem/x.pkl"}',
        '{"id": "broken", "video_path": ',
        '{"id": "no_path"}',
        '{"id": "absent", "video_path": "absent_from_manifest.mp4"}',
        "",
    ]))
    inputs.append(str(root / "data.jsonl"))
    bad["data.jsonl line 2"] = "not valid JSON"
    bad["data.jsonl line 3"] = "video_path"
    bad["absent_from_manifest.mp4"] = "no such file"
    (root / "more.txt").write_text("# inputs, one per line\nno_video.m4a\nlisted_but_missing.mp4\n")
    inputs.append(str(root / "more.txt"))
    bad["listed_but_missing.mp4"] = "no such file"
    return inputs, ok, bad


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


MODES = {"one process": {}, "ray, 2 workers": {"workers": 2}}


@pytest.mark.parametrize("mode", list(MODES))
def test_each_bad_input_gets_one_clear_error_the_batch_goes_on_and_the_store_is_unharmed(mode, corpus, tmp_path,
                                                                                        monkeypatch):
    if MODES[mode]:
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'm3mem[cluster]')")
    from m3mem.config import load_config
    from m3mem.memory import Memory

    for key in ("OMP_NUM_THREADS", "RAY_DEDUP_LOGS"):
        monkeypatch.setenv(key, ENV[key])
    inputs, ok, bad = corpus
    root = Path(inputs[0]).parent
    vanishing = root / "zz_vanishes.mpg"
    if not vanishing.exists():
        shutil.copy(_grid("lbbc2a"), vanishing)
    store = tmp_path / "store"
    config = load_config(overrides={"clip_seconds": 3, **MODES[mode]})

    with Memory(store, config) as mem:
        first = mem.ingest([DATA / "retalking_face1.mp4"])
        assert not first.failed
    before = canonical_dump(store)

    def progress(label: str, done: int, total: int) -> None:
        # the last file of the batch disappears once the first clips are written
        if done >= 1 and vanishing.exists():
            vanishing.unlink()

    with Memory(store, config) as mem:
        report = mem.ingest(inputs, progress=progress)

    results = {}
    for f in report.files:
        name = Path(f.path).name  # manifest problems read "data.jsonl line N"
        assert name not in results, f"{name} was reported twice"
        results[name] = f
    print("\n".join(f"{f.status:8s} {k}: {f.error or ''}" for k, f in results.items()))

    for name, kind in ok.items():
        key = display(name)  # undecodable bytes are shown as \xNN
        f = results.get(key)
        assert f is not None, f"{kind}: {key} was not in the report"
        if name == "copy_b.mpg":
            assert f.status == "skipped" and f.clips_skipped >= 1, (kind, f)
            continue
        assert f.status == "done" and f.clips_done >= 1 and f.error is None, (kind, f)
    for name, phrase in bad.items():
        f = results.get(name)
        assert f is not None, f"{name} was not in the report: {sorted(results)}"
        assert f.status == "failed" and f.error and phrase in f.error, (name, f)
        shown = name.split(" line ")[0]
        assert shown in f.error, f"the error for {name} does not name it: {f.error}"
        assert "Traceback" not in f.error and len(f.error) < 400, f.error
    # the vanished file: one clear error in one process; through Ray it may have been read before it went
    gone = results["zz_vanishes.mpg"]
    assert (gone.status == "failed" and ("No such file" in gone.error or "missing or removed" in gone.error)) \
        or (mode != "one process" and gone.status == "done"), gone
    assert results["good.mpg"].source_id == "clip_in_manifest"
    assert results[display(NON_UTF8_NAME)].path.endswith("latin1_caf\\xe9.mpg")

    # what was stored before is still there, unchanged
    assert integrity(store) == "ok"
    after = canonical_dump(store)
    for table in ("videos", "clips"):
        assert after[table][: len(before[table])] == before[table], table
    for table in ("nodes", "appearances", "crops"):
        assert set(before[table]) <= set(after[table]), table
    for space, rows in before["embeddings"].items():
        assert after["embeddings"][space][: len(rows)] == rows, space


def test_the_command_prints_errors_about_names_that_are_not_utf8(tmp_path):
    import sys

    bad = tmp_path / NON_UTF8_BAD
    bad.write_text("not a video")
    out = subprocess.run([sys.executable, "-m", "m3mem", "ingest", str(bad), "--store", str(tmp_path / "s")],
                         capture_output=True, env={**ENV, "PYTHONIOENCODING": "utf-8"}, cwd=tmp_path)
    assert out.returncode == 1, out.stderr.decode(errors="replace")[-2000:]
    text = out.stdout.decode("utf-8")
    assert "failed" in text and "unreadable_\\xff\\xfe.mp4" in text and "not a readable" in text, text
