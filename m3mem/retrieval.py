"""Retrieval: a query to the clips whose memory best supports it.

The query is embedded, the text index gives the best memory nodes, and clips are
ranked by their best node. Entities named in the query (``<character_N>``,
``<face_N>``, ``<voice_N>`` or a person's name) scope the search to nodes that
mention them. Lines come back with face and voice ids translated to the
character (or name) they belong to, token-safely.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from m3mem.writer import TAG, embed_text

ENTITY = re.compile(r"<?\b((?:face|voice|character)_\d+)\b>?")


@dataclass(frozen=True)
class ClipHit:
    clip_id: int
    video: str
    video_path: str
    start_s: float
    end_s: float
    score: float
    lines: tuple[str, ...]
    node_ids: tuple[str, ...] = field(default=())
    line_scores: tuple[float, ...] = field(default=())

    def to_json(self) -> dict:
        return {
            "video": self.video,
            "path": self.video_path,
            "start": round(self.start_s, 3),
            "end": round(self.end_s, 3),
            "score": round(float(self.score), 4),
            "lines": list(self.lines),
        }


def character_map(store) -> dict[str, str]:
    """face/voice id -> the label a reader sees: the character's name, else its id."""
    names = {r[0]: r[1] for r in store.execute("SELECT id, name FROM nodes WHERE kind='character'")}
    out = {}
    for src, dst, _, _ in store.edges("member"):
        out[src] = names.get(dst) or dst
    for cid, name in names.items():
        out[cid] = name or cid
    return out


def translate(text: str, mapping: dict[str, str]) -> str:
    """Replace whole ``<kind_N>`` tags only, so ``face_1`` never rewrites ``face_10``."""

    if text.lower().startswith("equivalence"):
        return text  # translated, it would read "<character_1>, <character_1>"

    def sub(m: re.Match) -> str:
        label = mapping.get(m.group(1))
        if label is None:
            return m.group(0)
        return f"<{label}>" if TAG.fullmatch(f"<{label}>") else label

    return TAG.sub(sub, text)


def entities_in(store, query: str) -> set[str]:
    """Face and voice ids that a query names, through tags or a person's name."""
    named: set[str] = set(ENTITY.findall(query))
    lowered = query.lower()
    for cid, name in store.execute("SELECT id, name FROM nodes WHERE kind='character' AND name IS NOT NULL"):
        if re.search(rf"\b{re.escape(name.lower())}\b", lowered):
            named.add(cid)
    out: set[str] = set()
    for e in named:
        if e.startswith("character_"):
            out |= set(store.neighbours(e, "member"))
        else:
            out.add(e)
    return out


def search(store, embedder, query: str, top_k: int = 5, exclude_clips: set[int] | frozenset = frozenset(),
           before_s: float | None = None, lines_per_clip: int = 12) -> list[ClipHit]:
    qvec = embedder.embed([embed_text(ENTITY.sub(lambda m: "someone", query))])[0]
    scoped = entities_in(store, query)
    node_scores: dict[str, float] = {}
    if scoped:
        linked: set[str] = set()
        for e in scoped:
            linked |= set(store.neighbours(e, "mentions"))
        names, vecs = store.vectors_for_nodes(sorted(linked), "text")
        for n, s in zip(names, (vecs @ qvec) if len(names) else []):
            node_scores[n] = max(node_scores.get(n, -1.0), float(s))
    else:
        index = store.index("text", embedder.dim)
        if index is None or len(index) == 0:
            return []
        k = 256
        while True:
            scores, ids = index.search(qvec[None, :], k)
            owner = store.embedding_nodes(ids[0])
            for s, eid in zip(scores[0], ids[0]):
                nid = owner.get(int(eid))
                if nid is not None:
                    node_scores[nid] = max(node_scores.get(nid, -1.0), float(s))
            # widen until enough distinct clips survive the filters, or the index is exhausted
            if k >= len(index) or len(_rank_clips(store, node_scores, exclude_clips, before_s)) >= top_k:
                break
            k *= 4
    ranked = _rank_clips(store, node_scores, exclude_clips, before_s)[:top_k]
    mapping = character_map(store)
    hits = []
    for clip_id, score in ranked:
        row = store.execute(
            "SELECT c.start_s, c.end_s, v.name, v.path FROM clips c JOIN videos v ON v.id = c.video_id WHERE c.id=?",
            (clip_id,),
        ).fetchone()
        nodes = store.execute(
            "SELECT id, text FROM nodes WHERE clip_id=? AND kind IN ('episodic','semantic') ORDER BY seq", (clip_id,)
        ).fetchall()
        scored = sorted(nodes, key=lambda n: -node_scores.get(n[0], -1.0))[:lines_per_clip]
        hits.append(
            ClipHit(
                clip_id=clip_id, video=row[2], video_path=row[3], start_s=row[0], end_s=row[1], score=score,
                lines=tuple(translate(t, mapping) for _, t in scored),
                node_ids=tuple(n for n, _ in scored),
                line_scores=tuple(node_scores.get(n, float("nan")) for n, _ in scored),
            )
        )
    return hits


def _rank_clips(store, node_scores: dict[str, float], exclude: set[int] | frozenset,
                before_s: float | None) -> list[tuple[int, float]]:
    if not node_scores:
        return []
    ids = list(node_scores)
    clip_of: dict[str, int] = {}
    for chunk in range(0, len(ids), 900):
        part = ids[chunk:chunk + 900]
        q = ",".join("?" * len(part))
        for nid, cid in store.execute(f"SELECT id, clip_id FROM nodes WHERE id IN ({q})", part):
            if cid is not None:
                clip_of[nid] = cid
    best: dict[int, float] = {}
    for nid, s in node_scores.items():
        cid = clip_of.get(nid)
        if cid is None or cid in exclude:
            continue
        best[cid] = max(best.get(cid, -1.0), s)
    if before_s is not None and best:
        allowed = _clips_ending_by(store, list(best), before_s)
        best = {c: s for c, s in best.items() if c in allowed}
    return sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))


def _clips_ending_by(store, clip_ids: list[int], before_s: float) -> set[int]:
    out = set()
    for chunk in range(0, len(clip_ids), 900):
        part = clip_ids[chunk:chunk + 900]
        q = ",".join("?" * len(part))
        for (cid,) in store.execute(f"SELECT id FROM clips WHERE id IN ({q}) AND end_s <= ?", [*part, before_s + 1e-6]):
            out.add(cid)
    return out

