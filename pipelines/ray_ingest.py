"""Ingest on Ray: clips fan out to worker actors that hold the models; one writer owns the store.

Each worker actor (``ClipWorker``) decodes its clips from the source file
(splitting is logical: frames by seeking, audio decoded once per file per
worker), perceives them and memorizes them, holding its models for its whole
life (a GPU fraction when the cluster has GPUs, one CPU otherwise). The driver
is the store's only writer: it applies every clip's perception, identity and
memory through the same ``Ingestor`` methods as the single-process path, in
file and clip order, so ids and graph writes are the same as a one-process run
on the same input.

Order and queues. Perception is pure, so it runs ahead across clips and files,
bounded by ``QUEUE_PER_WORKER`` clips per worker in flight. Identity is applied
in clip order; within a file it may run ahead of memory commits, since identity
reads only face and voice nodes and memory writes only text nodes and
equivalences. It never crosses into the next file before the previous file is
finished (its characters rebuilt), because characters are rebuilt from every
face and voice in the store.

Faults. A worker that dies is restarted by Ray and its queued clips are retried
(``max_restarts``, ``max_task_retries``); a clip that kills its worker
``TASK_RETRIES + 1`` times is recorded as failed and the batch goes on. The
driver commits each stage of each clip in its own transaction, so killing the
driver loses at most the clips in flight; the same command resumes.

Every node must see the input files at the same path (a shared filesystem);
the store stays on the driver's machine.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from m3mem.config import Config
from m3mem.errors import ConfigError, InputError, M3memError, ModelError, StoreError
from m3mem.records import Clip, ClipMemory, ClipPerception, VideoInfo
from pipelines.archive import display, printable

log = logging.getLogger(__name__)

QUEUE_PER_WORKER = 2  # clips in flight per worker and stage: enough to hide the writer's turn, little memory
TASK_RETRIES = 2  # retries of a clip whose worker died while working on it
_FATAL = {"ConfigError": ConfigError, "StoreError": StoreError}


# the worker actor ---------------------------------------------------------------


class ClipWorker:
    """Holds the perception and memorization models of one process; decodes and perceives clips.

    Replies are plain dicts (JSON-safe records) and errors are replies too, so a bad
    clip never looks like a dead worker and nothing but data crosses the wire.
    """

    def __init__(self, config: dict):
        from pipelines.perceive import Models

        self.config = Config(**config)
        self.models = Models(self.config)
        self._path: str | None = None
        self._source = None
        self._frames = None
        self._audio = None

    def info(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid()}

    def identity_params(self) -> dict:
        """Loads the face and voice models (so a missing model fails early) and reports their sizes."""
        m = self.models
        return {
            "face_dim": int(m.face.dim), "face_threshold": float(m.face_threshold()),
            "voice_dim": int(m.voice.dim), "voice_threshold": float(m.voice_threshold()),
        }

    def perceive(self, path: str, info: dict, clip: dict) -> dict:
        from pipelines.perceive import perceive_clip

        try:
            frames, audio = self._decoders(path, VideoInfo(**info))
        except (InputError, ModelError) as e:
            return {"error": str(e), "scope": "file"}
        except OSError as e:
            return {"error": f"{info['path']}: {e.strerror or e}", "scope": "file"}
        try:
            perception = perceive_clip(self.models, Clip.from_dict(clip), frames, audio)
        except (InputError, ModelError) as e:
            return {"error": str(e), "scope": "clip"}
        except M3memError as e:
            return {"error": str(e), "scope": "fatal", "kind": type(e).__name__}
        return {"perception": perception.to_dict(), "node_id": self._node_id()}

    def memorize(self, perception: dict, identity: dict) -> dict:
        from pipelines.ingest import memorize_clip

        try:
            memory = memorize_clip(self.config, ClipPerception.from_dict(perception), identity)
        except (InputError, ModelError) as e:
            return {"error": str(e), "scope": "clip"}
        except M3memError as e:
            return {"error": str(e), "scope": "fatal", "kind": type(e).__name__}
        return {"episodic": list(memory.episodic), "semantic": list(memory.semantic)}

    def _decoders(self, path: str, info: VideoInfo):
        """The current file's decoders; clips arrive in file order, so one file is open at a time."""
        from pipelines.archive import DecodablePath
        from pipelines.split import AudioTrack, FrameReader

        if path != self._path:
            self._close()
            if not os.path.exists(path):
                raise InputError(
                    f"{info.path} is not readable on node {socket.gethostname()} (missing or removed); on a cluster "
                    "every node must see the input files at the same path"
                )
            source, frames = DecodablePath(path), None
            try:
                frames = FrameReader(source.path) if info.has_video else None
                audio = AudioTrack.open(source.path, info) if info.has_audio else None
            except BaseException:
                if frames is not None:
                    frames.close()
                source.close()
                raise
            self._path, self._source, self._frames, self._audio = path, source, frames, audio
        return self._frames, self._audio

    def _close(self) -> None:
        if self._frames is not None:
            self._frames.close()
        if self._audio is not None:
            self._audio.close()
        if self._source is not None:
            self._source.close()
        self._path = self._source = self._frames = self._audio = None

    @staticmethod
    def _node_id() -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


# the driver ---------------------------------------------------------------------


@dataclass
class _Task:
    """One clip on its way through the pipeline."""

    job: object  # FileJob
    row: object  # ClipRow
    perception: object = None  # a ClipPerception (cached) or a Ray ref to a perceive reply
    worker: int = -1  # the worker perceiving it
    memory_ref: object = None
    memory_worker: int = -1  # the worker memorizing it


@dataclass
class _Open:
    """A file in flight: its job and how many of its clips are not yet written."""

    job: object
    remaining: int
    done: int = 0


@dataclass
class _Wait:
    """The feeder found a copy of a file that is still in flight; it goes on once that file is finished."""

    video_id: int


@dataclass
class RunStats:
    workers: int = 0
    gpus_per_worker: float = 0.0
    startup_s: float = 0.0  # joining or starting Ray and loading the workers' models
    clips_per_node: Counter = field(default_factory=Counter)  # clips perceived on each Ray node


class RayIngest:
    """Drives one ingestion through Ray for an ``Ingestor`` (whose store it writes)."""

    def __init__(self, ingestor):
        self.ing = ingestor
        self.config: Config = ingestor.config
        self.stats = RunStats()
        self._workers: list = []
        self._load: dict[str, list[int]] = {}
        self._started_ray = False
        self._in_flight: dict[int, _Open] = {}  # files opened and not yet finished, by video id
        self._files_over = 0  # files of this run that need nothing more (finished, skipped or failed)
        self._files_total = 0

    # lifecycle ---------------------------------------------------------------

    def ingest(self, paths: Iterable[str | Path], retry_failed: bool = False):
        from pipelines.archive import expand_inputs
        from pipelines.ingest import IngestReport

        t0 = time.perf_counter()
        items, problems = expand_inputs(paths)
        report = IngestReport(files=[self.ing.problem(p) for p in problems])
        if items:
            try:
                self._start()
                self._run(items, report, retry_failed)
            finally:
                self._stop()
            report.cluster = {"workers": self.stats.workers, "gpus_per_worker": self.stats.gpus_per_worker,
                              "startup_s": round(self.stats.startup_s, 2),
                              "clips_per_node": dict(self.stats.clips_per_node)}
        report.wall_s = time.perf_counter() - t0
        return report

    def _start(self) -> None:
        t0 = time.perf_counter()
        ray = _ray()
        cfg = self.config
        if not ray.is_initialized():
            os.environ.setdefault("RAY_DEDUP_LOGS", "0")
            if cfg.ray_address:
                log.info("joining the Ray cluster at %s", cfg.ray_address)
                _check_reachable(cfg.ray_address)
                try:
                    ray.init(address=cfg.ray_address, runtime_env=_runtime_env(), logging_level=logging.WARNING,
                             log_to_driver=True)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise ConfigError(
                        f"cannot join the Ray cluster at {cfg.ray_address!r} ({e}); start one with 'ray start --head' "
                        "and pass its address (or 'auto' on a cluster node)"
                    ) from e
            else:
                workers = max(1, cfg.workers)
                log.info("starting a local Ray instance for %d workers", workers)
                # "local": a new instance even where RAY_ADDRESS names a cluster (--ray is how to join one)
                ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING,
                         object_store_memory=max(100, 64 * workers) * 1024 * 1024)
            self._started_ray = True
        resources = ray.cluster_resources()
        gpus = float(resources.get("GPU", 0)) if cfg.device != "cpu" else 0.0
        n = cfg.workers
        if n <= 1:
            # a cluster with no worker count given: one worker per GPU, or per CPU without GPUs
            n = int(gpus) if gpus >= 1 else int(resources.get("CPU", 1))
        n = max(1, n)
        gpu_share = min(1.0, gpus / n) if gpus else 0.0
        # perception runs in the default group and memorization in its own, one at a time each: a
        # clip's memorization never waits behind the perception queued on the same worker
        remote = ray.remote(concurrency_groups={"memorize": 1})(ClipWorker).options(
            num_cpus=1, num_gpus=gpu_share, max_restarts=-1, max_task_retries=TASK_RETRIES,
            scheduling_strategy="SPREAD",
        )
        config = self.config.to_dict()
        self._workers = [remote.remote(config) for _ in range(n)]
        self._load = {"perceive": [0] * n, "memorize": [0] * n}
        self.stats.workers, self.stats.gpus_per_worker = n, gpu_share
        log.info("%d workers (%s each)", n, f"{gpu_share:.2f} GPU" if gpu_share else "1 CPU")
        # loading the models everywhere first turns a missing model into one clear error
        try:
            params = ray.get([w.identity_params.remote() for w in self._workers])
        except ray.exceptions.RayTaskError as e:
            if isinstance(getattr(e, "cause", None), M3memError):
                raise e.cause from None
            raise
        self.ing._identity_params = params[0]
        self.stats.startup_s = time.perf_counter() - t0

    def _stop(self) -> None:
        ray = _ray()
        for w in self._workers:
            ray.kill(w, no_restart=True)
        self._workers = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (for tests that kill one)."""
        ray = _ray()
        return [info["pid"] for info in ray.get([w.info.remote() for w in self._workers])]

    # the pipeline ------------------------------------------------------------

    def _run(self, items, report, retry_failed: bool) -> None:
        ray = _ray()
        window = QUEUE_PER_WORKER * len(self._workers)
        feeder = self._feed(items, report, retry_failed)
        perceiving: deque[_Task] = deque()
        memorizing: deque[_Task] = deque()
        files: deque[_Open] = deque()
        in_flight = self._in_flight
        waiting_for: int | None = None
        exhausted = False
        self._files_total = len(items)

        while True:
            # feed: open files and submit perception, up to the window
            while not exhausted and len(perceiving) < window:
                if waiting_for is not None:
                    if waiting_for in in_flight:
                        break
                    waiting_for = None
                try:
                    item = next(feeder)
                except StopIteration:
                    exhausted = True
                    break
                if isinstance(item, _Wait):
                    waiting_for = item.video_id
                elif isinstance(item, _Open):
                    files.append(item)
                    in_flight[item.job.video_id] = item
                else:
                    self._submit_perception(item)
                    perceiving.append(item)

            # finish the oldest files once all their clips are written
            while files and files[0].remaining == 0:
                f = files.popleft()
                self.ing.finish_file(f.job)
                del in_flight[f.job.video_id]
                self._file_over()

            moved = False
            # write memories in clip order
            while memorizing and _ready(memorizing[0].memory_ref):
                self._write_memory(memorizing.popleft(), files[0])
                moved = True
            # identify in clip order, never ahead into a file before the previous one is finished
            while (perceiving and files and perceiving[0].job is files[0].job and len(memorizing) < window
                   and (not isinstance(perceiving[0].perception, ray.ObjectRef) or _ready(perceiving[0].perception))):
                task = perceiving.popleft()
                if self._identify(task, files[0]):
                    memorizing.append(task)
                moved = True
            if moved:
                continue
            if exhausted and not perceiving and not memorizing and not files:
                break
            if not files:
                continue
            pending = [t.memory_ref for t in list(memorizing)[:1]] + [
                t.perception for t in list(perceiving)[:1] if isinstance(t.perception, ray.ObjectRef)
            ]
            if pending:
                ray.wait(pending, num_returns=1, timeout=5.0)

    def _feed(self, items, report, retry_failed: bool) -> Iterator[object]:
        """Opens files in order (probe, hash, store rows) and yields each file, then its clips."""
        from pipelines.ingest import FileResult

        for item in items:
            job = self.ing.open_file(item.path, retry_failed, item.source_id)
            if not isinstance(job, FileResult) and job.video_id in self._in_flight:
                # the same content under a second path: take it once the first copy is finished
                yield _Wait(job.video_id)
                job = self.ing.open_file(item.path, retry_failed, item.source_id)
            if isinstance(job, FileResult):
                report.files.append(job)
                self._file_over()
                continue
            report.files.append(job.result)
            yield _Open(job, remaining=len(job.todo))
            for row in job.todo:
                yield _Task(job, row)

    def _file_over(self) -> None:
        from pipelines.ingest import ALL_FILES

        self._files_over += 1
        if self._files_total > 1:
            self.ing.progress(ALL_FILES, self._files_over, self._files_total)

    def _submit_perception(self, task: _Task) -> None:
        cached = self.ing.cached_perception(task.row)
        if cached is not None:
            task.perception = cached
            return
        job = task.job
        w = self._pick("perceive")
        task.worker = w
        info = {**job.info.__dict__}
        task.perception = self._workers[w].perceive.remote(str(job.path), info, task.row.as_clip().to_dict())

    def _pick(self, stage: str) -> int:
        load = self._load[stage]
        w = min(range(len(load)), key=lambda i: (load[i], i))
        load[w] += 1
        return w

    def _done_with(self, task: _Task) -> None:
        if task.worker >= 0:
            self._load["perceive"][task.worker] -= 1
            task.worker = -1
        if task.memory_worker >= 0:
            self._load["memorize"][task.memory_worker] -= 1
            task.memory_worker = -1

    def _reply(self, ref, what: str, task: _Task) -> dict:
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            row = task.row
            return {"error": f"{task.job.result.path} clip {row.index}: the worker died {TASK_RETRIES + 1} times "
                             f"while {what} it ({type(e).__name__})", "scope": "clip"}

    def _identify(self, task: _Task, current: _Open) -> bool:
        """Save the perception and commit the identity; submit memorization. False when the clip is over."""
        perception = task.perception
        if not isinstance(perception, ClipPerception):
            reply = self._reply(perception, "perceiving", task)
            self._done_with(task)
            if "error" in reply:
                self._clip_error(task, current, reply)
                return False
            if reply.get("node_id"):
                self.stats.clips_per_node[reply["node_id"]] += 1
            perception = ClipPerception.from_dict(reply["perception"])
            self.ing.store.save_perception(task.row.id, perception)
        try:
            identity = self.ing.identify(task.row, perception)
        except (InputError, ModelError) as e:
            self._clip_error(task, current, {"error": str(e), "scope": "clip"})
            return False
        w = self._pick("memorize")
        task.memory_worker = w
        task.memory_ref = self._workers[w].memorize.options(concurrency_group="memorize").remote(
            perception.to_dict(), identity)
        return True

    def _write_memory(self, task: _Task, current: _Open) -> None:
        reply = self._reply(task.memory_ref, "memorizing", task)
        self._done_with(task)
        if "error" in reply:
            self._clip_error(task, current, reply)
            return
        memory = ClipMemory(episodic=tuple(reply["episodic"]), semantic=tuple(reply["semantic"]))
        try:
            self.ing.remember(task.row, memory)
        except (InputError, ModelError) as e:
            self._clip_error(task, current, {"error": str(e), "scope": "clip"})
            return
        current.job.result.clips_done += 1
        self._clip_over(current)

    def _clip_error(self, task: _Task, current: _Open, reply: dict) -> None:
        scope = reply.get("scope")
        if scope == "fatal":
            raise _FATAL.get(reply.get("kind"), M3memError)(reply["error"])
        if scope == "file":
            # as in one process: a file whose decoders cannot open fails as a whole, its clips stay pending
            if current.job.result.error is None:
                current.job.result.error = printable(reply["error"])
                log.error("%s", current.job.result.error)
        else:
            self.ing.clip_failed(current.job, task.row, InputError(reply["error"]))
        self._clip_over(current)

    def _clip_over(self, current: _Open) -> None:
        current.remaining -= 1
        current.done += 1
        self.ing.progress(display(current.job.path.name), current.done, len(current.job.todo))


def _ready(ref) -> bool:
    ray = _ray()
    done, _ = ray.wait([ref], num_returns=1, timeout=0)
    return bool(done)


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            "parallel or cluster ingestion needs Ray, which is not installed: pip install 'm3mem[cluster]' "
            "(or run with --workers 1 and no --ray)"
        ) from e
    return ray


def _check_reachable(address: str) -> None:
    """Fail fast on a host:port that nobody listens on (ray.init would wait for minutes)."""
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--ray expects 'auto' or HOST:PORT (the head's GCS address), got {address!r}")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5.0).close()
    except OSError as e:
        raise ConfigError(
            f"no Ray cluster answers at {address} ({e.strerror or e}); start one with 'ray start --head "
            f"--port={port}' or check the address that 'ray start --head' printed"
        ) from e


def _runtime_env() -> dict:
    """Ship the driver's own m3mem code to the cluster's workers, so every node runs the same version."""
    import m3mem
    import models
    import pipelines

    return {"py_modules": [str(Path(m.__file__).parent) for m in (m3mem, pipelines, models)]}
