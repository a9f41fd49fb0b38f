"""Search latency: m3mem's indexed search against reload-and-scan, at 10k to 1M memory nodes.

M3-Agent loads the whole memory graph from its pickle on every search and compares
the query with every text node in a Python loop. The baseline here does the same
from the store's SQLite file (which is faster to read than unpickling a graph, so the
ratio is, if anything, in the baseline's favour): per query it reads every node and
vector, scans them all, and ranks clips by their best node. m3mem opens the store
once and answers each query from the FAISS index (``m3mem.retrieval.search``).

Stores are synthetic: 10 memory nodes per 30 s clip, each with a random 384-d unit
vector (the size of MiniLM's embeddings). Queries are vectors near random nodes, so
both methods must rank that node's clip first; the table says how often they agree.
Embedding the query text costs the same on both sides and is left out: the query
vectors are handed to search through a stand-in embedder.

    python bench/search_latency.py [--size ci|full]    # full: 10k, 100k, 1M nodes
"""
from __future__ import annotations

import hashlib
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import bench_main, bulk_add_nodes, percentiles_ms, random_unit  # noqa: E402

DIM = 384
NODES_PER_CLIP = 10
CLIPS_PER_VIDEO = 1000
TOP_K = 5
CHUNK = 100_000
SIZES = {
    # nodes -> (m3mem queries, baseline queries)
    "ci": {10_000: (50, 5)},
    "full": {10_000: (500, 20), 100_000: (500, 10), 1_000_000: (300, 3)},
}


class QueryVectors:
    """A text embedder that returns the benchmark's query vectors in turn."""

    name = "bench-query-vectors"
    dim = DIM

    def __init__(self, vectors: np.ndarray):
        self.vectors = vectors
        self.i = 0

    def embed(self, texts):
        out = self.vectors[self.i:self.i + len(texts)]
        self.i += len(texts)
        return out


def build_store(root: Path, n_nodes: int, seed: int = 0):
    """A store of ``n_nodes`` episodic nodes on ``n_nodes / 10`` clips; returns (store, node vectors sample)."""
    from m3mem.records import Clip, VideoInfo
    from m3mem.store import Store

    rng = np.random.default_rng(seed)
    store = Store.open(root)
    n_clips = -(-n_nodes // NODES_PER_CLIP)
    clip_ids: list[int] = []
    for v in range(-(-n_clips // CLIPS_PER_VIDEO)):
        k = min(CLIPS_PER_VIDEO, n_clips - v * CLIPS_PER_VIDEO)
        info = VideoInfo(f"/bench/video_{v}.mp4", k * 30.0, True, True, 25.0, 1280, 720)
        clips = [Clip(str(v), i, i * 30.0, (i + 1) * 30.0) for i in range(k)]
        _, rows = store.add_video(hashlib.sha256(f"bench video {v}".encode()).hexdigest(), info, clips)
        clip_ids.extend(r.id for r in rows)
    keep = rng.choice(n_nodes, size=min(n_nodes, 2000), replace=False)
    kept: dict[int, np.ndarray] = {}
    for start in range(0, n_nodes, CHUNK):
        n = min(CHUNK, n_nodes - start)
        vecs = random_unit(rng, n, DIM)
        cids = [clip_ids[(start + i) // NODES_PER_CLIP] for i in range(n)]
        texts = [f"memory line {start + i + 1} of the benchmark" for i in range(n)]
        bulk_add_nodes(store, "episodic", cids, texts, "text", vecs, start=start + 1)
        for j in keep[(keep >= start) & (keep < start + n)]:
            kept[int(j)] = vecs[j - start]
    return store, kept, clip_ids


def queries_near(kept: dict[int, np.ndarray], clip_ids: list[int], n: int, seed: int = 1):
    """Query vectors close to random nodes, and the clip each should find first."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(sorted(kept), size=n)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * (0.5 / np.sqrt(DIM))
    q = np.stack([kept[int(p)] for p in picks]) + noise
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32), [clip_ids[int(p) // NODES_PER_CLIP] for p in picks]


def reload_and_scan(db_path: Path, query: np.ndarray, top_k: int = TOP_K) -> list[tuple[int, float]]:
    """M3-Agent's way: load every node, compare the query with each, best clips first."""
    conn = sqlite3.connect(str(db_path))
    try:
        clip_of = dict(conn.execute("SELECT id, clip_id FROM nodes WHERE kind IN ('episodic', 'semantic')"))
        vectors = {nid: np.frombuffer(blob, dtype="<f4")
                   for nid, blob in conn.execute("SELECT node_id, vector FROM embeddings WHERE space='text'")}
    finally:
        conn.close()
    best: dict[int, float] = {}
    for nid, vec in vectors.items():
        score = float(np.dot(vec, query))
        cid = clip_of.get(nid)
        if cid is not None and score > best.get(cid, -2.0):
            best[cid] = score
    return sorted(best.items(), key=lambda kv: -kv[1])[:top_k]


def measure(n_nodes: int, n_m3mem: int, n_baseline: int, workdir: Path) -> dict:
    from m3mem.retrieval import search
    from m3mem.store import Store

    root = workdir / f"store_{n_nodes}"
    t0 = time.perf_counter()
    store, kept, clip_ids = build_store(root, n_nodes)
    store.close()
    build_s = time.perf_counter() - t0
    queries, expected = queries_near(kept, clip_ids, n_m3mem + n_baseline)

    # m3mem: open once (the FAISS index is built from SQLite on first use), then query
    t0 = time.perf_counter()
    store = Store.open(root, create=False, read_only=True)
    store.index("text", DIM)
    open_s = time.perf_counter() - t0
    embedder = QueryVectors(queries)
    times, m3_top = [], []
    for _ in range(n_m3mem):
        t = time.perf_counter()
        hits = search(store, embedder, "a query", top_k=TOP_K)
        times.append(time.perf_counter() - t)
        m3_top.append(hits[0].clip_id if hits else None)
    store.close()
    base_times, agree = [], 0
    for j in range(n_baseline):
        q = queries[n_m3mem + j]
        t = time.perf_counter()
        ranked = reload_and_scan(root / "memory.db", q)
        base_times.append(time.perf_counter() - t)
        agree += int(ranked[0][0] == expected[n_m3mem + j])
    m3_right = sum(int(a == b) for a, b in zip(m3_top, expected[:n_m3mem]))
    p50, p99 = percentiles_ms(times)
    b50, b99 = percentiles_ms(base_times)
    return {
        "nodes": n_nodes, "clips": len(clip_ids), "build_s": build_s, "open_s": open_s,
        "m3mem_queries": n_m3mem, "m3mem_p50_ms": p50, "m3mem_p99_ms": p99,
        "baseline_queries": n_baseline, "baseline_p50_ms": b50, "baseline_p99_ms": b99,
        "speedup_p50": b50 / p50, "speedup_p99": b99 / p99,
        "m3mem_right": f"{m3_right}/{n_m3mem}", "baseline_right": f"{agree}/{n_baseline}",
        "db_mb": (root / "memory.db").stat().st_size / 2**20,
    }


def run(size: str = "ci") -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="m3mem-bench-search-") as tmp:
        for n_nodes, (n_m3mem, n_base) in SIZES[size].items():
            rows.append(measure(n_nodes, n_m3mem, n_base, Path(tmp)))
    return {
        "name": "search_latency",
        "title": "Search latency, top 5 clips, 384-d text vectors",
        "columns": [("nodes", "nodes"), ("clips", "clips"), ("m3mem_p50_ms", "m3mem p50 ms"),
                    ("m3mem_p99_ms", "m3mem p99 ms"), ("baseline_p50_ms", "reload+scan p50 ms"),
                    ("baseline_p99_ms", "reload+scan p99 ms"), ("speedup_p50", "x p50"), ("speedup_p99", "x p99"),
                    ("open_s", "m3mem open s"), ("m3mem_right", "m3mem right"), ("baseline_right", "scan right")],
        "rows": rows,
        "notes": ["queries per size: " + ", ".join(f"{r['nodes']:,}: {r['m3mem_queries']} m3mem, "
                                                     f"{r['baseline_queries']} baseline" for r in rows),
                  "'right': the clip of the node the query was drawn near came first",
                  "m3mem open s: Store.open and the FAISS index built from SQLite, once per process"],
    }


if __name__ == "__main__":
    bench_main(run, __doc__)
