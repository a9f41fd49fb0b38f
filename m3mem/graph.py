"""Characters (people) from faces and voices, and the networkx view of the memory graph.

A character is a group of face and voice nodes joined by equivalence edges.
Equivalences are applied strongest first (most support), and a join is refused
when it would put two faces seen in one frame, or two voices heard at once,
into one character. M3-Agent unions every equivalence transitively, so one bad
line merges two people seen together (its issue #18); here that join is logged
and dropped.

Character ids survive rebuilding: a rebuilt group takes the id that most of its
members had before.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Iterable

import networkx as nx

log = logging.getLogger(__name__)


class _Components:
    def __init__(self, items: Iterable[str]):
        self.parent = {x: x for x in items}
        self.members = {x: {x} for x in self.parent}

    def find(self, x: str) -> str:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra] |= self.members.pop(rb)


def group_entities(
    entities: Iterable[str],
    equivalences: Iterable[tuple[str, str, float]],
    conflicts: Iterable[tuple[str, str]],
    min_weight: float = 1.0,
    compatible=None,
) -> tuple[list[set[str]], list[tuple[str, str, str]]]:
    """Connected groups under the conflict guard, and the refused joins with the reason.

    ``compatible(group_a, group_b)`` may veto a join with a reason, e.g. when the two
    groups' faces look like different people: one voice heard over a cut between two
    people must not make them one.
    """
    entities = sorted(set(entities), key=_order)
    comps = _Components(entities)
    cannot: dict[str, set[str]] = {}
    for a, b in conflicts:
        cannot.setdefault(a, set()).add(b)
        cannot.setdefault(b, set()).add(a)
    refused = []
    for a, b, w in sorted(equivalences, key=lambda e: (-e[2], _order(e[0]), _order(e[1]))):
        if w < min_weight or a not in comps.parent or b not in comps.parent:
            continue
        ra, rb = comps.find(a), comps.find(b)
        if ra == rb:
            continue
        clash = next(
            ((x, y) for x in comps.members[ra] for y in cannot.get(x, ()) if y in comps.members[rb]), None
        )
        if clash:
            refused.append((a, b, f"{clash[0]} and {clash[1]} were seen or heard at the same time"))
            log.info("refused equivalence %s = %s: %s and %s co-occur", a, b, *clash)
            continue
        # a person's own edits (infinite weight) are not second-guessed
        why = compatible(comps.members[ra], comps.members[rb]) if compatible and w != float("inf") else None
        if why:
            refused.append((a, b, why))
            log.info("refused equivalence %s = %s: %s", a, b, why)
            continue
        comps.union(a, b)
    groups = sorted((comps.members[r] for r in {comps.find(x) for x in entities}), key=lambda g: min(map(_order, g)))
    return groups, refused


def stable_ids(groups: list[set[str]], previous: dict[str, str], next_number: int) -> tuple[dict[str, str], int]:
    """entity -> character id, reusing the id most members had; ``next_number`` numbers new ones."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    # bigger groups choose first so that a split keeps the id with its larger part
    for group in sorted(groups, key=lambda g: (-len(g), min(map(_order, g)))):
        votes = Counter(previous[e] for e in group if e in previous and previous[e] not in taken)
        if votes:
            cid = sorted(votes.items(), key=lambda kv: (-kv[1], _order(kv[0])))[0][0]
        else:
            cid = f"character_{next_number}"
            next_number += 1
        taken.add(cid)
        for e in group:
            out[e] = cid
    return out, next_number


def _order(node_id: str) -> tuple[str, int]:
    kind, _, n = node_id.rpartition("_")
    return kind, int(n) if n.isdigit() else 0


def build_view(nodes: Iterable[tuple], edges: Iterable[tuple], clips: Iterable[tuple]) -> nx.MultiDiGraph:
    """An in-memory graph for traversal: memory, entity, character, clip and video nodes."""
    g = nx.MultiDiGraph()
    for clip_id, video_id, start_s, end_s in clips:
        g.add_node(f"clip_{clip_id}", kind="clip", start=start_s, end=end_s)
        g.add_node(f"video_{video_id}", kind="video")
        g.add_edge(f"clip_{clip_id}", f"video_{video_id}", kind="part_of")
    for node_id, kind, text, clip_id, weight in nodes:
        g.add_node(node_id, kind=kind, text=text, weight=weight)
        if clip_id is not None and kind in ("episodic", "semantic"):
            g.add_edge(node_id, f"clip_{clip_id}", kind="from_clip")
    for src, dst, kind, weight in edges:
        g.add_edge(src, dst, kind=kind, weight=weight)
    return g
