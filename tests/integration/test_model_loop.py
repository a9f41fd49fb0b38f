"""Memorization and control through a real chat-completions server on loopback, over real media."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.openai_server import OpenAIServer, Reply

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"

pytestmark = pytest.mark.slow

if not DATA.is_dir():
    pytest.skip(f"real media not found at {DATA}", allow_module_level=True)
if shutil.which("ffmpeg") is None:
    pytest.skip("ffmpeg is not installed", allow_module_level=True)

GOOD = json.dumps({
    "video_descriptions": ["A man faces the camera and reads out a short command."],
    "high_level_conclusions": ["The man speaks in a calm, even voice."],
})


@pytest.fixture(scope="module")
def server():
    with OpenAIServer() as s:
        yield s


@pytest.fixture(scope="module")
def built(server, tmp_path_factory):
    """A store whose first clip needed a retry and whose second failed, then was retried."""
    from m3mem.config import Config
    from m3mem.memory import Memory

    root = tmp_path_factory.mktemp("model-store")
    cfg = Config(memorize_model=f"openai:{server.url}?model=memorizer", memorize_retries=2)
    files = [DATA / "grid" / "bbaf2n.mpg", DATA / "jfk.wav"]
    server.script(
        Reply.chat("Sure! Here is what I saw: a man talking."),         # bbaf2n, try 1: no JSON
        Reply.chat(GOOD),                                               # bbaf2n, try 2
        Reply.chat('{"episodic": ["<face_99> waves."], "semantic": []}'),  # jfk: an id it never saw
        Reply.chat("{not json"),
        Reply.chat('{"semantic": ["<voice_98> is a teacher."]}'),
    )
    with Memory(root, cfg) as mem:
        first = mem.ingest(files)
        failed = {c.id: c.error for c in mem.store.clips() if c.status == "failed"}
    server.script(Reply.chat(json.dumps({
        "episodic": ["A man says that people should ask what they can do for their country."],
        "semantic": ["The speaker gives a speech about duty to one's country."],
    })))
    with Memory(root, cfg) as mem:
        again = mem.ingest(files, retry_failed=True)
    return root, first, failed, again


def test_malformed_memorization_is_retried_then_recorded_as_failed_with_its_reason(built):
    root, first, failed, again = built
    status = {Path(f.path).name: f for f in first.files}
    assert status["bbaf2n.mpg"].status == "done"
    assert status["jfk.wav"].status == "failed" and status["jfk.wav"].clips_failed == 1
    (reason,) = failed.values()
    assert "3 tries" in reason


def test_retry_failed_takes_the_failed_clip_again_and_keeps_the_rest(built):
    from m3mem.memory import Memory

    root, first, failed, again = built
    status = {Path(f.path).name: f for f in again.files}
    assert status["jfk.wav"].clips_done == 1 and status["bbaf2n.mpg"].status == "skipped"
    with Memory(root, read_only=True) as mem:
        texts = [r[0] for r in mem.store.execute("SELECT text FROM nodes WHERE kind IN ('episodic','semantic')")]
        assert all(c.status == "done" for c in mem.store.clips())
    assert "The man speaks in a calm, even voice." in texts
    assert not any("face_99" in t for t in texts)
    assert any("duty to one's country" in t for t in texts)


def test_memorization_request_carries_face_crops_as_images_and_utterances_as_data(server, built):
    bodies = [r.body for r in server.chat_requests() if r.body and r.body.get("model") == "memorizer"]
    grid = bodies[0]
    parts = [p for m in grid["messages"] if isinstance(m["content"], list) for p in m["content"]]
    assert any(p.get("type") == "image_url" and p["image_url"]["url"].startswith("data:image/jpeg;base64,")
               for p in parts)
    assert any("<face_1>" in p.get("text", "") for p in parts)


def test_control_loop_searches_gets_a_hint_for_a_repeat_and_answers_with_citations(server, built):
    from m3mem.config import Config
    from m3mem.memory import Memory

    root = built[0]
    server.script(
        Reply.chat("Action: [Search]\nContent: a speech about the country"),
        Reply.chat("I will look again.\nAction: [Search]\nContent: a speech about the country"),
        Reply.chat("Action: [Answer]\nContent: He asked people what they can do for their country."),
    )
    cfg = Config(control_model=f"openai:{server.url}?model=controller", max_rounds=5)
    with Memory(root, cfg, read_only=True) as mem:
        answer = mem.ask("What did the speaker ask of people?")
    assert [r["action"] for r in answer.rounds] == ["search", "search", "answer"]
    assert answer.rounds[0]["clips"] and answer.rounds[0]["clips"][0]["video"] == "jfk.wav"
    assert answer.rounds[1]["clips"] == []
    assert answer.answer.startswith("He asked people")
    assert answer.citations[0]["video"] == "jfk.wav"
    last = [r.body for r in server.chat_requests() if r.body and r.body.get("model") == "controller"][-1]
    text = json.dumps(last["messages"])
    assert "already made" in text  # the repeated search got a hint, not the same clips again


def test_the_last_round_forces_an_answer(server, built):
    from m3mem.config import Config
    from m3mem.memory import Memory

    server.script(
        Reply.chat("Action: [Search]\nContent: first idea"),
        Reply.chat("Action: [Search]\nContent: a second idea"),
    )
    cfg = Config(control_model=f"openai:{server.url}?model=controller2", max_rounds=2)
    with Memory(built[0], cfg, read_only=True) as mem:
        answer = mem.ask("Who spoke?")
    assert len(answer.rounds) == 2 and answer.rounds[-1]["action"] == "answer"
    last = [r.body for r in server.chat_requests() if r.body and r.body.get("model") == "controller2"][-1]
    assert "must answer now" in json.dumps(last["messages"])


def test_before_hides_memory_from_later_clips(built):
    from m3mem.memory import Memory

    with Memory(built[0], read_only=True) as mem:
        assert any(h.video == "jfk.wav" for h in mem.search("country", top_k=5))
        assert not any(h.video == "jfk.wav" for h in mem.search("country", top_k=5, before_s=5.0))
