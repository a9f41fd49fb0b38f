"""Run every benchmark, print its table, and save the results with the machine they ran on.

    python bench/run_all.py                  # CI sizes: about a minute
    python bench/run_all.py --size full      # by hand: the sizes docs/benchmarks.md reports
    python bench/run_all.py --json out.json  # also write the rows

Each benchmark compares m3mem with a baseline built the way M3-Agent does the same
work, in one run on one machine, and reports the ratio. The helpers every benchmark
uses (tables, percentiles, the machine, bulk store writes) live here too.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a source checkout without installing

BENCHMARKS = ("frame_sampling", "search_latency", "identity_matching")
INGEST_BENCH = "ingest_bench"  # ingest real-time factor and peak memory, when present


# --- helpers ------------------------------------------------------------------------


def machine() -> dict:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    gpu = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        gpu = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    import faiss

    return {
        "cpu": cpu, "cpu_count": os.cpu_count(), "memory_gb": mem_gb, "gpu": gpu,
        "python": platform.python_version(), "numpy": np.__version__, "faiss": faiss.__version__,
        "os": f"{platform.system()} {platform.release()}",
        # faiss parallelises one query over OpenMP threads, which a busy machine makes slow:
        # the thread count and the load at the start belong with every latency
        "faiss_threads": faiss.omp_get_max_threads(), "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def percentiles_ms(seconds: Sequence[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds (with few samples, p99 is close to the slowest)."""
    a = np.asarray(seconds, dtype=np.float64) * 1000.0
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def format_table(columns: Sequence[tuple[str, str]], rows: Sequence[dict]) -> str:
    """``columns``: (key, header); floats get 3 significant decimals, None prints as '-'."""

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    grid = [[h for _, h in columns]] + [[cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    out = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in grid]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def print_result(result: dict) -> None:
    print(f"\n## {result['title']}  [{result['name']}]\n")
    print(format_table(result["columns"], result["rows"]))
    for note in result.get("notes", []):
        print(f"  note: {note}")


def random_unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def bulk_add_nodes(store, kind: str, clip_ids: Sequence[int | None], texts: Sequence[str | None],
                   space: str, vectors: np.ndarray, per_node: int = 1, start: int = 1) -> list[str]:
    """Add ``len(clip_ids)`` nodes ``<kind>_<n>`` with ``per_node`` embeddings each, in one transaction.

    Rows go in through the store's own connection and transaction, in bulk: adding a
    million nodes one ``add_node`` at a time would spend the benchmark's time on
    inserts. Vectors reach the FAISS index when the store loads it (``store.index``).
    """
    ids = [f"{kind}_{start + i}" for i in range(len(clip_ids))]
    blobs = np.ascontiguousarray(vectors, dtype="<f4")
    with store.transaction() as c:
        seq0 = c.execute("SELECT COALESCE(MAX(seq), 0) FROM nodes").fetchone()[0]
        c.executemany(
            "INSERT INTO nodes (id, kind, text, clip_id, weight, seq) VALUES (?,?,?,?,1.0,?)",
            [(nid, kind, t, cid, seq0 + i + 1) for i, (nid, t, cid) in enumerate(zip(ids, texts, clip_ids))],
        )
        c.executemany(
            "INSERT INTO embeddings (node_id, space, vector, quality, clip_id) VALUES (?,?,?,?,?)",
            [(ids[j // per_node], space, blobs[j].tobytes(), 1.0, clip_ids[j // per_node]) for j in range(len(blobs))],
        )
        c.execute("INSERT OR REPLACE INTO counters VALUES (?, ?)", (kind, start + len(ids)))
    return ids


def load_benchmark(name: str):
    path = BENCH / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_main(module_run, description: str) -> None:
    """The command line of one benchmark: ``--size ci|full``, ``--json FILE``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--size", choices=["ci", "full"], default="ci")
    ap.add_argument("--json", help="write the result to this file")
    args = ap.parse_args()
    result = module_run(args.size)
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "benchmarks": [result]}, indent=2))


# --- runner -------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["ci", "full"], default="ci", help="ci: small and quick; full: by hand")
    ap.add_argument("--only", action="append", choices=[*BENCHMARKS, INGEST_BENCH], help="run only these")
    ap.add_argument("--json", help="write every result, with the machine, to this file")
    args = ap.parse_args()
    info = machine()
    print(f"# m3mem benchmarks, size {args.size}")
    print(f"machine: {info['cpu']}, {info['cpu_count']} CPUs, {info['memory_gb']} GB"
          + (f", {info['gpu']}" if info["gpu"] else ", no GPU") + f"; Python {info['python']}, faiss {info['faiss']} "
          f"({info['faiss_threads']} threads); load average {info['load_avg_1min']}")
    results, failed = [], []
    names = args.only or [*BENCHMARKS, *([INGEST_BENCH] if (BENCH / f"{INGEST_BENCH}.py").exists() else [])]
    for name in names:
        module = load_benchmark(name)
        if module is None or not callable(getattr(module, "run", None)):
            print(f"\n## {name}: skipped (bench/{name}.py " + ("is missing)" if module is None else "has no run(size))"))
            continue
        t0 = time.perf_counter()
        try:
            result = module.run(args.size)
        except Exception as e:  # noqa: BLE001 - one failed benchmark must not hide the others' tables
            print(f"\n## {name}: FAILED ({type(e).__name__}: {e})")
            failed.append(name)
            continue
        if not (isinstance(result, dict) and {"name", "title", "columns", "rows"} <= set(result)):
            print(f"\n## {name}\n{result}")
            continue
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        print_result(result)
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, "machine": info, "benchmarks": results}, indent=2))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
