"""The single writer: applies a clip's identity and memory to the store, one transaction each.

Ingestion may perceive and memorize clips anywhere (threads, Ray actors), but
only this code writes identities and graph nodes, in clip order, so ids are
deterministic and a crash loses at most the clip in flight.
"""
from __future__ import annotations

import logging
import re
from typing import Sequence

import numpy as np

from m3mem.graph import group_entities, stable_ids
from m3mem.identity import Candidate, IdentityMatcher, group_voices
from m3mem.records import ClipMemory, ClipPerception, l2_normalize

log = logging.getLogger(__name__)

TAG = re.compile(r"<((?:face|voice|character)_\d+)>")
# a repeated semantic fact reinforces the node it repeats; this close in text embedding counts as a repeat
REPEAT_SIMILARITY = 0.92


def commit_identity(store, clip_id: int, perception: ClipPerception, face_dim: int, face_threshold: float,
                    voice_dim: int, voice_threshold: float, max_exemplars: int, frame_step_s: float) -> dict:
    """Match the clip's face tracks and voice groups to nodes; record appearances, crops, conflicts."""
    from pipelines.memorize import face_spans  # span arithmetic is shared with the memory lines

    identity: dict = {"faces": {}, "voices": {}}
    with store.transaction():
        tracks = list(perception.faces)
        if tracks:
            matcher = IdentityMatcher(store, "face", face_dim, face_threshold, max_exemplars)
            ids = matcher.assign([Candidate(t.embedding, t.quality, t.times_s) for t in tracks], clip_id)
            for track, fid in zip(tracks, ids):
                identity["faces"][str(track.local_id)] = fid
                for a, b in face_spans(perception, track.times_s, frame_step_s):
                    store.add_appearance(fid, clip_id, a, b, "face")
                if track.crop_jpeg:
                    store.add_crop(fid, clip_id, track.quality, track.crop_jpeg)
            for i, ta in enumerate(tracks):
                for tb in tracks[i + 1:]:
                    if set(ta.times_s) & set(tb.times_s):
                        a, b = sorted((identity["faces"][str(ta.local_id)], identity["faces"][str(tb.local_id)]))
                        if a != b:
                            store.add_edge(a, b, "conflict", 1.0, accumulate=True)

        embedded = [i for i, s in enumerate(perception.speech) if s.embedding is not None]
        if embedded:
            segs = [perception.speech[i] for i in embedded]
            emb = l2_normalize(np.stack([s.embedding for s in segs]))
            groups = group_voices([(s.start_s, s.end_s) for s in segs], emb, voice_threshold)
            cands = []
            for members in groups:
                w = np.array([segs[m].end_s - segs[m].start_s for m in members], dtype=np.float32)
                cands.append(Candidate(l2_normalize((emb[members] * w[:, None]).sum(0)), float(w.sum())))
            matcher = IdentityMatcher(store, "voice", voice_dim, voice_threshold, max_exemplars)
            ids = matcher.assign(cands, clip_id)
            for members, vid in zip(groups, ids):
                for m in members:
                    seg_index = embedded[m]
                    identity["voices"][str(seg_index)] = vid
                    seg = perception.speech[seg_index]
                    store.add_appearance(vid, clip_id, seg.start_s, seg.end_s, "voice")
            for i, sa in enumerate(segs):
                for j in range(i + 1, len(segs)):
                    sb = segs[j]
                    if min(sa.end_s, sb.end_s) - max(sa.start_s, sb.start_s) > 0.25:
                        a, b = sorted((identity["voices"][str(embedded[i])], identity["voices"][str(embedded[j])]))
                        if a != b:
                            store.add_edge(a, b, "conflict", 1.0, accumulate=True)
        store.save_identity(clip_id, identity)
    return identity


def embed_text(text: str) -> str:
    """What the text embedder sees: entity tags carry no meaning for it."""
    return TAG.sub("someone", text)


def commit_memory(store, clip_id: int, memory: ClipMemory, embedder) -> list[str]:
    """Write episodic and semantic nodes, their links, and mark the clip done."""
    lines = [("episodic", t) for t in memory.episodic] + [("semantic", t) for t in memory.semantic]
    vectors = embedder.embed([embed_text(t) for _, t in lines]) if lines else np.zeros((0, 0), np.float32)
    written = []
    with store.transaction():
        for (kind, text), vec in zip(lines, vectors):
            entities = sorted(set(TAG.findall(text)))
            if kind == "semantic":
                existing = _repeated_fact(store, text, vec, entities, embedder.dim)
                if existing is not None:
                    store.execute("UPDATE nodes SET weight = weight + 1 WHERE id=?", (existing,))
                    store.add_edge(existing, f"clip_{clip_id}", "supports", 1.0, accumulate=True)
                    _record_equivalence(store, text)
                    written.append(existing)
                    continue
            node_id = store.new_id(kind)
            store.add_node(node_id, kind, text=text, clip_id=clip_id)
            store.add_embedding(node_id, "text", vec, 1.0, clip_id)
            for e in entities:
                store.add_edge(node_id, e, "mentions")
            if kind == "semantic":
                store.add_edge(node_id, f"clip_{clip_id}", "supports")
                _record_equivalence(store, text)
            written.append(node_id)
        store.set_clip_status(clip_id, "done")
    return written


def _record_equivalence(store, text: str) -> None:
    if text.lower().startswith("equivalence"):
        ids = TAG.findall(text)
        faces = [i for i in ids if i.startswith("face_")]
        voices = [i for i in ids if i.startswith("voice_")]
        for f in faces:
            for v in voices:
                store.add_edge(f, v, "equivalence", 1.0, accumulate=True)


def _repeated_fact(store, text: str, vec: np.ndarray, entities: Sequence[str], dim: int) -> str | None:
    """An existing semantic node saying the same about the same entities, if any."""
    if entities:
        candidates = None
        for e in entities:
            linked = {n for n in store.neighbours(e, "mentions") if n.startswith("semantic_")}
            candidates = linked if candidates is None else candidates & linked
        candidates = sorted(candidates or ())
        for nid in candidates:
            row = store.node(nid)
            if row and row["text"].strip().lower() == text.strip().lower():
                return nid
        if not candidates:
            return None
        names, vecs = store.vectors_for_nodes(candidates, "text")
        if len(names):
            sims = vecs @ vec
            best = int(np.argmax(sims))
            if sims[best] >= REPEAT_SIMILARITY and set(TAG.findall(store.node(names[best])["text"])) == set(entities):
                return names[best]
        return None
    index = store.index("text", dim)
    if index is None or len(index) == 0:
        return None
    scores, ids = index.search(vec[None, :], 8)
    owner = store.embedding_nodes(ids[0])
    for s, eid in zip(scores[0], ids[0]):
        nid = owner.get(int(eid))
        if nid and nid.startswith("semantic_") and s >= REPEAT_SIMILARITY:
            return nid
    return None


# Faces less alike than this are different people whatever the voices say. Far below any
# backend's match threshold: it vetoes only clear mismatches (dlib: different people
# 0.76-0.93, one person split in two nodes >= 0.93).
DIFFERENT_FACES = 0.85


def _faces_compatible(store):
    centroids: dict[str, np.ndarray] = {}

    def centroid(face_id: str) -> np.ndarray | None:
        if face_id not in centroids:
            vecs = [v for _, v, _ in store.embeddings_of(face_id, "face")]
            centroids[face_id] = l2_normalize(np.mean(vecs, axis=0)) if vecs else None
        return centroids[face_id]

    def check(a: set[str], b: set[str]) -> str | None:
        fa = [c for c in (centroid(f) for f in sorted(a) if f.startswith("face_")) if c is not None]
        fb = [c for c in (centroid(f) for f in sorted(b) if f.startswith("face_")) if c is not None]
        if not fa or not fb:
            return None
        best = float((np.stack(fa) @ np.stack(fb).T).max())
        if best < DIFFERENT_FACES:
            return f"their faces look like different people (best similarity {best:.2f})"
        return None

    return check


def refresh_characters(store) -> dict[str, str]:
    """Rebuild characters from faces, voices, equivalences and conflicts; ids stay stable."""
    entities = store.nodes_of_kind("face") + store.nodes_of_kind("voice")
    # a person's own edits come first and outweigh anything the models said
    forced = [(s, d, float("inf")) for s, d, _, _ in store.edges("same_person")]
    equivalences = forced + [(s, d, w) for s, d, _, w in store.edges("equivalence")]
    conflicts = [(s, d) for s, d, _, _ in store.edges("conflict") + store.edges("not_same_person")]
    groups, refused = group_entities(entities, equivalences, conflicts, compatible=_faces_compatible(store))
    previous = {src: dst for src, dst, _, _ in store.edges("member")}
    next_number = int(store.get_meta("next_character", "1"))
    mapping, next_number = stable_ids(groups, previous, next_number)
    with store.transaction() as c:
        c.execute("DELETE FROM edges WHERE kind='member'")
        live = set(mapping.values())
        for cid in sorted(live):
            if store.node(cid) is None:
                store.add_node(cid, "character")
        for old in set(store.nodes_of_kind("character")) - live:
            c.execute("DELETE FROM nodes WHERE id=?", (old,))
        for e, cid in mapping.items():
            store.add_edge(e, cid, "member")
        c.execute("INSERT OR REPLACE INTO meta VALUES ('next_character', ?)", (str(next_number),))
        for a, b, why in refused:
            store.journal("equivalence_refused", detail=f"{a} = {b}: {why}")
    return mapping
