"""Perception metrics, the ground-truth formats they read, and what m3mem perceived.

The metrics are the maintained libraries' own: word error rate from jiwer,
diarization error rate, purity, coverage and identification precision and recall
from pyannote.metrics, ROC curves from scikit-learn. This module only converts
m3mem's records and the usual file formats (RTTM, STM, pair lists, timelines) to
their inputs, so a number here means what it means in the papers that use them.

A timeline is a list of ``Span = (start_s, end_s, label)``.
"""
from __future__ import annotations

import csv
import logging
import math
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from m3mem.errors import InputError, M3memError

log = logging.getLogger(__name__)

Span = tuple[float, float, str]


def _need(module: str, extra: str = "eval"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise M3memError(
            f"this metric needs {module.split('.')[0]}, which is not installed; pip install 'm3mem[{extra}]'"
        ) from e


# --- word error rate ------------------------------------------------------------------


_PUNCT = re.compile(r"[^\w\s']|(?<!\w)'|'(?!\w)")


def normalize_text(text: str) -> str:
    """Lower case, punctuation removed (apostrophes inside words kept), whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower().replace("’", "'")
    text = _PUNCT.sub(" ", text.replace("_", " "))
    return " ".join(text.split())


@dataclass(frozen=True)
class WerResult:
    wer: float
    substitutions: int
    deletions: int
    insertions: int
    hits: int
    reference_words: int

    def to_json(self) -> dict:
        return asdict(self)


def word_error_rate(reference: str | Sequence[str], hypothesis: str | Sequence[str],
                    normalize: bool = True) -> WerResult:
    """WER of hypothesis against reference (one text each, or parallel lists of texts).

    Texts are normalised first (``normalize_text``) unless ``normalize`` is False:
    WER on raw text counts "Country," and "country" as a substitution.
    """
    jiwer = _need("jiwer")
    refs = [reference] if isinstance(reference, str) else list(reference)
    hyps = [hypothesis] if isinstance(hypothesis, str) else list(hypothesis)
    if len(refs) != len(hyps):
        raise InputError(f"WER needs as many hypotheses as references, got {len(hyps)} and {len(refs)}")
    if normalize:
        refs = [normalize_text(r) for r in refs]
        hyps = [normalize_text(h) for h in hyps]
    # jiwer refuses an empty reference; an empty reference has no words to get wrong
    pairs = [(r, h) for r, h in zip(refs, hyps) if r.strip()]
    insertions_only = sum(len(h.split()) for r, h in zip(refs, hyps) if not r.strip())
    if not pairs:
        raise InputError("the reference transcript is empty; WER is undefined")
    out = jiwer.process_words([r for r, _ in pairs], [h if h.strip() else "" for _, h in pairs])
    n_ref = out.hits + out.substitutions + out.deletions
    ins = out.insertions + insertions_only
    return WerResult(
        wer=(out.substitutions + out.deletions + ins) / n_ref,
        substitutions=out.substitutions, deletions=out.deletions, insertions=ins, hits=out.hits,
        reference_words=n_ref,
    )


# --- diarization and identity -------------------------------------------------------


def _annotation(spans: Iterable[Span], uri: str = "file"):
    core = _need("pyannote.core")
    ann = core.Annotation(uri=uri)
    for i, (a, b, label) in enumerate(spans):
        a, b = float(a), float(b)
        if not (math.isfinite(a) and math.isfinite(b)):
            raise InputError(f"a span has a non-finite time: ({a}, {b}, {label!r})")
        if b > a:
            ann[core.Segment(a, b), i] = str(label)
    return ann


def _uem(reference, hypothesis, uem: tuple[float, float] | None):
    core = _need("pyannote.core")
    if uem is not None:
        return core.Timeline([core.Segment(float(uem[0]), float(uem[1]))])
    # the union of both extents: pyannote's own default, stated so it does not warn each call
    extent = (reference.get_timeline() | hypothesis.get_timeline()).extent()
    return core.Timeline([extent]) if extent.duration > 0 else None


@dataclass(frozen=True)
class DerResult:
    der: float
    confusion_s: float
    missed_s: float
    false_alarm_s: float
    total_s: float  # speech in the reference
    collar_s: float
    skip_overlap: bool
    mapping: dict = field(default_factory=dict)  # hypothesis label -> reference label

    def to_json(self) -> dict:
        return asdict(self)


def diarization_error_rate(reference: Sequence[Span], hypothesis: Sequence[Span], collar_s: float = 0.0,
                           skip_overlap: bool = False, uem: tuple[float, float] | None = None) -> DerResult:
    """DER = (missed + false alarm + confusion) / reference speech, labels mapped optimally.

    ``collar_s`` is the total width forgiven around each reference boundary (NIST's
    0.25 s means 0.125 s either side, as in pyannote.metrics).
    """
    diar = _need("pyannote.metrics.diarization")
    ref, hyp = _annotation(reference), _annotation(hypothesis)
    if not ref:
        raise InputError("the reference has no speech; DER is undefined")
    metric = diar.DiarizationErrorRate(collar=collar_s, skip_overlap=skip_overlap)
    detail = metric(ref, hyp, detailed=True, uem=_uem(ref, hyp, uem))
    mapping = {str(k): str(v) for k, v in metric.optimal_mapping(ref, hyp).items()} if hyp else {}
    return DerResult(
        der=float(detail["diarization error rate"]), confusion_s=float(detail["confusion"]),
        missed_s=float(detail["missed detection"]), false_alarm_s=float(detail["false alarm"]),
        total_s=float(detail["total"]), collar_s=collar_s, skip_overlap=skip_overlap, mapping=mapping,
    )


@dataclass(frozen=True)
class IdentityResult:
    """How well predicted ids follow true people over time.

    ``precision``/``recall``: the share of predicted/true time labelled with the right
    person after mapping ids to people one-to-one (each person keeps the id that
    covers most of their time). ``purity``: the share of each id's time spent on its
    main person (low when one id merges people). ``coverage``: the share of each
    person's time under their main id (low when a person is split across ids).
    """

    precision: float
    recall: float
    purity: float
    coverage: float
    people: int
    ids: int
    mapping: dict  # predicted id -> person (one-to-one)
    splits: dict  # person -> the ids whose time is mostly theirs, when more than one
    merges: dict  # id -> the people whose time it mostly covers, when more than one

    def to_json(self) -> dict:
        return asdict(self)


def identity_precision_recall(truth: Sequence[Span], predicted: Sequence[Span],
                              uem: tuple[float, float] | None = None) -> IdentityResult:
    """Identity precision and recall of a predicted timeline against the true one.

    Time where neither says anyone is present does not count; time where only one
    does counts against precision (only predicted) or recall (only true).
    """
    diar = _need("pyannote.metrics.diarization")
    ident = _need("pyannote.metrics.identification")
    ref, hyp = _annotation(truth), _annotation(predicted)
    if not ref:
        raise InputError("the truth timeline is empty; identity recall is undefined")
    u = _uem(ref, hyp, uem)
    mapping = {str(k): str(v) for k, v in diar.DiarizationErrorRate().optimal_mapping(ref, hyp).items()} if hyp else {}
    # unmapped ids must not collide with a person's name by chance
    mapped = hyp.rename_labels(mapping={h: mapping.get(str(h), f"\0unmapped:{h}") for h in hyp.labels()})
    precision = ident.IdentificationPrecision()(ref, mapped, uem=u) if hyp else 0.0
    recall = ident.IdentificationRecall()(ref, mapped, uem=u) if hyp else 0.0
    purity = diar.DiarizationPurity()(ref, hyp, uem=u) if hyp else 0.0
    coverage = diar.DiarizationCoverage()(ref, hyp, uem=u) if hyp else 0.0
    # splits and merges a person can read: an id belongs to the person it spends most time
    # on, a person to the id that covers most of their time (purity and coverage, by name)
    splits: dict[str, list[str]] = {}
    merges: dict[str, list[str]] = {}
    if hyp:
        people, ids = [str(l) for l in ref.labels()], [str(l) for l in hyp.labels()]
        together = ref * hyp  # seconds each person and each id co-occur
        for j, h in enumerate(ids):
            if together[:, j].max() > 0:
                splits.setdefault(people[int(together[:, j].argmax())], []).append(h)
        for i, person in enumerate(people):
            if together[i].max() > 0:
                merges.setdefault(ids[int(together[i].argmax())], []).append(person)
    n_people, n_ids = len(ref.labels()), len(hyp.labels())
    return IdentityResult(
        precision=float(precision), recall=float(recall), purity=float(purity), coverage=float(coverage),
        people=n_people, ids=n_ids, mapping=mapping,
        splits={p: sorted(v) for p, v in sorted(splits.items()) if len(v) > 1},
        merges={h: sorted(v) for h, v in sorted(merges.items()) if len(v) > 1},
    )


# --- face verification --------------------------------------------------------------


@dataclass(frozen=True)
class VerificationResult:
    pairs: int
    same: int
    different: int
    threshold: float | None
    accuracy: float | None  # at ``threshold``
    true_accept_rate: float | None
    false_accept_rate: float | None
    auc: float | None  # None when the pairs hold only one class
    eer: float | None
    eer_threshold: float | None
    best_threshold: float
    best_accuracy: float

    def to_json(self) -> dict:
        return asdict(self)


def face_verification(scores: Sequence[float], same: Sequence[bool], threshold: float | None = None) -> VerificationResult:
    """Verification of scored pairs: ``score >= threshold`` predicts the same person.

    Reports accuracy, true and false accept rates at ``threshold`` (when given), ROC
    AUC and the equal error rate, and the best accuracy any threshold reaches (an
    optimistic number: that threshold is chosen on the same pairs).
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(same, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise InputError(f"face verification needs one label per score, got {s.shape} scores and {y.shape} labels")
    if len(s) == 0:
        raise InputError("face verification needs at least one pair")
    if not np.all(np.isfinite(s)):
        raise InputError("a pair has a non-finite score")
    n_same, n_diff = int(y.sum()), int((~y).sum())
    acc = tar = far = None
    if threshold is not None:
        pred = s >= threshold
        acc = float((pred == y).mean())
        tar = float(pred[y].mean()) if n_same else None
        far = float(pred[~y].mean()) if n_diff else None
    # best accuracy: thresholds at every score and just above the highest
    cands = np.unique(np.concatenate([s, [np.nextafter(s.max(), np.inf)]]))
    accs = [(float(((s >= t) == y).mean()), float(t)) for t in cands]
    best_acc, best_t = max(accs, key=lambda x: (x[0], -x[1]))
    auc = eer = eer_t = None
    if n_same and n_diff:
        skm = _need("sklearn.metrics")
        auc = float(skm.roc_auc_score(y, s))
        fpr, tpr, thr = skm.roc_curve(y, s)
        fnr = 1.0 - tpr
        i = int(np.argmin(np.abs(fnr - fpr)))
        eer = float((fpr[i] + fnr[i]) / 2)
        eer_t = float(min(thr[i], s.max())) if math.isfinite(thr[i]) else float(s.max())
    return VerificationResult(
        pairs=len(s), same=n_same, different=n_diff, threshold=threshold, accuracy=acc,
        true_accept_rate=tar, false_accept_rate=far, auc=auc, eer=eer, eer_threshold=eer_t,
        best_threshold=best_t, best_accuracy=best_acc,
    )


# --- ground-truth files ---------------------------------------------------------------


def _open_text(path: str | Path) -> list[str]:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as e:
        raise InputError(f"{p}: no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read it as UTF-8 text ({e})") from e


def read_rttm(path: str | Path) -> dict[str, list[Span]]:
    """``SPEAKER file channel onset duration <NA> <NA> speaker <NA> <NA>`` lines, by file id."""
    out: dict[str, list[Span]] = {}
    for n, line in enumerate(_open_text(path), 1):
        parts = line.split()
        if not parts or parts[0].startswith(";") or parts[0] != "SPEAKER":
            continue
        if len(parts) < 8:
            raise InputError(f"{path} line {n}: an RTTM SPEAKER line needs 8 or more fields, got {len(parts)}")
        try:
            onset, dur = float(parts[3]), float(parts[4])
        except ValueError as e:
            raise InputError(f"{path} line {n}: onset and duration must be numbers ({line.strip()!r})") from e
        out.setdefault(parts[1], []).append((onset, onset + dur, parts[7]))
    if not out:
        raise InputError(f"{path} holds no RTTM SPEAKER lines")
    return out


def write_rttm(path: str | Path, file_id: str, spans: Iterable[Span]) -> None:
    lines = [
        f"SPEAKER {file_id} 1 {a:.3f} {b - a:.3f} <NA> <NA> {label} <NA> <NA>\n"
        for a, b, label in sorted(spans) if b > a
    ]
    Path(path).write_text("".join(lines), encoding="utf-8")


def read_stm(path: str | Path) -> dict[str, list[tuple[float, float, str, str]]]:
    """``file channel speaker start end [<label>] text`` lines: (start, end, speaker, text) by file id."""
    out: dict[str, list[tuple[float, float, str, str]]] = {}
    for n, line in enumerate(_open_text(path), 1):
        if not line.strip() or line.startswith(";;"):
            continue
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            raise InputError(f"{path} line {n}: an STM line needs file, channel, speaker, start, end and text")
        try:
            a, b = float(parts[3]), float(parts[4])
        except ValueError as e:
            raise InputError(f"{path} line {n}: start and end must be numbers ({line.strip()!r})") from e
        text = parts[5] if len(parts) > 5 else ""
        if text.startswith("<") and ">" in text:
            text = text.split(">", 1)[1]
        out.setdefault(parts[0], []).append((a, b, parts[2], text.strip()))
    for segs in out.values():
        segs.sort()
    return out


def read_transcript(path: str | Path) -> str:
    """A reference transcript: plain text, or an STM file (its texts in time order)."""
    p = Path(path)
    if p.suffix.lower() == ".stm":
        return " ".join(t for segs in read_stm(p).values() for _, _, _, t in segs)
    return " ".join(_open_text(p))


_YES = {"yes", "y", "true", "1", "same"}
_NO = {"no", "n", "false", "0", "different"}


def read_pairs(path: str | Path) -> list[tuple[str, str, bool]]:
    """A face pair list: CSV with a header, two file columns and a same-person column.

    Columns are found by name (``file_x``/``file_y`` or ``img1``/``img2``, and
    ``same_person``/``same``/``label``), else taken in that order.
    """
    lines = _open_text(path)
    rows = list(csv.reader(lines))
    if len(rows) < 2:
        raise InputError(f"{path}: a pair list needs a header and at least one pair")
    header = [h.strip().lower() for h in rows[0]]

    def col(names: tuple[str, ...], default: int) -> int:
        for name in names:
            if name in header:
                return header.index(name)
        return default

    ix = col(("file_x", "img1", "image1", "file1", "a"), 0)
    iy = col(("file_y", "img2", "image2", "file2", "b"), 1)
    il = col(("same_person", "same", "label", "is_same", "decision"), 2)
    out = []
    for n, row in enumerate(rows[1:], 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) <= max(ix, iy, il):
            raise InputError(f"{path} line {n}: expected at least {max(ix, iy, il) + 1} columns, got {len(row)}")
        label = row[il].strip().lower()
        if label not in _YES | _NO:
            raise InputError(f"{path} line {n}: same-person value {row[il]!r} is not one of yes/no/true/false/1/0")
        out.append((row[ix].strip(), row[iy].strip(), label in _YES))
    return out


def read_timeline(path: str | Path) -> list[Span]:
    """A truth timeline: an RTTM file, or a CSV with ``start,end,label`` columns (header optional)."""
    p = Path(path)
    if p.suffix.lower() == ".rttm":
        return [s for spans in read_rttm(p).values() for s in spans]
    rows = [r for r in csv.reader(_open_text(p)) if r and "".join(r).strip()]
    if not rows:
        raise InputError(f"{p} is empty; a timeline needs start,end,label rows")
    header = [h.strip().lower() for h in rows[0]]
    body = rows
    ia, ib, il = 0, 1, 2
    if not _is_number(rows[0][0]):
        body = rows[1:]
        ia = _index(header, ("start", "start_s", "begin"), 0)
        ib = _index(header, ("end", "end_s", "stop"), 1)
        il = _index(header, ("label", "person", "speaker", "identity", "who"), 2)
    out = []
    for n, row in enumerate(body, 2 if body is not rows else 1):
        try:
            out.append((float(row[ia]), float(row[ib]), row[il].strip()))
        except (ValueError, IndexError) as e:
            raise InputError(f"{p} row {n}: expected start,end,label, got {row}") from e
    return out


def _index(header: list[str], names: tuple[str, ...], default: int) -> int:
    return next((header.index(n) for n in names if n in header), default)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# --- what m3mem perceived, as hypotheses ---------------------------------------------


def store_video(store, video: str | None):
    """The store's video row named ``video`` (file name, path or id); the only one when None."""
    videos = store.videos()
    if video is None:
        if len(videos) == 1:
            return videos[0]
        names = ", ".join(v.name for v in videos[:10]) or "none"
        raise InputError(f"store {store.root} holds {len(videos)} videos ({names}); say which one with --video")
    for v in videos:
        if video in (v.name, v.path, str(v.id), Path(v.path).stem):
            return v
    raise InputError(f"store {store.root} has no video named {video!r}; videos: "
                     + (", ".join(v.name for v in videos[:10]) or "none"))


def store_timeline(store, video: str | None, kind: str = "face", level: str = "person") -> list[Span]:
    """When each face (or voice) was perceived in one video, labelled by person or by node.

    ``level="person"`` labels spans with the character a face or voice belongs to (its
    name when it has one), which is what a reader of ``m3mem people`` sees;
    ``level="node"`` keeps the raw ``face_N``/``voice_N`` ids.
    """
    if kind not in ("face", "voice"):
        raise InputError(f"timeline kind must be 'face' or 'voice', not {kind!r}")
    if level not in ("person", "node"):
        raise InputError(f"timeline level must be 'person' or 'node', not {level!r}")
    row = store_video(store, video)
    spans = store.execute(
        "SELECT a.node_id, a.start_s, a.end_s FROM appearances a JOIN clips c ON c.id = a.clip_id"
        " WHERE c.video_id=? AND a.kind=? ORDER BY a.start_s", (row.id, kind),
    ).fetchall()
    label = {}
    if level == "person":
        from m3mem.retrieval import character_map

        label = character_map(store)
    return [(float(a), float(b), label.get(n, n)) for n, a, b in spans]


def store_transcript(store, video: str | None) -> str:
    """Everything the speech model heard in one video, in time order."""
    row = store_video(store, video)
    segs = []
    for clip in store.clips(row.id):
        perception = store.perception(clip.id)
        if perception is not None:
            segs.extend((s.start_s, s.text) for s in perception.speech)
    return " ".join(t for _, t in sorted(segs, key=lambda x: x[0]) if t.strip())


def score_face_pairs(face_model, pairs: Sequence[tuple[str, str, bool]], root: str | Path = ".",
                     max_side_px: int = 960) -> tuple[list[float], list[bool], list[str]]:
    """Cosine similarity of the largest face of each image of each pair.

    Returns scores, labels and the images in which no face was found; a pair with
    such an image scores -1 (predicted different), so a detector that misses faces
    pays for it in the metrics.
    """
    from PIL import Image, UnidentifiedImageError

    root = Path(root)
    cache: dict[str, np.ndarray | None] = {}

    def embed(name: str) -> np.ndarray | None:
        if name in cache:
            return cache[name]
        path = root / name
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                if max(im.size) > max_side_px:
                    im.thumbnail((max_side_px, max_side_px), Image.Resampling.BILINEAR)
                frame = np.asarray(im)
        except FileNotFoundError as e:
            raise InputError(f"{path}: no such image (pair list paths are relative to --root {root})") from e
        except (UnidentifiedImageError, OSError) as e:
            raise InputError(f"{path}: not a readable image ({e})") from e
        faces = face_model.detect([frame])
        best = max(faces, key=lambda f: f.size_px, default=None)
        cache[name] = None if best is None else best.embedding
        return cache[name]

    scores, labels = [], []
    for a, b, same in pairs:
        ea, eb = embed(a), embed(b)
        scores.append(-1.0 if ea is None or eb is None else float(np.dot(ea, eb)))
        labels.append(bool(same))
    missed = sorted(n for n, e in cache.items() if e is None)
    return scores, labels, missed

