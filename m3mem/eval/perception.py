"""Perception quality on m3mem's test media: one table per backend.

``m3mem eval perception`` (with no metric named) measures, on the test media folder
(``shared/data``, see its MANIFEST.md and ``gt/``), what each configured backend
gets right:

- face backend: verification accuracy on ``gt/deepface_pairs.csv`` at the backend's
  calibrated threshold (largest face per photo); faces found in two group photos; and
  identity precision and recall on a video joined from clips of known people,
  ingested into a fresh store (face ids as the identity stage gives them).
- speech backend: word error rate on ``jfk.wav`` and on the GRID clips (audio taken
  from the ``.mpg`` files as ingest takes it), text lower-cased without punctuation.
- voice backend (on the segments of each speech backend): diarization error rate of
  m3mem's own pipeline (speech segments, voice embeddings, within-clip voice grouping
  at the voice threshold) on three files with RTTM references; and whether the four
  AMI speakers keep their ``voice_N`` from ``ami_tst00.wav`` to ``ami_tst01.wav`` when
  both are ingested into one store.

The numbers come from the metric functions of ``m3mem.eval.metrics`` (jiwer,
pyannote.metrics, scikit-learn) and from the same perception and identity code that
ingest runs, so they measure the product, not a re-implementation of it.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from m3mem.config import Config
from m3mem.errors import InputError, M3memError

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None] | None

PARTS = ("verification", "detection", "identity", "wer", "der", "cross-file")

PAIRS = "gt/deepface_pairs.csv"
GROUP_PHOTOS = (
    ("faces/insightface_t1_group.jpg", 6, "6"),
    # the manifest names the two men; a girl's face at the lower right edge is visible too
    ("faces/fr_obama_and_biden.jpg", 3, "3 visible (manifest: 2)"),
)
JFK = ("jfk.wav", "gt/jfk.txt")
GRID_TRANSCRIPTS = "gt/grid_transcripts.tsv"
DER_FILES = (
    ("pyannote_sample.wav", "gt/pyannote_sample.rttm"),
    ("ami_tst00.wav", "gt/ami_tst00.rttm"),
    ("ami_tst01.wav", "gt/ami_tst01.rttm"),
)
CROSS_FILES = (("ami_tst00.wav", "gt/ami_tst00.rttm"), ("ami_tst01.wav", "gt/ami_tst01.rttm"))

# The joined video: (source, seconds taken, true person). katie comes back at the end,
# in the second 30 s clip, so her id must survive the clip boundary.
SEGMENTS = (
    ("hdtf_katie_hill.mp4", 8.0, "katie"),
    ("retalking_face1.mp4", 4.9, "man1"),
    ("hdtf_aoc_a.mp4", 8.0, "aoc"),
    ("retalking_face4.mp4", 5.5, "woman4"),
    ("retalking_face2.mp4", 4.9, "man2"),
    ("hdtf_katie_hill.mp4", 8.0, "katie"),
)
JOINED_NAME = "joined_people.mp4"
# identity is scored at points this far apart: fine enough for 1 fps face sampling
IDENTITY_STEP_S = 0.5


def default_data_dir() -> Path:
    """``$M3MEM_EVAL_DATA``, else ``shared/data`` beside the repository (where the tests find it)."""
    env = os.environ.get("M3MEM_EVAL_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


# --- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of a table: what was measured, the value, what it is compared with, how it came about."""

    metric: str
    value: float | int | str | None
    reference: str = ""
    detail: str = ""


@dataclass(frozen=True)
class BackendTable:
    role: str  # face | speech | voice
    backend: str  # the config string
    title: str
    rows: tuple[Row, ...] = ()
    raw: dict = field(default_factory=dict)  # the metric functions' full results, for --json
    not_measured: str | None = None  # why the backend could not run here
    wall_s: float = 0.0

    def value(self, metric: str):
        """The value of the first row whose metric starts with ``metric``."""
        for r in self.rows:
            if r.metric.startswith(metric):
                return r.value
        raise KeyError(f"no row {metric!r} in the {self.title} table")

    def to_json(self) -> dict:
        return {"role": self.role, "backend": self.backend, "title": self.title,
                "rows": [asdict(r) for r in self.rows], "raw": self.raw,
                "not_measured": self.not_measured, "wall_s": round(self.wall_s, 2)}


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


@dataclass(frozen=True)
class PerceptionReport:
    data_dir: str
    date: str
    machine: dict
    tables: tuple[BackendTable, ...]
    wall_s: float

    def table(self, role: str, backend: str | None = None) -> BackendTable:
        for t in self.tables:
            if t.role == role and (backend is None or t.backend == backend):
                return t
        raise KeyError(f"no {role} table" + (f" for {backend}" if backend else ""))

    def to_json(self) -> dict:
        return {"data_dir": self.data_dir, "date": self.date, "machine": self.machine,
                "wall_s": round(self.wall_s, 1), "tables": [t.to_json() for t in self.tables]}

    def to_text(self) -> str:
        out = [f"Perception quality on {self.data_dir}, {self.date}, {machine_line(self.machine)}"]
        for t in self.tables:
            out.append("")
            out.append(f"{t.title}" + (f"  ({t.wall_s:.0f} s)" if t.wall_s else ""))
            if t.not_measured:
                out.append(f"  not measured: {t.not_measured}")
                continue
            w = max((len(r.metric) for r in t.rows), default=10)
            wv = max((len(_fmt(r.value)) for r in t.rows), default=5)
            wr = max((len(r.reference) for r in t.rows), default=5)
            for r in t.rows:
                line = f"  {r.metric:<{w}}  {_fmt(r.value):>{wv}}  {r.reference:<{wr}}  {r.detail}"
                out.append(line.rstrip())
        return "\n".join(out)

    def to_markdown(self) -> str:
        out = [f"Measured {self.date} on {machine_line(self.machine)}; media: `{self.data_dir}`."]
        for t in self.tables:
            out += ["", f"### {t.title}", ""]
            if t.not_measured:
                out.append(f"Not measured: {t.not_measured}")
                continue
            if t.wall_s:
                out += [f"Wall time {t.wall_s:.0f} s.", ""]
            out += ["| metric | value | reference | detail |", "|---|---:|---|---|"]
            for r in t.rows:
                # markdown drops leading spaces: keep the indent of a sub-row visible
                metric = "&emsp;" + r.metric.strip() if r.metric.startswith(" ") else r.metric
                cells = [metric, _fmt(r.value), r.reference, r.detail]
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(out) + "\n"


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
    gpu = None
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                gpu = out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}"}


def machine_line(m: dict) -> str:
    return f"{m.get('cpu')}, {m.get('cpu_count')} cores, " + (f"GPU {m['gpu']}" if m.get("gpu") else "no GPU")


# --- the evaluation --------------------------------------------------------------------


def run_perception_eval(data_dir: str | Path | None = None, config: Config | None = None,
                        face_models: Sequence[str] | None = None, speech_models: Sequence[str] | None = None,
                        voice_models: Sequence[str] | None = None, parts: Iterable[str] | None = None,
                        grid_clips: int | None = None, der_files: Sequence[str] | None = None,
                        progress: Progress = None) -> PerceptionReport:
    """Measure every configured backend on the test media; one table per backend.

    ``parts`` picks among ``PARTS`` (all by default); ``grid_clips`` takes only the first
    N GRID clips (in file-name order); ``der_files`` only those audio files for DER.
    Backends default to the config's. A backend that cannot be loaded here (a missing
    model folder, a library not installed) gives a table that says why, not an error.
    """
    cfg = config or Config()
    data = Path(data_dir) if data_dir is not None else default_data_dir()
    if not (data / "MANIFEST.md").is_file() or not (data / "gt").is_dir():
        raise InputError(f"{data} is not the test media folder (it needs MANIFEST.md and gt/); "
                         "pass --data DIR or set M3MEM_EVAL_DATA")
    chosen = set(PARTS if parts is None else parts)
    unknown = chosen - set(PARTS)
    if unknown:
        raise InputError(f"unknown evaluation part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    faces = list(dict.fromkeys(face_models or [cfg.face_model]))
    speeches = list(dict.fromkeys(speech_models or [cfg.speech_model]))
    voices = list(dict.fromkeys(voice_models or [cfg.voice_model]))
    t0 = time.monotonic()
    tables: list[BackendTable] = []
    if chosen & {"verification", "detection", "identity"}:
        for spec in faces:
            tables.append(_timed(lambda s=spec: evaluate_face(s, data, cfg, chosen, progress)))
    if "wer" in chosen:
        for spec in speeches:
            tables.append(_timed(lambda s=spec: evaluate_speech(s, data, cfg, grid_clips, progress)))
    if chosen & {"der", "cross-file"}:
        for sspec, vspec in itertools.product(speeches, voices):
            tables.append(_timed(lambda s=sspec, v=vspec: evaluate_voice(v, s, data, cfg, chosen, der_files, progress)))
    return PerceptionReport(data_dir=str(data), date=_dt.date.today().isoformat(), machine=machine(),
                            tables=tuple(tables), wall_s=time.monotonic() - t0)


def _timed(fn: Callable[[], BackendTable]) -> BackendTable:
    t0 = time.monotonic()
    table = fn()
    return BackendTable(**{**table.__dict__, "wall_s": time.monotonic() - t0})


def _unavailable(role: str, spec: str) -> str | None:
    """Why a backend cannot run in this environment, before loading it."""
    from models.registry import parse_spec

    name, _ = parse_spec(spec)
    library = {"whisperx": "whisperx", "insightface": "insightface"}.get(name)
    if library and importlib.util.find_spec(library) is None:
        where = ("its own virtualenv (.ci/asr-env.sh), with m3mem installed there"
                 if name == "whisperx" else "this environment: pip install 'm3mem[face]'")
        return f"{library} is not installed here; run this command from {where}"
    return None


def _step(progress: Progress, label: str, done: int, total: int) -> None:
    if progress is not None:
        progress(label, done, total)


# --- faces -------------------------------------------------------------------------------


def evaluate_face(spec: str, data: Path, cfg: Config, parts: set[str], progress: Progress = None) -> BackendTable:
    title = f"Faces: {spec}"
    why = _unavailable("face", spec)
    if why:
        return BackendTable("face", spec, title, not_measured=why)
    from models.registry import load_face_model

    from m3mem.eval.metrics import face_verification, read_pairs, score_face_pairs

    try:
        model = load_face_model(spec, cfg.device)
    except M3memError as e:
        return BackendTable("face", spec, title, not_measured=str(e))
    threshold = cfg.face_threshold if cfg.face_threshold is not None else float(model.match_threshold)
    title = f"Faces: {spec} (match threshold {threshold:g})"
    rows: list[Row] = []
    raw: dict = {"threshold": threshold}

    if "verification" in parts:
        pairs = read_pairs(data / PAIRS)
        _step(progress, f"faces {spec}: pairs", 0, 1)
        scores, labels, missed = score_face_pairs(model, pairs, data, cfg.max_frame_side_px)
        _step(progress, f"faces {spec}: pairs", 1, 1)
        v = face_verification(scores, labels, threshold)
        raw["verification"] = {**v.to_json(), "images_without_face": missed}
        rows += [
            Row(f"verification accuracy, {v.pairs} photo pairs", v.accuracy, f"{v.same} same, {v.different} different",
                f"largest face per photo; cosine >= {threshold:g} means same"),
            Row("  true accept rate", v.true_accept_rate, f"of {v.same} same pairs"),
            Row("  false accept rate", v.false_accept_rate, f"of {v.different} different pairs"),
            Row("  ROC AUC", v.auc, "", f"EER {_fmt(v.eer)} at {_fmt(v.eer_threshold)}"),
            Row("  best accuracy, any threshold", v.best_accuracy, "", f"at {v.best_threshold:.3f} (chosen on these pairs)"),
            Row("  photos with no face found", len(missed), "0", ", ".join(missed)),
        ]

    if "detection" in parts:
        for i, (name, truth, truth_text) in enumerate(GROUP_PHOTOS):
            _step(progress, f"faces {spec}: photos", i, len(GROUP_PHOTOS))
            found, kept = count_faces(model, data / name, cfg)
            raw.setdefault("detection", {})[name] = {"found": found, "at_least_min_face_px": kept, "truth": truth}
            rows.append(Row(f"faces found, {Path(name).name}", found, truth_text,
                            f"{kept} of them >= {cfg.min_face_px} px (kept by ingest)"))
        _step(progress, f"faces {spec}: photos", len(GROUP_PHOTOS), len(GROUP_PHOTOS))

    if "identity" in parts:
        result = joined_video_identity(spec, data, cfg, progress)
        raw["identity"] = result
        per_person = ", ".join(f"{p} {len(ids)}" for p, ids in result["ids_per_person"].items())
        merged = {i: ps for i, ps in result["persons_per_id"].items() if len(ps) > 1}
        rows += [
            Row("identity pairwise precision, joined video", result["pairwise_precision"],
                f"{len(SEGMENTS)} segments, {len(result['people'])} people",
                f"pairs of (time, face id) every {IDENTITY_STEP_S:g} s: same id -> same person"),
            Row("identity pairwise recall, joined video", result["pairwise_recall"], "",
                "same person -> same id"),
            Row("  ids per person", max((len(v) for v in result["ids_per_person"].values()), default=0), "1",
                per_person),
            Row("  persons per id", max((len(v) for v in result["persons_per_id"].values()), default=0), "1",
                ("merged: " + "; ".join(f"{i}: {', '.join(ps)}" for i, ps in merged.items())) if merged
                else f"{len(result['persons_per_id'])} ids, none shared"),
            Row("  time points with a face id", result["time_covered"], "1.0",
                f"of {result['time_points']} points where a person is on screen"),
            Row("  identification precision / recall", f"{result['precision']:.3f} / {result['recall']:.3f}", "",
                "pyannote.metrics, ids mapped one-to-one to people by time"),
        ]
    return BackendTable("face", spec, title, tuple(rows), raw)


def count_faces(model, path: Path, cfg: Config) -> tuple[int, int]:
    """Faces the backend finds in a photo, scaled as ingest scales frames; and those ingest keeps."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if max(im.size) > cfg.max_frame_side_px:
                im.thumbnail((cfg.max_frame_side_px, cfg.max_frame_side_px), Image.Resampling.BILINEAR)
            frame = np.asarray(im)
    except FileNotFoundError as e:
        raise InputError(f"{path}: no such photo in the test media") from e
    faces = model.detect([frame])
    return len(faces), sum(1 for f in faces if f.size_px >= cfg.min_face_px)


def join_people(data: Path, out: Path) -> list[tuple[float, float, str]]:
    """Concatenate real talking-head clips into one 512x512 video; returns the true timeline."""
    parts, truth, t = [], [], 0.0
    for i, (name, dur, person) in enumerate(SEGMENTS):
        part = out.parent / f"part{i}.mp4"
        _ffmpeg([
            "-i", str(data / name), "-t", str(dur),
            "-vf", "scale=512:512:force_original_aspect_ratio=decrease,pad=512:512:(ow-iw)/2:(oh-ih)/2,fps=25",
            "-af", "aresample=16000", "-ac", "1", "-c:v", "libx264", "-preset", "veryfast", "-c:a", "aac",
            str(part),
        ])
        parts.append(part)
        truth.append((t, t + dur, person))
        t += dur
    listing = out.parent / "parts.txt"
    listing.write_text("".join(f"file '{p}'\n" for p in parts))
    _ffmpeg(["-f", "concat", "-safe", "0", "-i", str(listing),
             "-c:v", "libx264", "-preset", "veryfast", "-c:a", "aac", str(out)])
    return truth


def _ffmpeg(args: list[str]) -> None:
    if shutil.which("ffmpeg") is None:
        raise M3memError("ffmpeg was not found on PATH; install ffmpeg (e.g. apt-get install ffmpeg)")
    r = subprocess.run(["ffmpeg", "-y", "-nostdin", "-loglevel", "error", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise InputError(f"ffmpeg failed joining the identity test video: {r.stderr.strip()[-400:]}")


def joined_video_identity(spec: str, data: Path, cfg: Config, progress: Progress = None) -> dict:
    """Ingest the joined video into a fresh store and score its face ids against the true people."""
    from m3mem.eval.metrics import identity_precision_recall, store_timeline
    from m3mem.memory import Memory

    # face ids do not depend on speech: leaving ASR out saves most of the ingest time
    run_cfg = cfg.replace(face_model=spec, speech_model="none")
    with tempfile.TemporaryDirectory(prefix="m3mem-eval-") as tmp:
        video = Path(tmp) / "media" / JOINED_NAME
        video.parent.mkdir()
        _step(progress, f"faces {spec}: joined video", 0, 1)
        truth = join_people(data, video)
        with Memory(Path(tmp) / "store", run_cfg) as mem:
            report = mem.ingest([video], progress=progress)
            if report.failed:
                raise M3memError(f"ingest of the joined identity video failed: {report.failed[0].error}")
            spans = store_timeline(mem.store, JOINED_NAME, kind="face", level="node")
        _step(progress, f"faces {spec}: joined video", 1, 1)
    duration = truth[-1][1]
    result = pairwise_identity(truth, spans, duration, IDENTITY_STEP_S, min_piece_s=1.0 / cfg.frame_fps)
    ident = identity_precision_recall(truth, spans, uem=(0.0, duration))
    return {**result, "precision": ident.precision, "recall": ident.recall, "purity": ident.purity,
            "coverage": ident.coverage, "truth": truth, "spans": spans}


def pairwise_identity(truth: Sequence[tuple[float, float, str]], spans: Sequence[tuple[float, float, str]],
                      duration_s: float, step_s: float, min_piece_s: float = 1.0) -> dict:
    """Pairwise precision and recall of "same id" against "same person" over sampled time points.

    Each predicted span is given the true person it overlaps most. A span that runs
    across a change of person is cut there, and each part of at least ``min_piece_s``
    (one frame step; shorter parts are the half-step margins a span adds around its
    samples) is labelled on its own, so an id that follows two people counts as one id
    on two persons. At every time point (``step_s`` apart) each span covering it gives
    one item (time, id, person); over all pairs of items, precision is the share of
    same-id pairs that are the same person, recall the share of same-person pairs
    that got the same id.
    """
    import numpy as np

    def person_of(a: float, b: float) -> str | None:
        overlap: dict[str, float] = {}
        for s, e, who in truth:
            overlap[who] = overlap.get(who, 0.0) + max(0.0, min(e, b) - max(s, a))
        who = max(overlap, key=overlap.get, default=None)
        return who if who is not None and overlap[who] > 0 else None

    labelled = []
    for a, b, fid in spans:
        majority = person_of(a, b)
        cuts = sorted({a, b} | {x for s, e, _ in truth for x in (s, e) if a < x < b})
        for x, y in zip(cuts, cuts[1:]):
            labelled.append((x, y, fid, person_of(x, y) if y - x >= min_piece_s else majority))
    times = np.arange(step_s / 2, duration_s, step_s)
    items: list[tuple[str, str]] = []
    covered = on_screen = 0
    for t in times:
        present = any(s <= t < e for s, e, _ in truth)
        on_screen += present
        here = [(fid, who) for a, b, fid, who in labelled if a <= t < b and who is not None]
        covered += bool(here) and present
        items += here
    same_id = same_person = both = 0
    for (ia, pa), (ib, pb) in itertools.combinations(items, 2):
        si, sp = ia == ib, pa == pb
        same_id += si
        same_person += sp
        both += si and sp
    ids_per_person: dict[str, set[str]] = {}
    persons_per_id: dict[str, set[str]] = {}
    for _, _, fid, who in labelled:
        if who is None:
            continue
        ids_per_person.setdefault(who, set()).add(fid)
        persons_per_id.setdefault(fid, set()).add(who)
    people = sorted({who for _, _, who in truth})
    return {
        "pairwise_precision": both / same_id if same_id else 0.0,
        "pairwise_recall": both / same_person if same_person else 0.0,
        "items": len(items), "time_points": on_screen,
        "time_covered": covered / on_screen if on_screen else 0.0,
        "people": people,
        # a person never given an id shows as an empty list
        "ids_per_person": {p: sorted(ids_per_person.get(p, ())) for p in people},
        "persons_per_id": {i: sorted(v) for i, v in sorted(persons_per_id.items())},
    }


# --- speech --------------------------------------------------------------------------------


def read_grid_transcripts(path: Path) -> list[tuple[str, str]]:
    """(file, transcript) rows of the GRID transcript table (tab-separated, with a header)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as e:
        raise InputError(f"{path}: no such file (the GRID transcripts of the test media)") from e
    rows = []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise InputError(f"{path} line {n}: expected file<TAB>transcript, got {line!r}")
        rows.append((parts[0].strip(), parts[1].strip()))
    return rows


def transcribe_file(model, path: Path) -> str:
    """The whole audio of a file (decoded as ingest decodes it) through one speech backend."""
    from pipelines.split import AudioTrack, probe

    track = AudioTrack.open(path, probe(path))
    if track is None:
        raise InputError(f"{path} has no audio stream")
    with track:
        audio = track.slice(0.0, track.duration_s)
    return " ".join(s.text.strip() for s in model.transcribe(audio, track.sr) if s.text.strip())


def evaluate_speech(spec: str, data: Path, cfg: Config, grid_clips: int | None = None,
                    progress: Progress = None) -> BackendTable:
    title = f"Speech: {spec}"
    why = _unavailable("speech", spec)
    if why:
        return BackendTable("speech", spec, title, not_measured=why)
    from models.registry import load_speech_model

    from m3mem.eval.metrics import normalize_text, read_transcript, word_error_rate

    try:
        model = load_speech_model(spec, cfg.device)
    except M3memError as e:
        return BackendTable("speech", spec, title, not_measured=str(e))
    rows: list[Row] = []
    raw: dict = {}
    grid = read_grid_transcripts(data / GRID_TRANSCRIPTS)
    if grid_clips is not None:
        grid = grid[:grid_clips]
    total = 1 + len(grid)

    _step(progress, f"speech {spec}", 0, total)
    t0 = time.monotonic()
    hyp = transcribe_file(model, data / JFK[0])
    asr_s = time.monotonic() - t0
    w = word_error_rate(read_transcript(data / JFK[1]), hyp)
    raw["jfk"] = {**w.to_json(), "hypothesis": hyp, "wall_s": asr_s}
    rows.append(Row(f"WER, {JFK[0]}", w.wer, f"{w.reference_words} words",
                    f"{w.substitutions} sub, {w.deletions} del, {w.insertions} ins; \"{normalize_text(hyp)}\""))

    refs, hyps, per_clip = [], [], {}
    for i, (name, text) in enumerate(grid, 1):
        h = transcribe_file(model, data / name)
        refs.append(text)
        hyps.append(h)
        per_clip[name] = {"reference": text, "hypothesis": normalize_text(h), "wer": word_error_rate(text, h).wer}
        _step(progress, f"speech {spec}", i, total)
    if grid:
        g = word_error_rate(refs, hyps)
        raw["grid"] = {**g.to_json(), "clips": per_clip}
        worst = max(per_clip.items(), key=lambda kv: kv[1]["wer"])
        rows.append(Row(f"WER, GRID ({len(grid)} clips)", g.wer, f"{g.reference_words} words",
                        f"{g.substitutions} sub, {g.deletions} del, {g.insertions} ins; e.g. "
                        f"\"{worst[1]['reference']}\" -> \"{worst[1]['hypothesis']}\""))
    return BackendTable("speech", spec, title, tuple(rows), raw)


# --- voices --------------------------------------------------------------------------------


def pipeline_diarization(models, path: Path, clip_s: float) -> tuple[list[tuple[float, float, str]], float, int, bool]:
    """Who spoke when, as m3mem's pipeline decides it within each clip.

    Speech segments with voice embeddings (``perceive_speech``), grouped within the clip
    by ``group_voices`` at the voice threshold; labels are ``<clip>:<group>``. Segments
    too short to embed get no voice in ingest, so they are not in the hypothesis.
    Returns the spans, the file's duration, the number of unembedded segments, and
    whether the speech backend diarized (and so embedded) the segments itself.
    """
    import numpy as np

    from m3mem.identity import group_voices
    from m3mem.records import l2_normalize
    from pipelines.perceive import perceive_speech
    from pipelines.split import AudioTrack, plan_clips, probe

    info = probe(path)
    track = AudioTrack.open(path, info)
    if track is None:
        raise InputError(f"{path} has no audio stream")
    spans: list[tuple[float, float, str]] = []
    unembedded = 0
    own_embeddings = False
    with track:
        for clip in plan_clips(info, path.stem, clip_s):
            segs = perceive_speech(models, clip, track)
            embedded = [s for s in segs if s.embedding is not None]
            unembedded += len(segs) - len(embedded)
            if not embedded:
                continue
            # a diarizing speech backend labels its segments and embeds them itself
            own_embeddings = own_embeddings or any(s.speaker is not None for s in embedded)
            emb = l2_normalize(np.stack([s.embedding for s in embedded]))
            groups = group_voices([(s.start_s, s.end_s) for s in embedded], emb, models.voice_threshold())
            for g, members in enumerate(groups):
                spans += [(embedded[m].start_s, embedded[m].end_s, f"{clip.index}:{g}") for m in members]
    return spans, info.duration_s, unembedded, own_embeddings


def evaluate_voice(voice_spec: str, speech_spec: str, data: Path, cfg: Config, parts: set[str],
                   der_files: Sequence[str] | None = None, progress: Progress = None) -> BackendTable:
    title = f"Voices: {voice_spec} (segments from {speech_spec})"
    why = _unavailable("voice", voice_spec) or _unavailable("speech", speech_spec)
    if why:
        return BackendTable("voice", voice_spec, title, not_measured=why)
    from pipelines.perceive import Models

    from m3mem.eval.metrics import diarization_error_rate, read_rttm

    run_cfg = cfg.replace(speech_model=speech_spec, voice_model=voice_spec)
    models = Models(run_cfg)
    try:
        threshold = models.voice_threshold()
        models.speech  # noqa: B018 -- load now, so that a missing model is reported as such
    except M3memError as e:
        return BackendTable("voice", voice_spec, title, not_measured=str(e))
    title = f"Voices: {voice_spec} (match threshold {threshold:g}; segments from {speech_spec})"
    rows: list[Row] = []
    raw: dict = {"threshold": threshold, "speech": speech_spec}

    if "der" in parts:
        files = [f for f in DER_FILES if der_files is None or f[0] in der_files]
        for i, (name, rttm) in enumerate(files):
            _step(progress, f"voices {voice_spec}: DER", i, len(files))
            spans, duration, unembedded, own = pipeline_diarization(models, data / name, run_cfg.clip_seconds)
            ref_all = read_rttm(data / rttm)
            (ref,) = ref_all.values()
            d = diarization_error_rate(ref, spans, uem=(0.0, duration))
            n_ref = len({s for _, _, s in ref})
            n_hyp = len({s for _, _, s in spans})
            raw.setdefault("der", {})[name] = {**d.to_json(), "hypothesis": spans, "unembedded_segments": unembedded,
                                               "embeddings_from_speech_backend": own}
            rows.append(Row(f"DER, {name}", d.der, f"{n_ref} speakers, {d.total_s:.1f} s of speech",
                            f"confusion {d.confusion_s:.1f} s, missed {d.missed_s:.1f} s, false alarm "
                            f"{d.false_alarm_s:.1f} s; {n_hyp} voice{'' if n_hyp == 1 else 's'} found"
                            + (f"; {unembedded} segments too short to embed" if unembedded else "")))
        _step(progress, f"voices {voice_spec}: DER", len(files), len(files))

    if "cross-file" in parts:
        result = cross_file_voices(run_cfg, data, progress)
        raw["cross_file"] = result
        same = [s for s, r in result["speakers"].items() if r["same"]]
        rows.append(Row("same voice id in both AMI files", f"{len(same)} of {len(result['speakers'])}",
                        f"{len(result['speakers'])} of {len(result['speakers'])}",
                        f"{result['voice_ids']} voice ids in the store"))
        for spk, r in result["speakers"].items():
            rows.append(Row(f"  {spk}", r["same"], "yes",
                            f"tst00: {', '.join(r['ids'][0]) or 'none'}; tst01: {', '.join(r['ids'][1]) or 'none'}"))
        shared = result["ids_on_different_speakers"]
        rows.append(Row("  ids given to different speakers in the two files", len(shared), "0",
                        "; ".join(f"{i}: {' in tst00, '.join(s)} in tst01" for i, s in shared.items())))
    return BackendTable("voice", voice_spec, title, tuple(rows), raw)


def cross_file_voices(cfg: Config, data: Path, progress: Progress = None) -> dict:
    """Ingest the two AMI files (the same four speakers) into one fresh store, one after the other.

    In each file, every voice id is mapped to the reference speaker it overlaps most;
    a speaker keeps its voice when an id mapped to them in the first file is mapped to
    them in the second too.
    """
    from m3mem.eval.metrics import read_rttm, store_timeline
    from m3mem.memory import Memory

    per_file: list[dict[str, list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="m3mem-eval-") as tmp, Memory(Path(tmp) / "store", cfg) as mem:
        for name, _ in CROSS_FILES:
            # one call per file: the order is the point (the second file must find the first's voices)
            report = mem.ingest([data / name], progress=progress)
            if report.failed:
                raise M3memError(f"ingest of {name} failed: {report.failed[0].error}")
        n_ids = len({n for (n,) in mem.store.execute("SELECT id FROM nodes WHERE kind='voice'").fetchall()})
        for name, rttm in CROSS_FILES:
            (ref,) = read_rttm(data / rttm).values()
            hyp = store_timeline(mem.store, name, kind="voice", level="node")
            per_file.append(map_ids_to_speakers(ref, hyp))
    speakers = sorted({s for m in per_file for s in m} | {s for _, r in CROSS_FILES for _, _, s in
                                                          next(iter(read_rttm(data / r).values()))})
    out = {}
    for spk in speakers:
        ids = [per_file[k].get(spk, []) for k in range(len(CROSS_FILES))]
        out[spk] = {"ids": ids, "same": bool(set(ids[0]) & set(ids[1]))}
    # the other failure: one voice id standing for one speaker in the first file, another in the second
    owner = [{i: spk for spk, ids in m.items() for i in ids} for m in per_file]
    crossed = {i: [owner[0][i], owner[1][i]] for i in sorted(set(owner[0]) & set(owner[1]))
               if owner[0][i] != owner[1][i]}
    return {"speakers": out, "voice_ids": n_ids, "ids_on_different_speakers": crossed}


def map_ids_to_speakers(reference: Sequence[tuple[float, float, str]],
                        hypothesis: Sequence[tuple[float, float, str]]) -> dict[str, list[str]]:
    """Reference speaker -> the hypothesis ids whose time overlaps that speaker most."""
    overlap: dict[str, dict[str, float]] = {}
    for a, b, hid in hypothesis:
        for s, e, spk in reference:
            o = min(b, e) - max(a, s)
            if o > 0:
                overlap.setdefault(hid, {}).setdefault(spk, 0.0)
                overlap[hid][spk] += o
    out: dict[str, list[str]] = {}
    for hid, by_spk in sorted(overlap.items()):
        out.setdefault(max(by_spk, key=by_spk.get), []).append(hid)
    return out


# --- command line ----------------------------------------------------------------------------


def add_arguments(p, common) -> None:
    """Options of ``m3mem eval perception`` run with no metric: the whole evaluation."""
    p.add_argument("--data", help="test media folder with MANIFEST.md and gt/ "
                                  "(default: $M3MEM_EVAL_DATA, else shared/data beside the repository)")
    p.add_argument("--face", dest="face_models", action="append", metavar="SPEC",
                   help="face backend to measure, e.g. dlib or insightface:/models/buffalo_l (repeatable; "
                        "default: the config's)")
    p.add_argument("--speech", dest="speech_models", action="append", metavar="SPEC",
                   help="speech backend, e.g. pocketsphinx or whisperx:/models/faster-whisper-small (repeatable)")
    p.add_argument("--voice", dest="voice_models", action="append", metavar="SPEC",
                   help="voice backend, e.g. resemblyzer (repeatable)")
    p.add_argument("--only", dest="parts", action="append", choices=PARTS,
                   help="measure only this part (repeatable; default: all)")
    p.add_argument("--grid-clips", type=int, metavar="N", help="only the first N GRID clips for WER")
    p.add_argument("--markdown", metavar="FILE", help="also write the tables as markdown to FILE")
    common(p, store=False)


def run_command(args, cfg: Config, progress: Progress = None) -> int:
    import json

    report = run_perception_eval(args.data, cfg, args.face_models, args.speech_models, args.voice_models,
                                 parts=args.parts, grid_clips=args.grid_clips, progress=progress)
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown(), encoding="utf-8")
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print(report.to_text())
    return 0
