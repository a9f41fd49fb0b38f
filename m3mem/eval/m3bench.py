"""M3-Bench: answer the benchmark's questions from memory of its videos, and grade them.

The annotation format is M3-Agent's (``robot.json``, ``web.json``)::

    {"<video id>": {"video_path": "data/videos/robot/<id>.mp4", "mem_path": ...,
                    "qa_list": [{"question", "answer", "question_id", "reasoning",
                                 "type": [...], "timestamp": "MM:SS", "before_clip": 31}, ...]}}

Each video gets a store of its own under the store folder (``<store>/<video id>/``),
as M3-Agent keeps one memory graph per video, so an answer never draws on another
video. A video is found in the videos folder by the file name of its ``video_path``
(or ``<video id>.<ext>``), anywhere below the folder. A robot question with
``before_clip`` k may use memory of 30-second clips 0..k only: it is asked with
``before_s = (k + 1) * 30``. Results are written one JSON line per question as they
are graded, so a long run can be watched, and resumed after an interruption.
"""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from m3mem.config import Config
from m3mem.errors import InputError

log = logging.getLogger(__name__)

CLIP_S = 30.0  # M3-Bench numbers its clips in 30-second steps, whatever m3mem's clip length

# Table rows: the benchmark's question types, by the start of their names
# ("Multi-Detail Reasoning" in robot.json is "Multi-Evidence Reasoning" in web.json).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Multi-Detail/Multi-Evidence", ("multi-detail", "multi-evidence")),
    ("Multi-Hop", ("multi-hop",)),
    ("Cross-Modal", ("cross-modal",)),
    ("Person Understanding", ("person understanding",)),
    ("General Knowledge", ("general knowledge",)),
)
ALL = "All"


def type_groups(types: Iterable[str]) -> tuple[str, ...]:
    """The table rows a question counts in; an unknown type is a row of its own."""
    out: list[str] = []
    for t in types:
        low = t.strip().lower()
        group = next((g for g, prefixes in GROUPS if low.startswith(prefixes)), t.strip())
        if group and group not in out:
            out.append(group)
    return tuple(out)


@dataclass(frozen=True)
class BenchQuestion:
    question_id: str
    video_id: str
    question: str
    answer: str
    types: tuple[str, ...]
    before_clip: int | None = None
    timestamp: str | None = None

    @property
    def before_s(self) -> float | None:
        return None if self.before_clip is None else (self.before_clip + 1) * CLIP_S


@dataclass(frozen=True)
class BenchVideo:
    video_id: str
    video_path: str
    questions: tuple[BenchQuestion, ...]

    @property
    def file_name(self) -> str:
        return Path(self.video_path).name if self.video_path else ""


def load_annotations(path: str | Path) -> list[BenchVideo]:
    """Read an M3-Bench annotation file; an InputError names the file and the entry that is wrong."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise InputError(f"{p}: no such annotation file") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{p} is not a readable JSON annotation file ({e})") from e
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected an object of video id -> {{video_path, qa_list}}, got {type(data).__name__}")
    videos = []
    seen: set[str] = set()
    for vid, entry in data.items():
        where = f"{p}, video {vid!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("qa_list"), list):
            raise InputError(f"{where}: expected an object with a 'qa_list' list")
        questions = []
        for i, qa in enumerate(entry["qa_list"]):
            if not isinstance(qa, dict):
                raise InputError(f"{where}, question {i}: expected an object")
            missing = [k for k in ("question", "answer") if not isinstance(qa.get(k), str)]
            if missing:
                raise InputError(f"{where}, question {i}: missing or non-text {', '.join(missing)}")
            qid = str(qa.get("question_id") or f"{vid}_Q{i + 1:02d}")
            if qid in seen:
                raise InputError(f"{where}: question id {qid!r} appears twice")
            seen.add(qid)
            types = qa.get("type") or []
            types = (types,) if isinstance(types, str) else tuple(str(t) for t in types)
            before = qa.get("before_clip")
            if before is not None:
                try:
                    before = int(before)
                except (TypeError, ValueError) as e:
                    raise InputError(f"{where}, question {qid}: before_clip {before!r} is not a clip number") from e
                if before < 0:
                    raise InputError(f"{where}, question {qid}: before_clip {before} is negative")
            questions.append(BenchQuestion(qid, str(vid), qa["question"], qa["answer"], types, before,
                                           qa.get("timestamp")))
        videos.append(BenchVideo(str(vid), str(entry.get("video_path") or ""), tuple(questions)))
    return videos


def locate_videos(videos: Iterable[BenchVideo], videos_dir: str | Path | None) -> dict[str, Path]:
    """Video id -> file below ``videos_dir``, matched by the file name of its video_path,
    else by ``<video id>.<any media extension>``."""
    from pipelines.ingest import MEDIA_EXTENSIONS

    if videos_dir is None:
        return {}
    root = Path(videos_dir)
    if not root.is_dir():
        raise InputError(f"{root}: the videos folder does not exist")
    by_name: dict[str, Path] = {}
    by_stem: dict[str, Path] = {}
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix.lower() in MEDIA_EXTENSIONS:
            if f.name in by_name:
                log.warning("two videos named %s (%s, %s); using the first", f.name, by_name[f.name], f)
                continue
            by_name[f.name] = f
            by_stem.setdefault(f.stem, f)
    out = {}
    for v in videos:
        found = by_name.get(v.file_name) or by_stem.get(v.video_id)
        if found is not None:
            out[v.video_id] = found
    return out


def store_dir_for(store_root: str | Path, video_id: str) -> Path:
    """The store of one video: a folder named after its id (characters a file system refuses replaced)."""
    safe = re.sub(r"[^\w.\-]", "_", video_id).strip(".") or "_"
    return Path(store_root) / safe


@dataclass
class QuestionResult:
    question_id: str
    video_id: str
    question: str
    ground_truth: str
    answer: str
    types: list[str]
    groups: list[str]
    before_clip: int | None
    before_s: float | None
    correct: bool
    judge: str
    judge_reply: str = ""
    citations: list[dict] = field(default_factory=list)
    answer_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "QuestionResult":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class VideoStatus:
    video_id: str
    status: str  # ingested | existing store | answered before | missing | failed
    questions: int
    path: str | None = None
    error: str | None = None
    ingest_s: float = 0.0


@dataclass
class M3BenchReport:
    annotations: str
    judge: str
    results: list[QuestionResult] = field(default_factory=list)
    videos: list[VideoStatus] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def missing(self) -> list[VideoStatus]:
        return [v for v in self.videos if v.status == "missing"]

    def accuracy(self) -> list[dict]:
        """One row per question type, in the benchmark's order, then any other type, then All."""
        counts: dict[str, list[int]] = {g: [0, 0] for g, _ in GROUPS}
        for r in self.results:
            for g in r.groups:
                c = counts.setdefault(g, [0, 0])
                c[0] += int(r.correct)
                c[1] += 1
        counts[ALL] = [sum(int(r.correct) for r in self.results), len(self.results)]
        return [
            {"type": g, "correct": c, "total": n, "accuracy": round(c / n, 4) if n else None}
            for g, (c, n) in counts.items()
        ]

    def table(self) -> str:
        rows = self.accuracy()
        width = max(len(r["type"]) for r in rows)
        lines = [f"{'Question type':<{width}}  {'Correct':>7}  {'Total':>5}  {'Accuracy':>8}",
                 f"{'-' * width}  {'-' * 7}  {'-' * 5}  {'-' * 8}"]
        for r in rows:
            acc = f"{100 * r['accuracy']:.1f}%" if r["accuracy"] is not None else "-"
            lines.append(f"{r['type']:<{width}}  {r['correct']:>7}  {r['total']:>5}  {acc:>8}")
        skipped = sum(v.questions for v in self.missing)
        if self.missing:
            lines.append(f"{len(self.missing)} videos missing, {skipped} questions skipped: "
                         + ", ".join(v.video_id for v in self.missing[:10])
                         + (" ..." if len(self.missing) > 10 else ""))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "annotations": self.annotations, "judge": self.judge, "answered": len(self.results),
            "accuracy": self.accuracy(),
            "videos": [asdict(v) for v in self.videos],
            "missing_videos": [v.video_id for v in self.missing],
            "skipped_questions": sum(v.questions for v in self.missing),
            "wall_s": round(self.wall_s, 2),
        }


def read_results(path: str | Path) -> list[QuestionResult]:
    out = []
    p = Path(path)
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(QuestionResult.from_json(json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            # the last line of a killed run may be cut short; everything before it stands
            log.warning("%s line %d is not a result (%s); it will be answered again", p, n, e)
    return out


def run_m3bench(
    annotations: str | Path,
    store_root: str | Path,
    videos_dir: str | Path | None = None,
    config: Config | None = None,
    judge=None,
    results_path: str | Path | None = None,
    resume: bool = False,
    video_ids: Iterable[str] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> M3BenchReport:
    """Ingest the videos found, answer every question of the videos that have memory, judge, report.

    ``judge`` is a ``m3mem.eval.judge`` Judge (string match when None). With
    ``resume``, questions already in ``results_path`` are kept and not asked again.
    """
    from m3mem.eval.judge import StringMatchJudge

    t0 = time.perf_counter()
    config = config or Config()
    judge = judge or StringMatchJudge()
    progress = progress or (lambda label, done, total: None)
    store_root = Path(store_root)
    if (store_root / "memory.db").exists():
        raise InputError(
            f"{store_root} is a single m3mem store; M3-Bench keeps one store per video below the --store "
            f"folder (so that answers draw on their own video only). Give a new or an M3-Bench store folder"
        )
    videos = load_annotations(annotations)
    if video_ids is not None:
        wanted = set(video_ids)
        unknown = wanted - {v.video_id for v in videos}
        if unknown:
            raise InputError(f"{annotations} has no video {', '.join(sorted(unknown))}")
        videos = [v for v in videos if v.video_id in wanted]
    located = locate_videos(videos, videos_dir)
    results_path = Path(results_path) if results_path else store_root / f"m3bench_{Path(annotations).stem}.jsonl"
    results_path.parent.mkdir(parents=True, exist_ok=True)

    report = M3BenchReport(str(annotations), judge.name)
    done: dict[str, QuestionResult] = {}
    if resume and results_path.exists():
        wanted_q = {q.question_id for v in videos for q in v.questions}
        done = {r.question_id: r for r in read_results(results_path) if r.question_id in wanted_q}
        log.info("resuming: %d questions already answered in %s", len(done), results_path)
    # rewrite the file with what is kept, so it holds each question once
    with open(results_path, "w", encoding="utf-8") as out:
        for r in done.values():
            out.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
        total = sum(len(v.questions) for v in videos)
        answered = 0
        for video in videos:
            status = VideoStatus(video.video_id, "", len(video.questions))
            report.videos.append(status)
            todo = [q for q in video.questions if q.question_id not in done]
            report.results.extend(done[q.question_id] for q in video.questions if q.question_id in done)
            answered += len(video.questions) - len(todo)
            mem = _open_memory(video, located.get(video.video_id), store_root, config, status, bool(todo), progress)
            if mem is None:
                if status.status == "missing":
                    log.warning("video %s (%s) not found and no store for it; its %d questions are skipped",
                                video.video_id, video.file_name or "no video_path", len(todo))
                    status.questions = len(todo)
                continue
            with mem:
                for q in todo:
                    progress("questions", answered, total)
                    result = _answer(mem, q, judge)
                    report.results.append(result)
                    out.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
                    out.flush()
                    answered += 1
        progress("questions", total, total)
    report.wall_s = time.perf_counter() - t0
    return report


def _open_memory(video: BenchVideo, path: Path | None, store_root: Path, config: Config,
                 status: VideoStatus, needed: bool, progress=None):
    """The video's memory, ingesting the file when there is one; None when there is nothing to answer from."""
    from m3mem.memory import Memory

    sub = store_dir_for(store_root, video.video_id)
    has_store = (sub / "memory.db").exists()
    if not needed:
        # every question is in the resumed results (or there are none): nothing to ingest
        status.status = "answered before" if video.questions else "no questions"
        status.path = str(path) if path else None
        return None
    if path is None:
        if not has_store:
            status.status = "missing"
            return None
        status.status = "existing store"
        return Memory(sub, config, read_only=True)
    status.path = str(path)
    t = time.perf_counter()
    mem = Memory(sub, config)
    try:
        report = mem.ingest([path], progress=progress)
    except BaseException:
        mem.close()
        raise
    status.ingest_s = round(time.perf_counter() - t, 2)
    f = report.files[0]
    if f.status == "failed":
        # nothing of the video is in memory; its questions are still asked, and fail, so the
        # accuracy is over every question whose video was given
        status.status, status.error = "failed", f.error or f"{f.clips_failed} clips failed"
        log.error("video %s could not be ingested: %s", video.video_id, status.error)
    else:
        status.status = "ingested" if f.status in ("done", "skipped") else f.status
        status.error = f.error
    return mem


def _answer(mem, q: BenchQuestion, judge) -> QuestionResult:
    t = time.perf_counter()
    answer = mem.ask(q.question, before_s=q.before_s)
    answer_s = time.perf_counter() - t
    verdict = judge.judge(q.question, q.answer, answer.answer)
    return QuestionResult(
        question_id=q.question_id, video_id=q.video_id, question=q.question, ground_truth=q.answer,
        answer=answer.answer, types=list(q.types), groups=list(type_groups(q.types)),
        before_clip=q.before_clip, before_s=q.before_s, correct=verdict.correct, judge=verdict.method,
        judge_reply=verdict.reply, citations=answer.citations, answer_s=round(answer_s, 3),
    )
