"""A real two-node Ray cluster on this machine ingests real media into the same store as one process.

The head and the second node are separate raylet processes on this machine
(``ray.cluster_utils.Cluster``); ``m3mem ingest --ray ADDRESS`` joins them from a
separate driver process, as a user's command would.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ingest_support import (BATCH_CLIPS, CLIP_ARGS, ENV, GRID, REPO, batch, canonical_dump, first_difference, ingest, integrity,
                            m3mem_cmd, reference_store, skip_without_media)

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'm3mem[cluster]')")
skip_without_media(pytest)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # the cluster's processes take the environment of this process
    # Ray 2.59+ authenticates local clusters with a token kept in a file shared by every
    # Ray instance of this user, which an earlier local instance (another test) may have
    # rewritten under a running cluster. This cluster listens on loopback only and lives
    # for this module, so it runs without token authentication (docs/cluster.md says how
    # a real cluster shares its token).
    token = {"RAY_AUTH_MODE": "disabled"}
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "RAY_DEDUP_LOGS", *token)}
    saved_env = {k: ENV.get(k) for k in token}
    os.environ.update({"OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0", **token})
    ENV.update(token)
    # a short session folder: Ray's unix socket paths must stay under 107 bytes
    temp_dir = tempfile.mkdtemp(prefix="m3r", dir="/tmp")
    c = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "temp_dir": temp_dir,
    })
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for env, values in ((os.environ, saved), (ENV, saved_env)):
            for k, v in values.items():
                if v is None:
                    env.pop(k, None)
                else:
                    env[k] = v


def test_a_two_node_cluster_ingests_an_archive_into_the_same_store_as_one_process(cluster, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    paths = batch(base / "media")
    reference = reference_store(base, paths)
    store = tmp_path_factory.mktemp("cluster-store")

    rc, report, err = ingest(paths, store, "--ray", cluster.address, "--workers", "2")
    assert rc == 0, err[-3000:]
    assert report["clips_done"] == BATCH_CLIPS and report["clips_failed"] == 0
    assert report["cluster"]["workers"] == 2
    # both nodes perceived clips: the work really was spread over the cluster
    per_node = report["cluster"]["clips_per_node"]
    assert len(per_node) == 2 and sum(per_node.values()) == BATCH_CLIPS, per_node

    assert integrity(store) == "ok"
    ours, theirs = canonical_dump(store), canonical_dump(reference)
    assert ours == theirs, first_difference(ours, theirs)
    assert len(ours["nodes"]) > 20 and ours["embeddings"]["face"] and ours["embeddings"]["voice"]


def test_the_cluster_store_answers_search_from_the_command_line(cluster, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    paths = batch(base / "media")
    store = tmp_path_factory.mktemp("cluster-search")
    rc, _, err = ingest(paths[1:2], store, "--ray", cluster.address)
    assert rc == 0, err[-3000:]
    out = subprocess.run(m3mem_cmd("search", "someone says a word", "--store", str(store), "--json", *CLIP_ARGS),
                         capture_output=True, text=True, env=ENV, cwd=REPO, check=True)
    hits = json.loads(out.stdout)["results"]
    assert hits and hits[0]["video"] == Path(paths[1]).name


def test_an_address_where_no_cluster_listens_is_a_clear_error_and_nothing_is_stored(tmp_path):
    store = tmp_path / "s"
    rc, _, err = ingest([GRID / "bbaf2n.mpg"], store, "--ray", "127.0.0.1:9")
    assert rc == 2, err[-3000:]
    assert "no Ray cluster answers at 127.0.0.1:9" in err and "ray start --head" in err
    assert canonical_dump(store)["videos"] == []


@pytest.mark.gpu
def test_workers_share_the_gpu_when_there_is_one(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpus = torch.cuda.device_count()
    rc, report, err = ingest([GRID / "bbaf2n.mpg", GRID / "brbk7n.mpg"], tmp_path / "s", "--workers", "2")
    assert rc == 0, err[-3000:]
    assert report["cluster"]["workers"] == 2
    assert report["cluster"]["gpus_per_worker"] == pytest.approx(min(1.0, gpus / 2))
    assert report["clips_done"] == 2
