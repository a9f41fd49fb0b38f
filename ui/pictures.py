"""Data for the pictures: who appears and speaks when in a video, and the graph around a node.

Both read a bounded part of the store (one video's appearances; a breadth-first
walk that stops at a node budget), so they stay quick on a large library.
"""
from __future__ import annotations

from m3mem.retrieval import character_map, translate
from pipelines.memorize import fmt_time

# edges leading from a node are many for a person seen in many clips; show this many of each kind
PER_KIND = 8


def timeline_rows(store, video_id: int) -> list[tuple[str, list[tuple[float, float, str]]]]:
    """One row per person (or unattached face/voice) with merged spans (start, end, face|voice)."""
    rows = store.execute(
        "SELECT a.node_id, a.start_s, a.end_s, a.kind, m.dst FROM appearances a JOIN clips c ON c.id = a.clip_id"
        " LEFT JOIN edges m ON m.src = a.node_id AND m.kind = 'member' WHERE c.video_id=? ORDER BY a.start_s",
        (video_id,),
    ).fetchall()
    labels = character_map(store)
    spans: dict[str, list[tuple[float, float, str]]] = {}
    first: dict[str, float] = {}
    for node, a, b, kind, person in rows:
        key = person or node
        spans.setdefault(key, []).append((a, b, kind))
        first.setdefault(key, a)
    out = []
    for key in sorted(spans, key=lambda k: (first[k], k)):
        out.append((labels.get(key, key), _merge(spans[key])))
    return out


def _merge(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    merged: list[list] = []
    for a, b, kind in sorted(spans, key=lambda s: (s[2], s[0])):
        if merged and merged[-1][2] == kind and a <= merged[-1][1] + 0.05:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b, kind])
    return [tuple(m) for m in merged]


def _adjacent(store, node: str) -> list[tuple[str, str]]:
    if node.startswith("clip_"):
        lines = store.execute(
            "SELECT id FROM nodes WHERE clip_id=? AND kind IN ('episodic','semantic') ORDER BY seq LIMIT ?",
            (int(node[5:]), 2 * PER_KIND),
        ).fetchall()
        return [(n, "from_clip") for (n,) in lines]
    out: list[tuple[str, str]] = []
    counts: dict[str, int] = {}
    for other, kind in store.execute(
        "SELECT dst, kind FROM edges WHERE src=? UNION ALL SELECT src, kind FROM edges WHERE dst=?", (node, node)
    ):
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= PER_KIND:
            out.append((other, kind))
    row = store.node(node)
    if row and row["kind"] in ("episodic", "semantic") and row["clip_id"] is not None:
        out.append((f"clip_{row['clip_id']}", "from_clip"))
    return out


def neighbourhood(store, center: str, radius: int = 3, max_nodes: int = 40) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """Nodes (id, kind, label, title, image) and edges (a, b, kind) within ``radius`` steps of ``center``."""
    seen = [center]
    level = [center]
    edges: set[tuple[str, str, str]] = set()
    for _ in range(radius):
        nxt = []
        for node in level:
            for other, kind in _adjacent(store, node):
                if other not in seen:
                    if len(seen) >= max_nodes:
                        continue
                    seen.append(other)
                    nxt.append(other)
                edges.add((*sorted((node, other)), kind))
        level = nxt
    labels = character_map(store)
    nodes = [_describe(store, n, labels) for n in seen]
    known = {n["id"] for n in nodes}
    return nodes, sorted(e for e in edges if e[0] in known and e[1] in known)


def _describe(store, node: str, labels: dict[str, str]) -> dict:
    if node.startswith("clip_"):
        row = store.execute(
            "SELECT v.name, c.start_s, c.end_s FROM clips c JOIN videos v ON v.id = c.video_id WHERE c.id=?",
            (int(node[5:]),),
        ).fetchone()
        label = f"{row[0]} {fmt_time(row[1])}-{fmt_time(row[2])}" if row else node
        return {"id": node, "kind": "clip", "label": label, "title": label, "image": None}
    row = store.node(node) or {"kind": "unknown", "text": None, "name": None}
    kind = row["kind"]
    if kind in ("episodic", "semantic"):
        text = translate(row["text"] or "", labels)
        return {"id": node, "kind": kind, "label": text[:28], "title": f"{node}: {text}", "image": None}
    if kind == "character":
        label = row["name"] or node
        return {"id": node, "kind": kind, "label": label, "title": f"{label} ({node})", "image": None}
    person = labels.get(node)
    title = f"{node} ({person})" if person and person != node else node
    image = store.best_crop(node) if kind == "face" else None
    return {"id": node, "kind": kind, "label": node, "title": title, "image": image}


def layout(nodes: list[dict], edges: list[tuple[str, str, str]], center: str) -> dict[str, tuple[float, float]]:
    """Spring layout in [-1, 1]²; a fixed seed, so the same graph always lands the same way."""
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(n["id"] for n in nodes)
    g.add_edges_from((a, b) for a, b, _ in edges)
    if len(g) == 1:
        return {center: (0.0, 0.0)}
    pos = nx.spring_layout(g, seed=7, k=1.8 / len(g) ** 0.5)
    span = max(max(abs(x), abs(y)) for x, y in pos.values()) or 1.0
    return {n: (float(x) / span, float(y) / span) for n, (x, y) in pos.items()}
