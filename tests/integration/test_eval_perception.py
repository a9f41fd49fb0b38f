"""``m3mem eval perception``: the per-backend tables on a reduced subset of the real test media."""
from __future__ import annotations

import json

import pytest

from m3mem.eval.perception import map_ids_to_speakers, pairwise_identity

TRUTH = [(0.0, 4.0, "ann"), (4.0, 8.0, "bob"), (8.0, 10.0, "ann")]


def test_pairwise_identity_is_perfect_when_each_person_keeps_one_id():
    spans = [(0.0, 4.0, "face_1"), (4.0, 8.0, "face_2"), (8.0, 10.0, "face_1")]
    r = pairwise_identity(TRUTH, spans, 10.0, 0.5)
    assert r["pairwise_precision"] == 1.0 and r["pairwise_recall"] == 1.0
    assert r["ids_per_person"] == {"ann": ["face_1"], "bob": ["face_2"]}
    assert r["persons_per_id"] == {"face_1": ["ann"], "face_2": ["bob"]}
    assert r["time_covered"] == 1.0 and r["time_points"] == 20


def test_pairwise_identity_counts_a_split_against_recall_and_a_merge_against_precision():
    split = pairwise_identity(TRUTH, [(0.0, 4.0, "face_1"), (4.0, 8.0, "face_2"), (8.0, 10.0, "face_3")], 10.0, 0.5)
    assert split["pairwise_precision"] == 1.0 and split["pairwise_recall"] < 1.0
    assert split["ids_per_person"]["ann"] == ["face_1", "face_3"]
    merged = pairwise_identity(TRUTH, [(0.0, 10.0, "face_1")], 10.0, 0.5)
    assert merged["pairwise_recall"] == 1.0 and merged["pairwise_precision"] < 1.0
    assert merged["persons_per_id"] == {"face_1": ["ann", "bob"]}


def test_pairwise_identity_forgives_the_half_step_margin_of_a_span_past_a_change_of_person():
    # bob's face sampled at 4.5 .. 7.5 s with a 1 s step: his span reaches 8.0; 0.3 s past his exit is margin
    r = pairwise_identity([(0.0, 4.2, "ann"), (4.2, 7.7, "bob")], [(0.0, 4.0, "face_1"), (4.0, 8.0, "face_2")],
                          7.7, 0.5, min_piece_s=1.0)
    assert r["pairwise_precision"] == 1.0 and r["persons_per_id"] == {"face_1": ["ann"], "face_2": ["bob"]}


def test_pairwise_identity_reports_time_without_any_id_and_people_never_seen():
    r = pairwise_identity(TRUTH, [(0.0, 4.0, "face_1")], 10.0, 0.5)
    assert r["time_covered"] == pytest.approx(8 / 20)
    assert r["ids_per_person"]["bob"] == []


def test_voice_ids_map_to_the_reference_speaker_they_overlap_most():
    ref = [(0.0, 5.0, "A"), (5.0, 10.0, "B")]
    hyp = [(0.0, 4.0, "voice_1"), (3.0, 9.0, "voice_2"), (9.0, 10.0, "voice_1")]
    assert map_ids_to_speakers(ref, hyp) == {"A": ["voice_1"], "B": ["voice_2"]}
    assert map_ids_to_speakers(ref, []) == {}


@pytest.fixture(scope="module")
def report(shared_data):
    from m3mem.eval.perception import run_perception_eval

    # jfk, two GRID clips, the pair list, the group photos and one DER file: the structure
    # of every table kind at a fraction of the full run's time
    return run_perception_eval(shared_data, parts=["verification", "detection", "wer", "der"], grid_clips=2,
                               der_files=["pyannote_sample.wav"])


@pytest.mark.slow
def test_dlib_face_table_verifies_the_photo_pairs_and_counts_the_group_faces(report):
    faces = report.table("face", "dlib")
    assert faces.not_measured is None
    assert faces.raw["threshold"] == pytest.approx(0.95)
    assert faces.value("verification accuracy, 78 photo pairs") >= 0.9
    v = faces.raw["verification"]
    assert (v["same"], v["different"]) == (12, 66)
    assert v["false_accept_rate"] <= 0.05 and v["auc"] >= 0.95
    assert faces.value("  photos with no face found") == 0
    # truth 6; in the Obama/Biden photo 3 faces are visible (a girl at the lower right edge)
    assert faces.value("faces found, insightface_t1_group.jpg") == 6
    assert faces.value("faces found, fr_obama_and_biden.jpg") in (2, 3)


@pytest.mark.slow
def test_pocketsphinx_table_gives_word_error_rates_on_jfk_and_grid(report):
    speech = report.table("speech", "pocketsphinx")
    assert speech.not_measured is None
    jfk = speech.raw["jfk"]
    assert jfk["reference_words"] == 22
    assert 0.0 <= speech.value("WER, jfk.wav") < 0.4
    assert "country" in jfk["hypothesis"].lower()
    grid = speech.raw["grid"]
    assert len(grid["clips"]) == 2 and grid["reference_words"] == 12
    assert 0.0 <= speech.value("WER, GRID (2 clips)") <= 1.5


@pytest.mark.slow
def test_voice_table_scores_the_pipelines_own_diarization(report):
    voices = report.table("voice", "resemblyzer")
    assert voices.not_measured is None and voices.raw["speech"] == "pocketsphinx"
    der = voices.raw["der"]["pyannote_sample.wav"]
    assert 0.0 <= der["der"] <= 1.0
    assert der["total_s"] == pytest.approx(24.35, abs=0.1)  # speech in the reference RTTM
    # the hypothesis is real: speech was found in the call and given voice labels
    assert der["hypothesis"] and der["missed_s"] < 0.5 * der["total_s"]
    assert set(voices.raw["der"]) == {"pyannote_sample.wav"}


@pytest.mark.slow
def test_the_report_renders_as_text_markdown_and_json(report):
    text = report.to_text()
    assert "Faces: dlib" in text and "Speech: pocketsphinx" in text and "Voices: resemblyzer" in text
    md = report.to_markdown()
    assert md.count("| metric | value | reference | detail |") == 3
    assert "### Speech: pocketsphinx" in md
    data = json.loads(json.dumps(report.to_json(), default=str))
    assert [t["role"] for t in data["tables"]] == ["face", "speech", "voice"]
    assert data["machine"]["cpu_count"] >= 1


@pytest.mark.slow
def test_cli_prints_json_and_writes_markdown(shared_data, tmp_path, capsys):
    from m3mem.cli import main

    md = tmp_path / "perception.md"
    rc = main(["eval", "perception", "--data", str(shared_data), "--only", "verification",
               "--json", "--markdown", str(md)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    (table,) = out["tables"]
    assert table["role"] == "face" and table["backend"] == "dlib"
    assert table["raw"]["verification"]["pairs"] == 78
    assert "### Faces: dlib" in md.read_text()


@pytest.mark.slow
def test_a_backend_that_is_not_installed_gives_a_table_that_says_why(shared_data):
    import importlib.util

    from m3mem.eval.perception import run_perception_eval

    if importlib.util.find_spec("whisperx") is not None:
        pytest.skip("whisperx is installed here; this checks the table of a missing backend")
    report = run_perception_eval(shared_data, parts=["wer"], speech_models=["whisperx:/nonexistent"])
    (table,) = report.tables
    assert table.rows == () and "whisperx is not installed" in table.not_measured
    assert "not measured: whisperx is not installed" in report.to_text()


def test_a_folder_that_is_not_the_test_media_is_refused(tmp_path):
    from m3mem.errors import InputError
    from m3mem.eval.perception import run_perception_eval

    with pytest.raises(InputError, match="MANIFEST.md"):
        run_perception_eval(tmp_path)
    (tmp_path / "MANIFEST.md").write_text("x")
    (tmp_path / "gt").mkdir()
    with pytest.raises(InputError, match="unknown evaluation part"):
        run_perception_eval(tmp_path, parts=["faces"])
