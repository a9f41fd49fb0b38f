"""Memorize one clip: episodic lines (what happened) and semantic lines (what is generally true).

``lite`` writes them deterministically from perception, with no language model:
who is visible when, who said what (quoted), and an equivalence between a face
and a voice when exactly one face is on screen while exactly one voice speaks.
Model-backed memorization (an MLLM through a chat backend) produces the same
``ClipMemory`` and is chosen by ``Config.memorize_model``.
"""
from __future__ import annotations

import logging

from m3mem.records import ClipMemory, ClipPerception

log = logging.getLogger(__name__)


def fmt_time(t_s: float) -> str:
    t = int(round(t_s))
    h, rem = divmod(t, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def spans(times: list[float], step_s: float) -> list[tuple[float, float]]:
    """Merge sample times into visible spans; a gap of more than 1.5 samples ends a span.

    A sample at time t stands for the half step around it.
    """
    out: list[list[float]] = []
    half = step_s / 2
    for t in sorted(times):
        if out and t - out[-1][1] <= 1.5 * step_s + 1e-6 - half:
            out[-1][1] = t + half
        else:
            out.append([t - half, t + half])
    return [(max(0.0, a), b) for a, b in out]


def face_spans(perception: ClipPerception, times_s: tuple[float, ...], step_s: float) -> list[tuple[float, float]]:
    c = perception.clip
    return [(max(c.start_s, a), min(c.end_s, b)) for a, b in spans(list(times_s), step_s)]


def memorize_lite(perception: ClipPerception, identity: dict, frame_step_s: float) -> ClipMemory:
    faces = {int(k): v for k, v in identity.get("faces", {}).items()}
    voices = {int(k): v for k, v in identity.get("voices", {}).items()}
    episodic: list[str] = []
    semantic: list[str] = []

    for track in perception.faces:
        fid = faces.get(track.local_id)
        if fid is None:
            continue
        parts = [f"{fmt_time(a)} to {fmt_time(b)}" for a, b in face_spans(perception, track.times_s, frame_step_s)]
        episodic.append(f"<{fid}> is visible from {', '.join(parts)}.")

    for i, seg in enumerate(perception.speech):
        who = f"<{voices[i]}>" if i in voices else "Someone"
        episodic.append(f'{who} says at {fmt_time(seg.start_s)}: "{seg.text}"')

    tracks = [t for t in perception.faces if t.local_id in faces]
    for i, a in enumerate(tracks):
        for b in tracks[i + 1:]:
            together = sorted(set(a.times_s) & set(b.times_s))
            if together:  # seen in one frame, not merely in one clip
                episodic.append(
                    f"<{faces[a.local_id]}> and <{faces[b.local_id]}> are seen together from "
                    f"{fmt_time(together[0] - frame_step_s / 2)} to {fmt_time(together[-1] + frame_step_s / 2)}."
                )

    for face_id, voice_id in sorted(equivalences(perception, faces, voices, frame_step_s)):
        semantic.append(f"Equivalence: <{face_id}>, <{voice_id}>")
    return ClipMemory(episodic=tuple(episodic), semantic=tuple(semantic))


def equivalences(perception: ClipPerception, faces: dict[int, str], voices: dict[int, str],
                 frame_step_s: float) -> set[tuple[str, str]]:
    """(face, voice) pairs: one voice speaks alone while one face is on screen for most of it."""
    out = set()
    for i, seg in enumerate(perception.speech):
        if i not in voices:
            continue
        overlapping = [
            j for j, other in enumerate(perception.speech)
            if j != i and min(seg.end_s, other.end_s) - max(seg.start_s, other.start_s) > 0
            and voices.get(j) != voices[i]
        ]
        if overlapping:
            continue
        samples = [t for t in perception.sample_times_s if seg.start_s - frame_step_s / 2 <= t <= seg.end_s + frame_step_s / 2]
        if not samples:
            continue
        visible = {}
        for track in perception.faces:
            seen = sum(1 for t in track.times_s if t in set(samples))
            if seen:
                visible[track.local_id] = seen
        if len(visible) != 1:
            continue
        (local_id, seen), = visible.items()
        if seen >= 0.5 * len(samples) and local_id in faces:
            out.add((faces[local_id], voices[i]))
    return out


def memorize_with_model(chat, perception: ClipPerception, identity: dict, frames, fps: float,
                        audio=None, sr: int = 16000, retries: int = 2) -> ClipMemory:
    """Ask a memorization model (M3-Agent's input layout) and validate its reply.

    A reply that is not valid JSON, or that names ids the clip did not introduce,
    is asked again up to ``retries`` times; then the clip fails with the reason,
    and ``m3mem ingest --retry-failed`` takes it again later.
    """
    import io

    import numpy as np
    from PIL import Image

    from m3mem.errors import ModelError
    from m3mem.parse import ParseError, parse_memory
    from m3mem.prompts import memorization, memorization_ids

    faces = {int(k): v for k, v in identity.get("faces", {}).items()}
    voices = {int(k): v for k, v in identity.get("voices", {}).items()}
    crops = {}
    for track in perception.faces:
        if track.local_id in faces and track.crop_jpeg:
            crops[faces[track.local_id]] = np.asarray(Image.open(io.BytesIO(track.crop_jpeg)).convert("RGB"))
    utterances: dict[str, list[dict]] = {}
    for i, seg in enumerate(perception.speech):
        if i in voices:
            utterances.setdefault(voices[i], []).append({"start_s": seg.start_s, "end_s": seg.end_s, "text": seg.text})
    clip = perception.clip
    messages = memorization(frames, fps, crops, utterances, clip.start_s, clip.end_s, audio=audio, sr=sr)
    known = memorization_ids(crops, utterances)
    problem: Exception | None = None
    for attempt in range(retries + 1):
        reply = chat.chat(messages)
        try:
            return parse_memory(reply, known)
        except ParseError as e:
            problem = e
            log.warning("clip %s@%.0fs: memorization reply unusable (try %d of %d): %s",
                        clip.video_id, clip.start_s, attempt + 1, retries + 1, e)
    raise ModelError(f"the memorization model gave no usable reply in {retries + 1} tries; last problem: {problem}")
