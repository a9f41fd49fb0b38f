import numpy as np
import pytest

from m3mem.graph import group_entities, stable_ids
from m3mem.identity import assign_one_to_one, group_faces, group_voices
from m3mem.records import l2_normalize


def _people(n, dim=16, seed=0):
    return l2_normalize(np.random.default_rng(seed).normal(size=(n, dim)))


def _noisy(v, scale, seed):
    return l2_normalize(v + np.random.default_rng(seed).normal(scale=scale, size=v.shape))


def test_two_faces_in_one_frame_are_never_one_track_even_when_alike():
    a = _people(1)[0]
    twin = _noisy(a, 0.01, 1)  # nearly identical embeddings, but seen in the same frame
    times = [0.5, 0.5, 1.5, 1.5]
    emb = np.stack([a, twin, _noisy(a, 0.01, 2), _noisy(twin, 0.01, 3)])
    groups = group_faces(times, emb, threshold=0.5)
    for g in groups:
        ts = [times[i] for i in g]
        assert len(ts) == len(set(ts)), f"a track holds two faces of one frame: {g}"
    assert len(groups) == 2


def test_same_face_across_frames_forms_one_track_and_strangers_stay_apart():
    p = _people(2, seed=5)
    times, emb = [], []
    for t in range(6):
        times += [t + 0.5, t + 0.5]
        emb += [_noisy(p[0], 0.05, 10 + t), _noisy(p[1], 0.05, 20 + t)]
    groups = group_faces(times, np.stack(emb), threshold=0.6)
    assert sorted(len(g) for g in groups) == [6, 6]
    assert all(len({i % 2 for i in g}) == 1 for g in groups)


def test_overlapping_voices_are_two_speakers():
    v = _people(1, seed=3)[0]
    spans = [(0.0, 3.0), (1.0, 4.0), (5.0, 7.0)]
    emb = np.stack([v, _noisy(v, 0.01, 1), _noisy(v, 0.01, 2)])
    groups = group_voices(spans, emb, threshold=0.5)
    assert not any({0, 1} <= set(g) for g in groups)
    assert len(groups) == 2


def test_assignment_is_one_to_one_and_respects_threshold():
    sim = np.array([[0.9, 0.85], [0.88, 0.2], [0.1, 0.1]])
    match = assign_one_to_one(sim, 0.5)
    assert match == {0: 1, 1: 0}  # total similarity beats greedy row 0 -> col 0


def test_equivalence_that_would_join_two_faces_seen_together_is_refused():
    ents = ["face_1", "face_2", "voice_1", "voice_2"]
    eq = [("face_1", "voice_1", 3.0), ("face_2", "voice_2", 2.0), ("face_2", "voice_1", 1.0)]
    groups, refused = group_entities(ents, eq, conflicts=[("face_1", "face_2")])
    assert {"face_1", "voice_1"} in groups and {"face_2", "voice_2"} in groups
    assert refused and refused[0][:2] == ("face_2", "voice_1")


def test_without_conflict_the_same_equivalences_merge():
    ents = ["face_1", "face_2", "voice_1"]
    groups, refused = group_entities(ents, [("face_1", "voice_1", 1), ("face_2", "voice_1", 1)], [])
    assert groups == [{"face_1", "face_2", "voice_1"}] and not refused


def test_character_ids_survive_a_rebuild_and_a_split_keeps_the_larger_part():
    first, n = stable_ids([{"face_1", "voice_1"}, {"face_2"}], {}, 1)
    assert first["face_1"] == first["voice_1"] != first["face_2"]
    again, n2 = stable_ids([{"face_2"}, {"face_1", "voice_1"}, {"face_3"}], first, n)
    assert again["face_1"] == first["face_1"] and again["face_2"] == first["face_2"]
    assert again["face_3"] not in set(first.values())
    split, _ = stable_ids([{"face_1", "face_4"}, {"voice_1"}], {"face_1": "character_1", "face_4": "character_1",
                                                               "voice_1": "character_1"}, 5)
    assert split["face_1"] == "character_1" and split["voice_1"] == "character_5"


def test_a_veto_keeps_two_people_apart_when_one_voice_links_both():
    ents = ["face_1", "face_2", "voice_1"]
    eq = [("face_1", "voice_1", 2.0), ("face_2", "voice_1", 1.0)]

    def compatible(a, b):
        apart = ("face_1" in a and "face_2" in b) or ("face_2" in a and "face_1" in b)
        return "faces differ" if apart else None

    groups, refused = group_entities(ents, eq, [], compatible=compatible)
    assert {"face_1", "voice_1"} in groups and {"face_2"} in groups
    assert refused == [("face_2", "voice_1", "faces differ")]
    # a person's own merge (infinite weight) is not vetoed
    groups, _ = group_entities(ents, eq + [("face_1", "face_2", float("inf"))], [], compatible=compatible)
    assert groups == [{"face_1", "face_2", "voice_1"}]


def test_a_track_split_in_two_within_a_clip_rejoins_its_node(tmp_path):
    from m3mem.identity import Candidate, IdentityMatcher
    from m3mem.store import Store

    store = Store.open(tmp_path / "s")
    a, b = _people(2, dim=8, seed=9)
    m = IdentityMatcher(store, "face", 8, threshold=0.9)
    with store.transaction():
        (first,) = m.assign([Candidate(a, 1.0, (0.5,))], clip_id=None)
    # the same person as two tracks at different times, plus a stranger in the same frame as one of them
    with store.transaction():
        ids = m.assign([Candidate(_noisy(a, 0.01, 1), 1.0, (0.5, 1.5)), Candidate(_noisy(a, 0.01, 2), 0.9, (5.5,)),
                        Candidate(b, 1.0, (0.5,))], clip_id=None)
    assert ids[0] == ids[1] == first and ids[2] != first
    # two look-alikes seen in one frame stay two people
    with store.transaction():
        ids = m.assign([Candidate(_noisy(a, 0.01, 3), 1.0, (7.5,)), Candidate(_noisy(a, 0.01, 4), 0.9, (7.5,))],
                       clip_id=None)
    assert ids[0] != ids[1]
    store.close()
