"""Ingest files into a store: split, perceive, identify, memorize, write; resumable per clip.

Files are taken in natural sort order of their paths (not file-system order) and
clips in time order, so the same input always gives the same ids. A file already
in the store (same content hash) skips its finished clips. A file that cannot be
read is reported and the batch goes on; the store is not touched for it.
"""
from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from m3mem.config import Config
from m3mem.errors import InputError, ModelError
from pipelines.perceive import Models, perceive_clip

log = logging.getLogger(__name__)

MEDIA_EXTENSIONS = {
    ".mp4", ".mkv", ".mov", ".avi", ".webm", ".mpg", ".mpeg", ".m4v", ".flv", ".wmv", ".ts", ".3gp",
    ".wav", ".mp3", ".flac", ".m4a", ".aac", ".ogg", ".opus",
}


@dataclass
class FileResult:
    path: str
    status: str  # done | skipped | failed | partial
    clips_done: int = 0
    clips_failed: int = 0
    clips_skipped: int = 0
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class IngestReport:
    files: list[FileResult] = field(default_factory=list)
    wall_s: float = 0.0

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
        }


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", str(p))]


def expand_paths(paths: Iterable[str | Path]) -> tuple[list[Path], list[FileResult]]:
    """Files to ingest (folders recursively, media extensions only) and the paths that do not exist."""
    files: list[Path] = []
    missing: list[FileResult] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files.extend(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in MEDIA_EXTENSIONS)
        elif p.is_file():
            files.append(p)
        else:
            missing.append(FileResult(str(p), "failed", error=f"{p}: no such file or folder"))
    seen, unique = set(), []
    for f in sorted(files, key=_natural_key):
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, missing


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Ingestor:
    """Runs the stages for one store in one process; the store's single writer."""

    def __init__(self, store, config: Config, progress: Callable[[str, int, int], None] | None = None):
        from models.registry import load_text_embedder

        self.store = store
        self.config = config
        self.models = Models(config)
        self.embedder = load_text_embedder(config.text_model, config.device)
        self.progress = progress or (lambda label, done, total: None)
        store.check_backends({
            "face": config.face_model, "voice": config.voice_model, "text": config.text_model,
        })

    def ingest(self, paths: Iterable[str | Path], retry_failed: bool = False) -> IngestReport:
        t0 = time.perf_counter()
        files, missing = expand_paths(paths)
        report = IngestReport(files=list(missing))
        for f in missing:
            log.error("%s", f.error)
        for path in files:
            result = self.ingest_file(path, retry_failed=retry_failed)
            report.files.append(result)
        report.wall_s = time.perf_counter() - t0
        return report

    def ingest_file(self, path: Path, retry_failed: bool = False) -> FileResult:
        from m3mem.writer import refresh_characters
        from pipelines.split import AudioTrack, FrameReader, plan_clips, probe

        try:
            if path.stat().st_size == 0:
                raise InputError(f"{path}: the file is empty")
            info = probe(str(path))
            sha = file_sha256(path)
        except InputError as e:
            log.error("%s", e)
            return FileResult(str(path), "failed", error=str(e))
        except OSError as e:
            log.error("%s: %s", path, e)
            return FileResult(str(path), "failed", error=f"{path}: {e.strerror or e}")

        clips = plan_clips(info, video_id=sha[:16], clip_s=self.config.clip_seconds)
        video_id, rows = self.store.add_video(sha, info, clips)
        result = FileResult(str(path), "done", duration_s=info.duration_s)
        todo = [r for r in rows if r.status != "done" and (r.status != "failed" or retry_failed)]
        result.clips_skipped = sum(1 for r in rows if r.status == "done")
        if not todo:
            failed = sum(1 for r in rows if r.status == "failed")
            result.clips_failed = failed
            result.status = "skipped" if not failed else "partial"
            return result
        self.store.set_video_status(video_id, "ingesting")
        frames = audio = None
        try:
            frames = FrameReader(str(path)) if info.has_video else None
            audio = AudioTrack.open(str(path), info) if info.has_audio else None
            for n, row in enumerate(todo):
                self.progress(path.name, n, len(todo))
                try:
                    self._clip(row, frames, audio)
                    result.clips_done += 1
                except (InputError, ModelError) as e:
                    log.error("%s clip %d (%.1f-%.1f s) failed: %s", path.name, row.index, row.start_s, row.end_s, e)
                    self.store.set_clip_status(row.id, "failed", str(e))
                    result.clips_failed += 1
            self.progress(path.name, len(todo), len(todo))
        except InputError as e:
            log.error("%s", e)
            result.error = str(e)
        finally:
            if frames is not None:
                frames.close()
            if audio is not None:
                audio.close()
        refresh_characters(self.store)
        self.store.save_indexes()
        if result.error or result.clips_failed:
            result.status = "partial" if result.clips_done or result.clips_skipped else "failed"
            self.store.set_video_status(video_id, "failed", result.error or f"{result.clips_failed} clips failed")
        else:
            self.store.set_video_status(video_id, "done")
        return result

    def _clip(self, row, frames, audio) -> None:
        from m3mem.writer import commit_identity, commit_memory
        from pipelines.memorize import memorize_lite

        cfg = self.config
        perception = self.store.perception(row.id) if row.status in ("perceived", "identified", "failed") else None
        if perception is None:
            perception = perceive_clip(self.models, row.as_clip(), frames, audio)
            self.store.save_perception(row.id, perception)
        identity = self.store.identity(row.id) if row.status in ("identified", "failed") else None
        if identity is None:
            identity = commit_identity(
                self.store, row.id, perception,
                face_dim=self._dim("face"), face_threshold=self._threshold("face"),
                voice_dim=self._dim("voice"), voice_threshold=self._threshold("voice"),
                max_exemplars=cfg.max_exemplars, frame_step_s=1.0 / cfg.frame_fps,
            )
        if cfg.memorize_model != "lite":
            raise ModelError(
                f"memorize_model {cfg.memorize_model!r} is not available in this build; use 'lite'"
            )
        memory = memorize_lite(perception, identity, 1.0 / cfg.frame_fps)
        commit_memory(self.store, row.id, memory, self.embedder)

    def _dim(self, space: str) -> int:
        model = self.models.face if space == "face" else self.models.voice
        return int(model.dim)

    def _threshold(self, space: str) -> float:
        return self.models.face_threshold() if space == "face" else self.models.voice_threshold()

