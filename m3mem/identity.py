"""Identity: who is who, within a clip and across clips and videos.

Two steps. Within a clip, detections are grouped into tracks (faces) and
segments into voice groups, never putting two faces of one frame, or two
overlapping voices, in one group. Across clips, each group is matched to the
face or voice nodes already in the store through the FAISS index of their
exemplar embeddings, one-to-one within the clip, with the backend's calibrated
threshold. Unmatched groups become new nodes ``face_N`` / ``voice_N``.

M3-Agent accepts a face node at mean cosine >= 0.3 after scanning every node,
and lets two faces of one clip fall into one node; both are avoided here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from m3mem.records import l2_normalize

log = logging.getLogger(__name__)

_NEG = -1e6


def assign_one_to_one(sim: np.ndarray, threshold: float, forbidden: np.ndarray | None = None) -> dict[int, int]:
    """Rows to columns, each used once, maximising total similarity among pairs >= threshold."""
    if sim.size == 0:
        return {}
    cost = np.where(sim >= threshold, sim, _NEG)
    if forbidden is not None:
        cost = np.where(forbidden, _NEG, cost)
    rows, cols = linear_sum_assignment(-cost)
    return {int(r): int(c) for r, c in zip(rows, cols) if cost[r, c] > _NEG / 2}


@dataclass
class _Group:
    members: list[int]
    total: np.ndarray

    @property
    def centroid(self) -> np.ndarray:
        return l2_normalize(self.total)


def group_faces(times: Sequence[float], embeddings: np.ndarray, threshold: float) -> list[list[int]]:
    """Group face detections of one clip into tracks.

    Detections are visited frame by frame; a frame's faces are assigned one-to-one
    to the tracks so far (so two faces in one frame never share a track), and a
    face that matches no track starts one.
    """
    order = sorted(range(len(times)), key=lambda i: (times[i], i))
    groups: list[_Group] = []
    k = 0
    while k < len(order):
        frame = [order[k]]
        while k + len(frame) < len(order) and times[order[k + len(frame)]] == times[order[k]]:
            frame.append(order[k + len(frame)])
        k += len(frame)
        if groups:
            cent = np.stack([g.centroid for g in groups])
            sim = embeddings[frame] @ cent.T
            match = assign_one_to_one(sim, threshold)
        else:
            match = {}
        for row, i in enumerate(frame):
            if row in match:
                g = groups[match[row]]
                g.members.append(i)
                g.total = g.total + embeddings[i]
            else:
                groups.append(_Group([i], embeddings[i].copy()))
    return [g.members for g in groups]


def group_voices(spans: Sequence[tuple[float, float]], embeddings: np.ndarray, threshold: float) -> list[list[int]]:
    """Group the embedded speech segments of one clip by speaker; overlapping segments stay apart."""
    groups: list[_Group] = []
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][0], i)):
        best, best_sim = None, threshold
        for gi, g in enumerate(groups):
            if any(_overlap(spans[i], spans[j]) > 0.25 for j in g.members):
                continue
            s = float(embeddings[i] @ g.centroid)
            if s >= best_sim:
                best, best_sim = gi, s
        if best is None:
            groups.append(_Group([i], embeddings[i].copy()))
        else:
            groups[best].members.append(i)
            groups[best].total = groups[best].total + embeddings[i]
    return [g.members for g in groups]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


@dataclass(frozen=True)
class Candidate:
    """A group of one clip to be matched: its embedding and how good it is."""

    embedding: np.ndarray
    quality: float
    times: tuple = ()  # when the group was seen or heard; groups sharing a time are two people


class IdentityMatcher:
    """Matches one space's clip groups (faces or voices) to the store's nodes.

    Each node keeps at most ``max_exemplars`` embeddings, the highest-quality ones
    seen (ties broken by arrival), so a node's description is deterministic and
    bounded however often the person appears.
    """

    def __init__(self, store, space: str, dim: int, threshold: float, max_exemplars: int = 8, search_k: int = 64):
        self.store = store
        self.space = space
        self.dim = dim
        self.threshold = threshold
        self.max_exemplars = max_exemplars
        self.search_k = search_k

    def match(self, candidates: Sequence[Candidate]) -> list[tuple[str | None, float]]:
        """For each candidate, the best existing node (one-to-one) and its score, or (None, best score)."""
        if not candidates:
            return []
        index = self.store.index(self.space, self.dim)
        if index is None or len(index) == 0:
            return [(None, 0.0)] * len(candidates)
        queries = np.stack([c.embedding for c in candidates])
        scores, ids = index.search(queries, self.search_k)
        owner = self.store.embedding_nodes(np.unique(ids[ids >= 0]))
        # a node's score is its best exemplar's similarity
        node_scores: list[dict[str, float]] = []
        for row in range(len(candidates)):
            best: dict[str, float] = {}
            for s, eid in zip(scores[row], ids[row]):
                nid = owner.get(int(eid))
                if nid is not None and s > best.get(nid, -2.0):
                    best[nid] = float(s)
            node_scores.append(best)
        nodes = sorted({n for d in node_scores for n in d}, key=_node_order)
        col = {n: j for j, n in enumerate(nodes)}
        sim = np.full((len(candidates), len(nodes)), -2.0, dtype=np.float32)
        for row, d in enumerate(node_scores):
            for n, s in d.items():
                sim[row, col[n]] = s
        match = assign_one_to_one(sim, self.threshold)
        out = []
        for row in range(len(candidates)):
            best_score = float(sim[row].max()) if len(nodes) else 0.0
            out.append((nodes[match[row]], float(sim[row, match[row]])) if row in match else (None, best_score))
        return out

    def assign(self, candidates: Sequence[Candidate], clip_id: int) -> list[str]:
        """Match, create nodes for the unmatched, and update exemplars; inside the caller's transaction."""
        matches = self.match(candidates)
        matches = self._rejoin_split_tracks(candidates, matches)
        out = []
        for cand, (node_id, score) in zip(candidates, matches):
            if node_id is None:
                node_id = self.store.new_id(self.space)
                self.store.add_node(node_id, self.space, clip_id=clip_id)
                log.debug("new %s (best existing score %.3f < %.3f)", node_id, score, self.threshold)
            self._update_exemplars(node_id, cand, clip_id)
            out.append(node_id)
        return out

    def _rejoin_split_tracks(self, candidates, matches):
        """One-to-one is about co-occurrence: a group left unmatched because its node went
        to another group of the clip takes that node too when the two never co-occur
        (one person whose track the clip split in two)."""
        taken: dict[str, list[int]] = {}
        for i, (node_id, _) in enumerate(matches):
            if node_id is not None:
                taken.setdefault(node_id, []).append(i)
        out = list(matches)
        for i, (node_id, score) in enumerate(matches):
            if node_id is not None or score < self.threshold or not candidates[i].times:
                continue
            best = self.match_one(candidates[i])
            if best is None or best not in taken:
                continue
            if all(not (set(candidates[i].times) & set(candidates[j].times)) for j in taken[best]):
                out[i] = (best, score)
                taken[best].append(i)
        return out

    def match_one(self, cand: Candidate) -> str | None:
        index = self.store.index(self.space, self.dim)
        scores, ids = index.search(cand.embedding[None, :], self.search_k)
        owner = self.store.embedding_nodes(ids[0][ids[0] >= 0])
        for s, eid in zip(scores[0], ids[0]):
            if s >= self.threshold and int(eid) in owner:
                return owner[int(eid)]
        return None

    def _update_exemplars(self, node_id: str, cand: Candidate, clip_id: int) -> None:
        existing = self.store.embeddings_of(node_id, self.space)
        if len(existing) < self.max_exemplars:
            self.store.add_embedding(node_id, self.space, cand.embedding, cand.quality, clip_id)
            return
        worst_id, _, worst_q = min(existing, key=lambda e: (e[2], -e[0]))
        if cand.quality > worst_q:
            self.store.remove_embedding(worst_id)
            self.store.add_embedding(node_id, self.space, cand.embedding, cand.quality, clip_id)


def _node_order(node_id: str) -> tuple[str, int]:
    kind, _, n = node_id.rpartition("_")
    return kind, int(n) if n.isdigit() else 0
