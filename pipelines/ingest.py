"""Ingest files into a store: split, perceive, identify, memorize, write; resumable per clip.

Files are taken in natural sort order of their paths (not file-system order) and
clips in time order, so the same input always gives the same ids. A file already
in the store (same content hash) skips its finished clips. A file that cannot be
read is reported and the batch goes on; the store is not touched for it.

Each clip's stages commit separately (perception cached, identity, memory), so a
crash or a kill at any moment loses at most the stage in flight. This module runs
everything in one process; with ``Config.workers > 1`` or a Ray address the same
stages run through ``pipelines/ray_ingest.py``, which calls the methods here for
every write so the two paths give the same store.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from m3mem.config import Config
from m3mem.errors import InputError, ModelError
from m3mem.records import ClipMemory, ClipPerception, VideoInfo
from pipelines.archive import MEDIA_EXTENSIONS, DecodablePath, display, expand_inputs, natural_key, printable
from pipelines.perceive import Models, perceive_clip

log = logging.getLogger(__name__)

__all__ = ["FileResult", "IngestReport", "Ingestor", "expand_paths", "file_sha256", "memorize_clip",
           "MEDIA_EXTENSIONS"]

# the progress label of the whole batch (the others are file names)
ALL_FILES = "all files"


@dataclass
class FileResult:
    path: str
    status: str  # done | skipped | failed | partial
    clips_done: int = 0
    clips_failed: int = 0
    clips_skipped: int = 0
    error: str | None = None
    duration_s: float = 0.0
    source_id: str | None = None  # the manifest's id for this file, when a manifest named it


@dataclass
class IngestReport:
    files: list[FileResult] = field(default_factory=list)
    wall_s: float = 0.0
    cluster: dict | None = None  # with Ray: {"workers": n, "clips_per_node": {node_id: clips perceived there}}

    @property
    def failed(self) -> list[FileResult]:
        return [f for f in self.files if f.status in ("failed", "partial")]

    def to_json(self) -> dict:
        media_s = sum(f.duration_s for f in self.files)
        return {
            "files": [f.__dict__ for f in self.files],
            "clips_done": sum(f.clips_done for f in self.files),
            "clips_failed": sum(f.clips_failed for f in self.files),
            "clips_skipped": sum(f.clips_skipped for f in self.files),
            "wall_s": round(self.wall_s, 2),
            "real_time_factor": round(self.wall_s / media_s, 4) if media_s else None,
            **({"cluster": self.cluster} if self.cluster is not None else {}),
        }


_natural_key = natural_key


def expand_paths(paths: Iterable[str | Path]) -> tuple[list[Path], list[FileResult]]:
    """Files to ingest (see pipelines/archive.py for the input forms) and the inputs that give none."""
    items, problems = expand_inputs(paths)
    return [i.path for i in items], [FileResult(p.path, "failed", error=p.error) for p in problems]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def memorize_clip(config: Config, perception: ClipPerception, identity: dict,
                  frames_reader=None, audio_track=None) -> ClipMemory:
    """The memorize stage of one clip; pure (no store), so it may run in any process."""
    from pipelines.memorize import memorize_lite

    if config.memorize_model == "lite":
        return memorize_lite(perception, identity, 1.0 / config.frame_fps)
    from models.registry import load_chat_model
    from pipelines.memorize import memorize_with_model

    clip = perception.clip
    fps = min(config.frame_fps, 1.0)  # the model sees at most one frame per second, as M3-Agent's does
    frames = []
    if frames_reader is not None:
        frames = list(frames_reader.frames_at(frames_reader.sample_times(clip, fps), max_side_px=448))
    audio = audio_track.slice(clip.start_s, clip.end_s) if audio_track is not None else None
    chat = load_chat_model(config.memorize_model, config.device)
    return memorize_with_model(chat, perception, identity, frames, fps, audio=audio,
                               sr=16000, retries=config.memorize_retries)


@dataclass
class FileJob:
    """A file whose clips are being ingested: its probe, its video row and the clips left to do."""

    path: Path
    info: VideoInfo
    video_id: int
    result: FileResult
    todo: list = field(default_factory=list)  # ClipRow, in time order


class Ingestor:
    """Runs the stages for one store in one process; the store's single writer."""

    def __init__(self, store, config: Config, progress: Callable[[str, int, int], None] | None = None):
        from models.registry import load_text_embedder

        self.store = store
        self.config = config
        self.models = Models(config)
        self.embedder = load_text_embedder(config.text_model, config.device)
        self.progress = progress or (lambda label, done, total: None)
        self._identity_params: dict | None = None
        store.check_backends({
            "face": config.face_model, "voice": config.voice_model, "text": config.text_model,
        })

    def ingest(self, paths: Iterable[str | Path], retry_failed: bool = False) -> IngestReport:
        if self.config.workers > 1 or self.config.ray_address:
            from pipelines.ray_ingest import RayIngest

            return RayIngest(self).ingest(paths, retry_failed=retry_failed)
        t0 = time.perf_counter()
        items, problems = expand_inputs(paths)
        report = IngestReport(files=[self.problem(p) for p in problems])
        for n, item in enumerate(items):
            if len(items) > 1:
                self.progress(ALL_FILES, n, len(items))
            report.files.append(self.ingest_file(item.path, retry_failed=retry_failed, source_id=item.source_id))
        if len(items) > 1:
            self.progress(ALL_FILES, len(items), len(items))
        report.wall_s = time.perf_counter() - t0
        return report

    @staticmethod
    def problem(p) -> FileResult:
        log.error("%s", p.error)
        return FileResult(p.path, "failed", error=p.error)

    def ingest_file(self, path: Path, retry_failed: bool = False, source_id: str | None = None) -> FileResult:
        from pipelines.split import AudioTrack, FrameReader

        job = self.open_file(Path(path), retry_failed, source_id)
        if isinstance(job, FileResult):
            return job
        if not job.todo:  # a run stopped after the file's last clip, before the file was finished
            self.finish_file(job)
            return job.result
        label = display(job.path.name)
        frames = audio = None
        source = DecodablePath(job.path)
        try:
            frames = FrameReader(source.path) if job.info.has_video else None
            audio = AudioTrack.open(source.path, job.info) if job.info.has_audio else None
            for n, row in enumerate(job.todo):
                self.progress(label, n, len(job.todo))
                try:
                    self._clip(row, frames, audio)
                    job.result.clips_done += 1
                except (InputError, ModelError) as e:
                    self.clip_failed(job, row, e)
            self.progress(label, len(job.todo), len(job.todo))
        except InputError as e:
            log.error("%s", printable(str(e)))
            job.result.error = printable(str(e))
        finally:
            if frames is not None:
                frames.close()
            if audio is not None:
                audio.close()
            source.close()
        self.finish_file(job)
        return job.result

    # the stages, shared with pipelines/ray_ingest.py -----------------------------

    def open_file(self, path: Path, retry_failed: bool = False, source_id: str | None = None) -> FileJob | FileResult:
        """Probe and hash a file and add it to the store: a job (the clips left to do, maybe none but the
        file still to finish), or the final result when there is nothing to do."""
        from pipelines.split import plan_clips, probe

        shown = display(path)
        try:
            if path.stat().st_size == 0:
                raise InputError(f"{shown}: the file is empty")
            info = probe(str(path))
            sha = file_sha256(path)
        except InputError as e:
            log.error("%s", printable(str(e)))
            return FileResult(shown, "failed", error=printable(str(e)), source_id=source_id)
        except OSError as e:
            log.error("%s: %s", shown, e)
            return FileResult(shown, "failed", error=f"{shown}: {e.strerror or e}", source_id=source_id)

        # the store keeps a path that can always be printed; decoders get the real one
        info = replace(info, path=shown)
        clips = plan_clips(info, video_id=sha[:16], clip_s=self.config.clip_seconds)
        video_id, rows = self.store.add_video(sha, info, clips)
        result = FileResult(shown, "done", duration_s=info.duration_s, source_id=source_id)
        todo = [r for r in rows if r.status != "done" and (r.status != "failed" or retry_failed)]
        result.clips_skipped = sum(1 for r in rows if r.status == "done")
        job = FileJob(path, info, video_id, result, todo)
        if not todo:
            failed = sum(1 for r in rows if r.status == "failed")
            result.clips_failed = failed
            result.status = "skipped" if not failed else "partial"
            if self.store.video(video_id).status in ("done", "failed"):
                return result
            # a run stopped after the file's last clip but before the file was finished: finish it
            return job
        self.store.set_video_status(video_id, "ingesting")
        return job

    def cached_perception(self, row) -> ClipPerception | None:
        return self.store.perception(row.id) if row.status in ("perceived", "identified", "failed") else None

    def identify(self, row, perception: ClipPerception) -> dict:
        """The clip's identity: cached, or matched now and committed (one transaction)."""
        from m3mem.writer import commit_identity

        identity = self.store.identity(row.id) if row.status in ("identified", "failed") else None
        if identity is None:
            p = self.identity_params()
            identity = commit_identity(
                self.store, row.id, perception,
                face_dim=p["face_dim"], face_threshold=p["face_threshold"],
                voice_dim=p["voice_dim"], voice_threshold=p["voice_threshold"],
                max_exemplars=self.config.max_exemplars, frame_step_s=1.0 / self.config.frame_fps,
            )
        return identity

    def identity_params(self) -> dict:
        """Embedding sizes and thresholds of the face and voice models."""
        if self._identity_params is None:
            self._identity_params = {
                "face_dim": int(self.models.face.dim), "face_threshold": float(self.models.face_threshold()),
                "voice_dim": int(self.models.voice.dim), "voice_threshold": float(self.models.voice_threshold()),
            }
        return self._identity_params

    def remember(self, row, memory: ClipMemory) -> None:
        """Write the clip's memory and mark it done (one transaction)."""
        from m3mem.writer import commit_memory

        commit_memory(self.store, row.id, memory, self.embedder)

    def clip_failed(self, job: FileJob, row, error: Exception) -> None:
        message = printable(str(error))
        log.error("%s clip %d (%.1f-%.1f s) failed: %s", display(job.path.name), row.index, row.start_s, row.end_s,
                  message)
        self.store.set_clip_status(row.id, "failed", message)
        job.result.clips_failed += 1

    def finish_file(self, job: FileJob) -> None:
        """Rebuild characters with the file's equivalences, save the indexes, set the file's status."""
        from m3mem.writer import refresh_characters

        refresh_characters(self.store)
        self.store.save_indexes()
        result = job.result
        if result.error or result.clips_failed:
            if result.status == "done":
                result.status = "partial" if result.clips_done or result.clips_skipped else "failed"
            self.store.set_video_status(job.video_id, "failed", result.error or f"{result.clips_failed} clips failed")
        else:
            self.store.set_video_status(job.video_id, "done")

    def _clip(self, row, frames, audio) -> None:
        perception = self.cached_perception(row)
        if perception is None:
            perception = perceive_clip(self.models, row.as_clip(), frames, audio)
            self.store.save_perception(row.id, perception)
        identity = self.identify(row, perception)
        self.remember(row, memorize_clip(self.config, perception, identity, frames, audio))
