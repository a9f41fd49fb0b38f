"""Evaluation building blocks: perception metrics on known inputs, ground-truth readers on the
real annotation files, the M3-Bench annotation reader and the judges."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from m3mem.errors import InputError
from m3mem.eval.judge import ChatJudge, parse_verdict, string_match
from m3mem.eval.m3bench import (
    ALL, GROUPS, M3BenchReport, QuestionResult, load_annotations, locate_videos, store_dir_for, type_groups,
)
from m3mem.eval.metrics import (
    diarization_error_rate, face_verification, identity_precision_recall, normalize_text, read_pairs, read_rttm,
    read_stm, read_timeline, read_transcript, word_error_rate, write_rttm,
)

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture
def data() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"real test data not found at {DATA.resolve()} (see the README)")
    return DATA


# --- word error rate ------------------------------------------------------------------


def test_wer_is_zero_for_the_reference_itself_whatever_the_case_and_punctuation(data):
    ref = read_transcript(data / "gt" / "jfk.txt")
    r = word_error_rate(ref, ref.upper().replace(",", "").replace(".", " !"))
    assert r.wer == 0.0 and r.hits == r.reference_words == 22


def test_wer_counts_substitutions_deletions_and_insertions(data):
    ref = read_transcript(data / "gt" / "jfk.txt")
    # "fellow" -> "yellow", "not" dropped, "really" inserted
    hyp = ref.replace("fellow", "yellow").replace("ask not", "ask").replace("And so", "And so really")
    r = word_error_rate(ref, hyp)
    assert (r.substitutions, r.deletions, r.insertions) == (1, 1, 1)
    assert r.wer == pytest.approx(3 / 22)


def test_wer_over_several_utterances_pools_the_words():
    r = word_error_rate(["bin blue at f two now", "ask not"], ["bin blue at f two now", "ask"])
    assert r.reference_words == 8 and r.deletions == 1 and r.wer == pytest.approx(1 / 8)


def test_an_empty_hypothesis_deletes_every_word_and_an_empty_reference_is_refused():
    assert word_error_rate("one two three", "").wer == 1.0
    with pytest.raises(InputError, match="empty"):
        word_error_rate("  ", "something")


def test_normalize_text_keeps_apostrophes_inside_words():
    assert normalize_text("Don't STOP, 'now'!") == "don't stop now"


# --- diarization ----------------------------------------------------------------------


def test_der_of_the_reference_against_itself_relabelled_is_zero(data):
    ref = read_rttm(data / "gt" / "pyannote_sample.rttm")["sample"]
    renamed = [(a, b, {"speaker90": "x", "speaker91": "y"}[s]) for a, b, s in ref]
    r = diarization_error_rate(ref, renamed)
    assert r.der == 0.0 and r.mapping == {"x": "speaker90", "y": "speaker91"}
    assert r.total_s == pytest.approx(11.85 + 12.5)  # overlapped speech counts for each speaker


def test_der_counts_a_dropped_turn_as_missed_speech(data):
    ref = read_rttm(data / "gt" / "pyannote_sample.rttm")["sample"]
    dropped = [s for s in ref if s[0] != 21.78]  # Sheila's 6.72 s turn
    assert len(dropped) == len(ref) - 1
    r = diarization_error_rate(ref, dropped)
    assert r.missed_s == pytest.approx(6.72) and r.false_alarm_s == 0 and r.confusion_s == 0
    assert r.der == pytest.approx(6.72 / 24.35)


def test_der_counts_confusion_and_the_collar_forgives_small_shifts():
    ref = [(0.0, 10.0, "A"), (10.0, 20.0, "B")]
    r = diarization_error_rate(ref, [(0.0, 8.0, "x"), (8.0, 20.0, "y")])
    assert r.confusion_s == pytest.approx(2.0) and r.der == pytest.approx(0.1)
    shifted = [(0.1, 10.1, "x"), (10.1, 20.1, "y")]
    assert diarization_error_rate(ref, shifted).der > 0
    assert diarization_error_rate(ref, shifted, collar_s=0.25).der == pytest.approx(0.0)


def test_der_with_a_uem_counts_speech_outside_the_reference_as_false_alarm():
    ref = [(0.0, 10.0, "A")]
    r = diarization_error_rate(ref, [(0.0, 10.0, "x"), (20.0, 25.0, "x")], uem=(0.0, 30.0))
    assert r.false_alarm_s == pytest.approx(5.0) and r.der == pytest.approx(0.5)


def test_an_empty_hypothesis_misses_everything():
    r = diarization_error_rate([(0.0, 4.0, "A")], [])
    assert r.der == 1.0 and r.missed_s == pytest.approx(4.0)


# --- identity -------------------------------------------------------------------------

# The joined talking-head video of the end-to-end test: Katie comes back at the end.
TRUTH = [(0.0, 8.0, "katie"), (8.0, 12.9, "man1"), (12.9, 20.9, "aoc"), (20.9, 26.4, "woman4"),
         (26.4, 31.3, "man2"), (31.3, 39.3, "katie")]
TOTAL = 39.3


def test_identity_is_perfect_when_every_person_keeps_one_id():
    pred = [(a, b, f"face_{['katie', 'man1', 'aoc', 'woman4', 'man2'].index(p) + 1}") for a, b, p in TRUTH]
    r = identity_precision_recall(TRUTH, pred)
    assert (r.precision, r.recall, r.purity, r.coverage) == (1.0, 1.0, 1.0, 1.0)
    assert r.people == 5 and r.ids == 5 and not r.splits and not r.merges


def test_a_person_split_in_two_costs_recall_and_coverage_not_purity():
    ids = {"katie": "face_1", "man1": "face_2", "aoc": "face_3", "woman4": "face_4", "man2": "face_5"}
    pred = [(a, b, ids[p]) for a, b, p in TRUTH[:-1]] + [(31.3, 39.3, "face_6")]
    r = identity_precision_recall(TRUTH, pred)
    assert r.recall == pytest.approx((TOTAL - 8) / TOTAL)
    assert r.precision == pytest.approx((TOTAL - 8) / TOTAL)  # face_6's time maps to no one
    assert r.coverage == pytest.approx((TOTAL - 8) / TOTAL) and r.purity == pytest.approx(1.0)
    assert r.splits == {"katie": ["face_1", "face_6"]} and not r.merges


def test_two_people_merged_into_one_id_cost_purity():
    ids = {"katie": "face_1", "man1": "face_2", "aoc": "face_3", "woman4": "face_4", "man2": "face_2"}
    pred = [(a, b, ids[p]) for a, b, p in TRUTH]
    r = identity_precision_recall(TRUTH, pred)
    assert r.merges == {"face_2": ["man1", "man2"]}
    assert r.purity == pytest.approx((TOTAL - 4.9) / TOTAL)
    assert r.recall == pytest.approx((TOTAL - 4.9) / TOTAL) and r.coverage == pytest.approx(1.0)


def test_predicted_presence_where_nobody_is_costs_precision_only():
    r = identity_precision_recall([(0.0, 10.0, "a")], [(0.0, 10.0, "face_1"), (10.0, 20.0, "face_1")])
    assert r.recall == pytest.approx(1.0) and r.precision == pytest.approx(0.5)


# --- face verification ----------------------------------------------------------------


def test_verification_of_separable_scores():
    r = face_verification([0.97, 0.96, 0.80, 0.40], [True, True, False, False], threshold=0.95)
    assert (r.accuracy, r.true_accept_rate, r.false_accept_rate) == (1.0, 1.0, 0.0)
    assert r.auc == 1.0 and r.eer == 0.0 and r.best_accuracy == 1.0
    assert 0.80 < r.best_threshold <= 0.96


def test_verification_auc_is_the_share_of_correctly_ordered_pairs():
    rng = np.random.default_rng(0)
    same = rng.random(60) < 0.3
    scores = np.where(same, rng.normal(0.7, 0.1, 60), rng.normal(0.5, 0.1, 60))
    r = face_verification(scores, same, threshold=0.6)
    pos, neg = scores[same], scores[~same]
    ordered = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert r.auc == pytest.approx(ordered)
    assert r.accuracy == pytest.approx(np.mean((scores >= 0.6) == same))
    assert r.best_accuracy >= r.accuracy and 0 < r.eer < 0.5


def test_verification_with_one_class_has_no_auc_and_bad_input_is_refused():
    r = face_verification([0.9, 0.8], [True, True], threshold=0.85)
    assert r.auc is None and r.eer is None and r.false_accept_rate is None and r.accuracy == 0.5
    with pytest.raises(InputError):
        face_verification([0.9], [True, False])
    with pytest.raises(InputError):
        face_verification([], [])


# --- ground-truth files ---------------------------------------------------------------


def test_readers_on_the_real_ground_truth(data):
    rttm = read_rttm(data / "gt" / "ami_tst00.rttm")
    assert list(rttm) == ["tst00"] and len({s for _, _, s in rttm["tst00"]}) == 4
    stm = read_stm(data / "gt" / "pyannote_sample.stm")["sample"]
    assert stm[0] == (6.68, 7.16, "Diane", "Hello?") and {s for _, _, s, _ in stm} == {"Diane", "Sheila"}
    assert read_transcript(data / "gt" / "pyannote_sample.stm").startswith("Hello? Hello? Oh, hello.")
    pairs = read_pairs(data / "gt" / "deepface_pairs.csv")
    assert len(pairs) == 78 and sum(p[2] for p in pairs) == 12
    assert pairs[0] == ("faces/df_img20.jpg", "faces/df_img21.jpg", True)
    assert read_timeline(data / "gt" / "pyannote_sample.rttm")[0] == (6.69, 6.69 + 0.43, "speaker90")


def test_rttm_round_trip_and_timeline_csv(tmp_path):
    spans = [(0.0, 1.5, "a"), (2.0, 3.25, "b")]
    write_rttm(tmp_path / "x.rttm", "x", spans)
    assert read_rttm(tmp_path / "x.rttm") == {"x": spans}
    (tmp_path / "t.csv").write_text("person,start,end\nkatie,0,8\naoc,8,16.5\n")
    assert read_timeline(tmp_path / "t.csv") == [(0.0, 8.0, "katie"), (8.0, 16.5, "aoc")]
    (tmp_path / "n.csv").write_text("0,8,katie\n")
    assert read_timeline(tmp_path / "n.csv") == [(0.0, 8.0, "katie")]


def test_malformed_ground_truth_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.rttm"
    bad.write_text("SPEAKER f 1 zero 1.0 <NA> <NA> s1 <NA> <NA>\n")
    with pytest.raises(InputError, match=r"bad.rttm line 1"):
        read_rttm(bad)
    pairs = tmp_path / "p.csv"
    pairs.write_text("file_x,file_y,same_person\na.jpg,b.jpg,maybe\n")
    with pytest.raises(InputError, match=r"p.csv line 2.*maybe"):
        read_pairs(pairs)
    with pytest.raises(InputError, match="no such file"):
        read_rttm(tmp_path / "missing.rttm")


# --- M3-Bench annotations -------------------------------------------------------------


def test_the_real_annotation_files_load_and_every_type_falls_in_a_table_row(data):
    robot = load_annotations(data / "m3bench" / "robot.json")
    web = load_annotations(data / "m3bench" / "web.json")
    assert (len(robot), sum(len(v.questions) for v in robot)) == (100, 1276)
    assert (len(web), sum(len(v.questions) for v in web)) == (920, 3214)
    rows = {g for g, _ in GROUPS}
    for v in robot + web:
        for q in v.questions:
            assert q.types and set(type_groups(q.types)) <= rows, q
    assert all(q.before_clip is not None for v in robot for q in v.questions)
    assert all(q.before_clip is None for v in web for q in v.questions)
    first = robot[0]
    assert first.video_id == "living_room_06" and first.file_name == "living_room_06.mp4"
    q = first.questions[1]
    assert (q.question_id, q.before_clip, q.before_s) == ("living_room_06_Q02", 31, 960.0)
    # the question is asked at 16:10 = 970 s: memory up to the end of clip 31 (960 s) only
    assert q.timestamp == "16:10"


def test_type_groups_join_the_robot_and_web_names_of_one_row():
    assert type_groups(["Multi-Detail Reasoning", "Multi-Evidence Reasoning"]) == ("Multi-Detail/Multi-Evidence",)
    assert type_groups(["Person Understanding", "Cross-Modal Reasoning"]) == ("Person Understanding", "Cross-Modal")
    assert type_groups(["General Knowledge Extraction"]) == ("General Knowledge",)
    assert type_groups(["Counting"]) == ("Counting",)


def test_bad_annotations_say_which_entry_is_wrong(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps({"v1": {"video_path": "x.mp4", "qa_list": [{"question": "q?"}]}}))
    with pytest.raises(InputError, match=r"a.json, video 'v1', question 0: missing or non-text answer"):
        load_annotations(p)
    p.write_text(json.dumps({"v1": {"qa_list": [{"question": "q", "answer": "a", "before_clip": "soon"}]}}))
    with pytest.raises(InputError, match="before_clip 'soon'"):
        load_annotations(p)
    p.write_text("[1, 2]")
    with pytest.raises(InputError, match="expected an object"):
        load_annotations(p)
    p.write_text("{not json")
    with pytest.raises(InputError, match="not a readable JSON"):
        load_annotations(p)


def test_videos_are_found_by_file_name_anywhere_below_the_folder(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps({
        "room_1": {"video_path": "data/videos/robot/room_1.mp4", "qa_list": []},
        "abc": {"video_path": "data/videos/web/renamed.mp4", "qa_list": []},
        "gone": {"video_path": "data/videos/web/gone.mp4", "qa_list": []},
    }))
    (tmp_path / "vids" / "robot").mkdir(parents=True)
    (tmp_path / "vids" / "robot" / "room_1.mp4").write_bytes(b"x")
    (tmp_path / "vids" / "abc.mkv").write_bytes(b"x")  # by id when the file name differs
    (tmp_path / "vids" / "gone.txt").write_bytes(b"x")  # not a media file
    found = locate_videos(load_annotations(p), tmp_path / "vids")
    assert found == {"room_1": tmp_path / "vids" / "robot" / "room_1.mp4", "abc": tmp_path / "vids" / "abc.mkv"}
    assert store_dir_for(tmp_path, "a/b c") == tmp_path / "a_b_c"


def _result(qid: str, groups: list[str], correct: bool) -> QuestionResult:
    return QuestionResult(qid, "v", "q", "gt", "a", [], groups, None, None, correct, "string")


def test_the_accuracy_table_counts_a_question_in_each_of_its_rows_and_once_in_all():
    report = M3BenchReport("a.json", "string", results=[
        _result("1", ["Multi-Hop", "Person Understanding"], True),
        _result("2", ["Person Understanding"], False),
        _result("3", ["Cross-Modal"], True),
    ])
    rows = {r["type"]: (r["correct"], r["total"]) for r in report.accuracy()}
    assert rows["Multi-Hop"] == (1, 1) and rows["Person Understanding"] == (1, 2)
    assert rows["Cross-Modal"] == (1, 1) and rows["General Knowledge"] == (0, 0)
    assert rows[ALL] == (2, 3)
    assert [r["type"] for r in report.accuracy()][-1] == ALL
    table = report.table()
    assert "Person Understanding" in table and "50.0%" in table and "66.7%" in table


# --- judges ---------------------------------------------------------------------------


@pytest.mark.parametrize("gt, answer, expected", [
    ("Coffee.", "They drink coffee in the morning.", True),
    ("Marketing staff.", "Lily works as marketing staff at a company.", True),
    ("Marketing staff.", "Lily works in marketing.", False),
    ("Yes.", "Yes, she is tired.", True),
    ("Yes.", "No. She says yes to nothing.", False),
    ("No", "Rick does not trust him, no.", False),  # a yes/no truth needs the answer to commit first
    ("Two.", "There were 2 cups.", True),
    ("The album of Led Zeppelin.", "It was the Led Zeppelin album", False),
    ("The album of Led Zeppelin.", "His favourite: the album of Led Zeppelin!", True),
    ("Coffee.", "", False),
])
def test_string_match(gt, answer, expected):
    assert string_match(gt, answer) is expected


@pytest.mark.parametrize("reply, expected", [
    ("Yes", True), ("no.", False), ("  **Yes**", True), ("<think>maybe no... or yes</think>\nNo", False),
    ("The ground truth can be inferred: yes", True), ("it could be yes or no", None), ("I cannot tell", None),
    ("reasoning that ends the block</think> Yes", True),
])
def test_parse_verdict(reply, expected):
    assert parse_verdict(reply) is expected


class _ScriptedChat:
    """A chat backend that replies from a script and records what it was asked."""

    name = "scripted"

    def __init__(self, replies):
        self.replies = list(replies)
        self.asked: list[list[dict]] = []

    def chat(self, messages, **kwargs):
        self.asked.append(messages)
        return self.replies.pop(0)


def test_chat_judge_asks_with_question_truth_and_answer_and_retries_an_unreadable_reply():
    chat = _ScriptedChat(["Hmm, hard to say.", "Yes"])
    v = ChatJudge(chat, "scripted").judge("What are the drinks?", "Coffee.", "They drink espresso.")
    assert v.correct and v.method == "chat:scripted" and v.reply == "Yes" and len(chat.asked) == 2
    prompt = chat.asked[0][0]["content"]
    assert "What are the drinks?" in prompt and "Coffee." in prompt and "They drink espresso." in prompt


def test_chat_judge_counts_an_empty_answer_or_a_never_readable_reply_as_wrong():
    chat = _ScriptedChat(["perhaps", "perhaps"])
    assert not ChatJudge(chat, "s").judge("q", "gt", "an answer").correct and len(chat.asked) == 2
    silent = _ScriptedChat([])
    assert not ChatJudge(silent, "s").judge("q", "gt", "  ").correct and not silent.asked
