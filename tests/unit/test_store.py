import sqlite3

import numpy as np
import pytest

from m3mem.errors import StoreError
from m3mem.records import Clip, VideoInfo, l2_normalize
from m3mem.retrieval import translate
from m3mem.store import Store


def _video(store, sha="abc", dur=65.0):
    info = VideoInfo(path="/tmp/x.mp4", duration_s=dur, has_video=True, has_audio=True)
    clips = [Clip(sha, 0, 0.0, 30.0), Clip(sha, 1, 30.0, 60.0), Clip(sha, 2, 60.0, dur)]
    return store.add_video(sha, info, clips)


def test_a_failed_transaction_leaves_no_rows_and_no_vectors(tmp_path):
    store = Store.open(tmp_path / "s")
    vid, clips = _video(store)
    idx = store.index("face", 4)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.add_node("face_1", "face", clip_id=clips[0].id)
            store.add_embedding("face_1", "face", l2_normalize(np.ones(4)))
            raise RuntimeError("crash in the middle of a clip")
    assert store.node("face_1") is None
    assert len(idx) == 0
    assert store.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0] == 0
    store.close()


def test_index_file_that_disagrees_with_the_database_is_rebuilt(tmp_path):
    root = tmp_path / "s"
    store = Store.open(root)
    for i in range(5):
        store.add_embedding(f"face_{i}", "face", l2_normalize(np.eye(8)[i]))
    store.index("face", 8)
    store.close()
    # a vector added by another process after the index was saved
    conn = sqlite3.connect(root / "memory.db")
    conn.execute("INSERT INTO embeddings (node_id, space, vector, quality) VALUES ('face_9','face',?,0)",
                 (np.eye(8, dtype="<f4")[7].tobytes(),))
    conn.commit()
    conn.close()
    store = Store.open(root)
    idx = store.index("face", 8)
    assert len(idx) == 6
    scores, ids = idx.search(np.eye(8, dtype=np.float32)[7:8], 1)
    assert store.embedding_nodes(ids[0]) == {int(ids[0][0]): "face_9"}
    store.close()
    (root / "face.faiss").write_bytes(b"not an index")
    store = Store.open(root)
    assert len(store.index("face", 8)) == 6
    store.close()


def test_same_content_hash_returns_the_existing_video(tmp_path):
    store = Store.open(tmp_path / "s")
    vid, clips = _video(store)
    vid2, clips2 = _video(store)
    assert vid == vid2 and [c.id for c in clips] == [c.id for c in clips2]
    assert store.counts()["videos"] == 1
    store.close()


def test_read_only_open_of_a_missing_store_says_what_to_do(tmp_path):
    with pytest.raises(StoreError, match="m3mem ingest"):
        Store.open(tmp_path / "nowhere", read_only=True)


def test_a_store_from_a_newer_version_is_refused(tmp_path):
    store = Store.open(tmp_path / "s")
    store.set_meta("schema_version", "999")
    store.close()
    with pytest.raises(StoreError, match="newer"):
        Store.open(tmp_path / "s")


def test_mixing_embedding_backends_is_refused(tmp_path):
    store = Store.open(tmp_path / "s")
    store.check_backends({"face": "dlib"})
    with pytest.raises(StoreError, match="cannot be compared"):
        store.check_backends({"face": "insightface:/m"})
    store.close()


def test_ids_are_translated_token_safely():
    mapping = {"face_1": "character_1", "face_10": "Alice"}
    text = "<face_1> greets <face_10>; <face_100> watches."
    assert translate(text, mapping) == "<character_1> greets Alice; <face_100> watches."
