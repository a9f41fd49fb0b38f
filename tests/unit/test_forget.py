"""Forgetting a person removes every trace of them from the store, its indexes and its files."""
from __future__ import annotations

import base64
import hashlib
import io
import re

import numpy as np
import pytest
from PIL import Image

from m3mem import people
from m3mem.forget import forget_person
from m3mem.records import Clip, ClipPerception, FaceTrack, SpeechSegment, VideoInfo, l2_normalize
from m3mem.retrieval import search
from m3mem.store import Store
from m3mem.writer import commit_identity, commit_memory, refresh_characters
from pipelines.memorize import memorize_lite

DIM = 16
SPOKEN = "ask not what your country can do for you"


class WordEmbedder:
    """Bag of hashed words: enough for retrieval to find a line by a word it contains."""

    dim = 64

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z]+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        return l2_normalize(out + 1e-6)


def _crop(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (24, 24), color).save(buf, format="JPEG")
    return buf.getvalue()


def _unit(i: int) -> np.ndarray:
    return l2_normalize(np.eye(DIM, dtype=np.float32)[i] + 0.01)


@pytest.fixture
def built(tmp_path):
    """Two clips: Jack (face + voice) and Ann (face only) together, then Jack alone."""
    root = tmp_path / "store"
    store = Store.open(root)
    info = VideoInfo(path="/media/speech.mp4", duration_s=20.0, has_video=True, has_audio=True)
    _, rows = store.add_video("sha-speech", info, [Clip("v", 0, 0.0, 10.0), Clip("v", 1, 10.0, 20.0)])
    jack_face, jack_voice, ann_face = _unit(0), _unit(1), _unit(5)
    perceptions = [
        ClipPerception(
            Clip("v", 0, 0.0, 10.0),
            faces=(FaceTrack(0, (0.5, 1.5, 2.5), jack_face, 0.9, 0.99, _crop("red")),
                   FaceTrack(1, (0.5, 1.5), ann_face, 0.8, 0.98, _crop("blue"))),
            speech=(SpeechSegment(0.6, 2.4, SPOKEN, embedding=jack_voice),
                    SpeechSegment(7.0, 7.3, "lovely")),
            sample_times_s=tuple(k + 0.5 for k in range(10)),
        ),
        ClipPerception(
            Clip("v", 1, 10.0, 20.0),
            faces=(FaceTrack(0, (10.5, 11.5), jack_face, 0.9, 0.99, _crop("red")),),
            speech=(SpeechSegment(10.4, 11.6, "my fellow americans", embedding=jack_voice),),
            sample_times_s=tuple(10 + k + 0.5 for k in range(10)),
        ),
    ]
    embedder = WordEmbedder()
    for row, perception in zip(rows, perceptions):
        store.save_perception(row.id, perception)
        identity = commit_identity(store, row.id, perception, face_dim=DIM, face_threshold=0.6, voice_dim=DIM,
                                   voice_threshold=0.6, max_exemplars=8, frame_step_s=1.0)
        commit_memory(store, row.id, memorize_lite(perception, identity, 1.0), embedder)
    refresh_characters(store)
    jack = people.resolve(store, "face_1")
    people.rename(store, jack, "Jack Kennedy")
    return store, root, rows, embedder, jack_face


def _file_bytes(root) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.iterdir()) if p.is_file())


def test_forget_removes_the_person_and_every_line_about_them(built):
    store, root, rows, embedder, jack_face = built
    jack = people.resolve(store, "Jack Kennedy")
    assert set(people.members(store, jack)) == {"face_1", "voice_1"}
    assert any(SPOKEN in line for h in search(store, embedder, "country", top_k=5) for line in h.lines)
    faces_before = len(store.index("face"))

    report = forget_person(store, "Jack Kennedy")

    assert report.person == jack and set(report.entities) == {"face_1", "voice_1"}
    assert report.lines >= 4 and report.crops == 2 and report.clips_scrubbed == 2
    for node in ("face_1", "voice_1", jack):
        assert store.node(node) is None
    for table in ("embeddings", "appearances", "crops"):
        n = store.execute(f"SELECT COUNT(*) FROM {table} WHERE node_id IN ('face_1','voice_1')").fetchone()[0]
        assert n == 0, table
    assert store.execute("SELECT COUNT(*) FROM edges WHERE src IN ('face_1','voice_1',?) OR dst IN ('face_1','voice_1',?)",
                         (jack, jack)).fetchone()[0] == 0
    texts = [t for (t,) in store.execute("SELECT text FROM nodes WHERE text IS NOT NULL")]
    assert not [t for t in texts if re.search(r"face_1\b|voice_1\b|country|americans|Jack", t)]
    # the vector index and the text search no longer reach them
    assert len(store.index("face")) == faces_before - 2
    scores, ids = store.index("face").search(jack_face[None, :], 5)
    assert set(store.embedding_nodes(ids[0]).values()) == {"face_2"}
    for query in ("country", "Jack Kennedy", "fellow americans", "<face_1>"):
        for hit in search(store, embedder, query, top_k=5):
            assert not [line for line in hit.lines if re.search(r"country|americans|Jack|face_1\b|voice_1\b", line)]
    assert "Jack Kennedy" not in " ".join(d or "" for (d,) in store.execute("SELECT detail FROM journal"))


def test_forget_keeps_the_other_person_and_their_memory(built):
    store, root, rows, embedder, _ = built
    ann = people.resolve(store, "face_2")
    people.rename(store, ann, "Ann")
    forget_person(store, "face_1")
    remaining = people.list_people(store)
    assert [(p.id, p.faces, p.voices, p.name) for p in remaining] == [(ann, ("face_2",), (), "Ann")]
    assert store.best_crop("face_2") == _crop("blue")
    texts = [t for (t,) in store.execute("SELECT text FROM nodes WHERE kind='episodic'")]
    assert "<face_2> is visible from 0:00 to 0:02." in texts
    assert 'Someone says at 0:07: "lovely"' in texts
    hits = search(store, embedder, "Ann visible", top_k=5)
    assert hits and hits[0].lines[0] == "Ann is visible from 0:00 to 0:02."


def test_forget_scrubs_the_cached_perception_of_each_clip(built):
    store, root, rows, embedder, _ = built
    forget_person(store, "face_1")
    first = store.perception(rows[0].id)
    assert [t.local_id for t in first.faces] == [1]
    assert [s.text for s in first.speech] == ["lovely"]
    assert store.identity(rows[0].id) == {"faces": {"1": "face_2"}, "voices": {}}
    second = store.perception(rows[1].id)
    assert second.faces == () and second.speech == ()


def test_forgotten_vectors_crops_and_words_are_gone_from_the_files(built):
    store, root, rows, embedder, jack_face = built
    raw_face = np.asarray(jack_face, dtype="<f4").tobytes()
    b64_face = base64.b64encode(raw_face)
    crop = _crop("red")
    before = _file_bytes(root)
    store.save_indexes()
    assert raw_face in _file_bytes(root) and SPOKEN.encode() in before + _file_bytes(root)

    forget_person(store, "Jack Kennedy")
    store.close()

    after = _file_bytes(root)
    for secret in (raw_face, b64_face, crop, base64.b64encode(crop), SPOKEN.encode(), b"Jack Kennedy"):
        assert secret not in after
    # a reopened store (indexes loaded from their files) still does not find them
    reopened = Store.open(root)
    scores, ids = reopened.index("face").search(jack_face[None, :], 5)
    assert set(reopened.embedding_nodes(ids[0]).values()) == {"face_2"}
    assert [p.faces for p in people.list_people(reopened)] == [("face_2",)]
    reopened.close()


def test_forget_an_unknown_person_is_an_input_error(built):
    from m3mem.errors import InputError

    store, *_ = built
    with pytest.raises(InputError):
        forget_person(store, "nobody")
