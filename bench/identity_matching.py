"""Identity matching: time to match one face to the store's face nodes, at 1k to 100k nodes.

M3-Agent matches a new face by scanning every face node of its in-memory graph and
averaging the cosine similarity with the node's embeddings. m3mem matches through
the FAISS index of the nodes' exemplar embeddings (``m3mem.identity.IdentityMatcher``).
The baseline is given its graph already in memory, as M3-Agent has it during
memorization; only the per-face work is timed on both sides.

Stores are synthetic: N people, each a face node with 3 exemplars (views of one
random 512-d identity, cosine about 0.8 to it, the size of insightface embeddings).
Half the query faces are new views of stored people, half are strangers; the table
says how often each method names the right node (or no node, for a stranger).

    python bench/identity_matching.py [--size ci|full]   # full: 1k, 10k, 100k face nodes
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import bench_main, bulk_add_nodes, percentiles_ms, random_unit  # noqa: E402

DIM = 512
EXEMPLARS = 3
VIEW_NOISE = 0.75  # |noise| added to an identity before normalising: cosine about 0.8 to it
THRESHOLD = 0.4  # views of one person score about 0.64, strangers under 0.25 even at 100k nodes
CHUNK = 20_000
SIZES = {
    # face nodes -> (m3mem faces, baseline faces)
    "ci": {1_000: (100, 20)},
    "full": {1_000: (400, 100), 10_000: (400, 40), 100_000: (400, 10)},
}


def views(rng: np.random.Generator, identities: np.ndarray) -> np.ndarray:
    noise = rng.standard_normal(identities.shape).astype(np.float32) * (VIEW_NOISE / np.sqrt(DIM))
    v = identities + noise
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def build_store(root: Path, n_nodes: int, seed: int = 0):
    """N face nodes with EXEMPLARS views each; returns the store, the identities and the graph
    the baseline scans (node id -> exemplar matrix)."""
    from m3mem.store import Store

    rng = np.random.default_rng(seed)
    store = Store.open(root)
    identities = random_unit(rng, n_nodes, DIM)
    graph: dict[str, np.ndarray] = {}
    for start in range(0, n_nodes, CHUNK):
        ids_chunk = identities[start:start + CHUNK]
        ex = views(rng, np.repeat(ids_chunk, EXEMPLARS, axis=0))
        n = len(ids_chunk)
        nodes = bulk_add_nodes(store, "face", [None] * n, [None] * n, "face", ex, per_node=EXEMPLARS, start=start + 1)
        for i, nid in enumerate(nodes):
            graph[nid] = ex[i * EXEMPLARS:(i + 1) * EXEMPLARS]
    return store, identities, graph


def scan_all_nodes(graph: dict[str, np.ndarray], face: np.ndarray, threshold: float = THRESHOLD):
    """M3-Agent's way: every node's mean similarity to the face, the best above the threshold."""
    best, best_score = None, -2.0
    for nid, exemplars in graph.items():
        score = float(np.mean(exemplars @ face))
        if score > best_score:
            best, best_score = nid, score
    return (best, best_score) if best_score >= threshold else (None, best_score)


def measure(n_nodes: int, n_m3mem: int, n_baseline: int, workdir: Path) -> dict:
    from m3mem.identity import Candidate, IdentityMatcher
    from m3mem.store import Store

    root = workdir / f"faces_{n_nodes}"
    t0 = time.perf_counter()
    store, identities, graph = build_store(root, n_nodes)
    store.close()
    build_s = time.perf_counter() - t0

    rng = np.random.default_rng(1)
    n = n_m3mem + n_baseline
    known = rng.choice(n_nodes, size=n)
    is_known = rng.random(n) < 0.5
    faces = np.where(is_known[:, None], views(rng, identities[known]), random_unit(rng, n, DIM))
    expected = [f"face_{k + 1}" if kn else None for k, kn in zip(known, is_known)]

    t0 = time.perf_counter()
    store = Store.open(root, create=False, read_only=True)
    store.index("face", DIM)
    open_s = time.perf_counter() - t0
    matcher = IdentityMatcher(store, "face", DIM, THRESHOLD)
    times, right = [], 0
    for j in range(n_m3mem):
        t = time.perf_counter()
        (node, _), = matcher.match([Candidate(faces[j], 1.0)])
        times.append(time.perf_counter() - t)
        right += int(node == expected[j])
    store.close()
    base_times, base_right = [], 0
    for j in range(n_m3mem, n):
        t = time.perf_counter()
        node, _ = scan_all_nodes(graph, faces[j])
        base_times.append(time.perf_counter() - t)
        base_right += int(node == expected[j])
    p50, p99 = percentiles_ms(times)
    b50, b99 = percentiles_ms(base_times)
    return {
        "face_nodes": n_nodes, "embeddings": n_nodes * EXEMPLARS, "build_s": build_s, "open_s": open_s,
        "m3mem_faces": n_m3mem, "m3mem_p50_ms": p50, "m3mem_p99_ms": p99,
        "baseline_faces": n_baseline, "baseline_p50_ms": b50, "baseline_p99_ms": b99,
        "speedup_p50": b50 / p50, "m3mem_right": f"{right}/{n_m3mem}", "baseline_right": f"{base_right}/{n_baseline}",
    }


def run(size: str = "ci") -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="m3mem-bench-faces-") as tmp:
        for n_nodes, (n_m3mem, n_base) in SIZES[size].items():
            rows.append(measure(n_nodes, n_m3mem, n_base, Path(tmp)))
    return {
        "name": "identity_matching",
        "title": f"Identity matching time per face, {DIM}-d, {EXEMPLARS} exemplars per face node",
        "columns": [("face_nodes", "face nodes"), ("embeddings", "embeddings"), ("m3mem_p50_ms", "m3mem p50 ms"),
                    ("m3mem_p99_ms", "m3mem p99 ms"), ("baseline_p50_ms", "scan p50 ms"),
                    ("baseline_p99_ms", "scan p99 ms"), ("speedup_p50", "x p50"), ("open_s", "m3mem open s"),
                    ("m3mem_right", "m3mem right"), ("baseline_right", "scan right")],
        "rows": rows,
        "notes": ["'right': a stored person's new view matched their node, a stranger matched none",
                  "m3mem open s: Store.open and the FAISS index built from SQLite, once per process"],
    }


if __name__ == "__main__":
    bench_main(run, __doc__)
