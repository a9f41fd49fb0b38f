"""FAISS vector indexes persisted beside the SQLite store.

SQLite holds every vector (the source of truth); an index file is a cache that
speeds up opening. On open the file is loaded only if it agrees with the
database (same dimension, same count up to its recorded high-water id), then
vectors added since are appended. Anything else rebuilds it from SQLite, so a
crash between a database commit and an index save never loses a vector, and a
tampered index file cannot change what the store contains.

Inner product on L2-normalised vectors is cosine similarity. The GPU is used
for search when faiss was built with GPU support and a GPU is present.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

log = logging.getLogger(__name__)


def _faiss():
    import faiss

    return faiss


def gpu_count() -> int:
    faiss = _faiss()
    try:
        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except RuntimeError:
        return 0


class VectorIndex:
    """An id-mapped flat inner-product index over one embedding space."""

    def __init__(self, dim: int, use_gpu: bool | None = None):
        faiss = _faiss()
        self.dim = dim
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self.max_id = 0
        self._use_gpu = gpu_count() > 0 if use_gpu is None else use_gpu
        self._gpu_index = None  # a GPU copy made on first search, dropped on change

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        ids = np.asarray(ids, dtype=np.int64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), self.dim)
        self._index.add_with_ids(vectors, ids)
        self.max_id = max(self.max_id, int(ids.max()))
        self._gpu_index = None

    def remove(self, ids: Iterable[int]) -> None:
        faiss = _faiss()
        ids = np.asarray(list(ids), dtype=np.int64)
        if len(ids):
            self._index.remove_ids(faiss.IDSelectorBatch(ids))
            self._gpu_index = None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and ids, (n, k) each; missing neighbours have id -1."""
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        k = max(1, min(k, len(self)))
        if len(self) == 0:
            n = len(queries)
            return np.zeros((n, 0), np.float32), np.zeros((n, 0), np.int64)
        index = self._searcher()
        if len(queries) > 8:
            return index.search(queries, k)
        # faiss parallelises one query across OpenMP threads; for a handful of queries the
        # thread start-up costs more than the scan (measured 13-40x slower on a busy 2-core
        # machine at 10k-1M vectors), so search them on one thread
        faiss = _faiss()
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            return index.search(queries, k)
        finally:
            faiss.omp_set_num_threads(threads)

    def _searcher(self):
        if not self._use_gpu or len(self) < 10_000:
            return self._index
        if self._gpu_index is None:
            faiss = _faiss()
            try:
                res = faiss.StandardGpuResources()
                self._gpu_index = faiss.index_cpu_to_gpu(res, 0, self._index)
            except (AttributeError, RuntimeError) as e:
                log.warning("faiss GPU search unavailable (%s); searching on the CPU", e)
                self._use_gpu = False
                return self._index
        return self._gpu_index

    # persistence ----------------------------------------------------------

    def save(self, path: Path) -> None:
        faiss = _faiss()
        tmp = path.with_suffix(path.suffix + ".tmp")
        faiss.write_index(self._index, str(tmp))
        os.replace(tmp, path)
        meta = {"dim": self.dim, "ntotal": len(self), "max_id": self.max_id}
        mtmp = path.with_suffix(".json.tmp")
        mtmp.write_text(json.dumps(meta))
        os.replace(mtmp, path.with_suffix(".json"))

    @classmethod
    def open(
        cls,
        path: Path,
        dim: int,
        count_upto: Callable[[int], int],
        rows_after: Callable[[int], Iterable[tuple[int, np.ndarray]]],
    ) -> "VectorIndex":
        """Load ``path`` if it agrees with the database, then catch up from it.

        ``count_upto(max_id)`` counts the database's vectors with id <= max_id;
        ``rows_after(max_id)`` yields (id, vector) of the rest, in id order.
        """
        index = cls(dim)
        meta_path = path.with_suffix(".json")
        loaded = False
        if path.exists() and meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                if int(meta["dim"]) == dim and count_upto(int(meta["max_id"])) == int(meta["ntotal"]):
                    faiss = _faiss()
                    idx = faiss.read_index(str(path))
                    if idx.d == dim and idx.ntotal == int(meta["ntotal"]):
                        index._index = idx
                        index.max_id = int(meta["max_id"])
                        loaded = True
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                log.warning("index %s could not be used (%s); rebuilding it from the store", path, e)
        if not loaded:
            index = cls(dim)
        batch_ids: list[int] = []
        batch_vecs: list[np.ndarray] = []
        for vid, vec in rows_after(index.max_id):
            batch_ids.append(vid)
            batch_vecs.append(vec)
            if len(batch_ids) >= 65536:
                index.add(np.array(batch_ids), np.stack(batch_vecs))
                batch_ids, batch_vecs = [], []
        if batch_ids:
            index.add(np.array(batch_ids), np.stack(batch_vecs))
        return index
