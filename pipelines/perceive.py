"""Perceive one clip: faces (detect, embed, score, group into tracks), speech, voices.

Pure with respect to the store: takes a clip and the decoders, returns a
``ClipPerception`` that the ingest stage caches and hands to identity.
"""
from __future__ import annotations

import io
import logging
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from m3mem.config import Config
from m3mem.identity import group_faces
from m3mem.records import Clip, ClipPerception, FaceObservation, FaceTrack, SpeechSegment, Word, l2_normalize

log = logging.getLogger(__name__)


def face_quality(obs: FaceObservation) -> float:
    """Detector confidence scaled by size: small faces embed poorly."""
    return float(max(obs.det_score, 0.0) * min(1.0, obs.size_px / 112.0))


def crop_jpeg(frame: np.ndarray, bbox: tuple[float, float, float, float], max_side_px: int = 112) -> bytes:
    h, w = frame.shape[:2]
    x0, y0, x1, y1 = bbox
    mx, my = 0.2 * (x1 - x0), 0.2 * (y1 - y0)
    box = (int(max(0, x0 - mx)), int(max(0, y0 - my)), int(min(w, x1 + mx)), int(min(h, y1 + my)))
    img = Image.fromarray(frame).crop(box)
    img.thumbnail((max_side_px, max_side_px))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


@dataclass
class Models:
    """The perception models of one process (or Ray actor), loaded on first use."""

    config: Config
    _face: object = None
    _speech: object = None
    _voice: object = None

    @property
    def face(self):
        if self._face is None:
            from models.registry import load_face_model

            self._face = load_face_model(self.config.face_model, self.config.device)
        return self._face

    @property
    def speech(self):
        if self._speech is None:
            from models.registry import load_speech_model

            self._speech = load_speech_model(self.config.speech_model, self.config.device)
        return self._speech

    @property
    def voice(self):
        if self._voice is None:
            from models.registry import load_voice_model

            self._voice = load_voice_model(self.config.voice_model, self.config.device)
        return self._voice

    def face_threshold(self) -> float:
        return self.config.face_threshold if self.config.face_threshold is not None else self.face.match_threshold

    def voice_threshold(self) -> float:
        return self.config.voice_threshold if self.config.voice_threshold is not None else self.voice.match_threshold


def perceive_faces(models: Models, clip: Clip, frames_reader) -> tuple[tuple[FaceTrack, ...], tuple[float, ...]]:
    cfg = models.config
    times = frames_reader.sample_times(clip, cfg.frame_fps)
    if not times:
        return (), ()
    frames = frames_reader.frames_at(times, max_side_px=cfg.max_frame_side_px)
    observations = [
        replace(o, t_s=times[o.frame])
        for o in models.face.detect(list(frames))
        if o.size_px >= cfg.min_face_px
    ]
    if not observations:
        return (), tuple(times)
    emb = l2_normalize(np.stack([o.embedding for o in observations]))
    # within one clip, lighting and pose change little: the same-person threshold
    # of the backend is safe for grouping
    groups = group_faces([o.t_s for o in observations], emb, models.face_threshold())
    tracks = []
    for local_id, members in enumerate(groups):
        obs = [observations[i] for i in members]
        qualities = [face_quality(o) for o in obs]
        best = obs[int(np.argmax(qualities))]
        # quality-weighted mean: blurred or tiny faces pull the track's embedding less
        weights = np.asarray(qualities, dtype=np.float32) + 1e-3
        centroid = l2_normalize((emb[members] * weights[:, None]).sum(axis=0))
        tracks.append(
            FaceTrack(
                local_id=local_id,
                times_s=tuple(sorted(o.t_s for o in obs)),
                embedding=centroid,
                quality=float(max(qualities)),
                det_score=float(best.det_score),
                crop_jpeg=crop_jpeg(frames[best.frame], best.bbox),
            )
        )
    return tuple(tracks), tuple(times)


def perceive_speech(models: Models, clip: Clip, audio_track) -> tuple[SpeechSegment, ...]:
    audio = audio_track.slice(clip.start_s, clip.end_s)
    if audio.size < audio_track.sr // 4:
        return ()
    segments = models.speech.transcribe(audio, audio_track.sr)
    out = []
    for seg in segments:
        text = seg.text.strip()
        if not text:
            continue
        a = int(max(0.0, seg.start_s) * audio_track.sr)
        b = int(min(len(audio) / audio_track.sr, seg.end_s) * audio_track.sr)
        embedding = None
        if seg.embedding is not None:
            embedding = l2_normalize(seg.embedding)
        elif (b - a) / audio_track.sr >= models.voice.min_duration_s:
            embedding = models.voice.embed(audio[a:b], audio_track.sr)
        out.append(
            SpeechSegment(
                start_s=clip.start_s + seg.start_s,
                end_s=clip.start_s + seg.end_s,
                text=text,
                speaker=seg.speaker,
                words=tuple(Word(clip.start_s + w.start_s, clip.start_s + w.end_s, w.text, w.score) for w in seg.words),
                embedding=embedding,
            )
        )
    return tuple(out)


def perceive_clip(models: Models, clip: Clip, frames_reader, audio_track) -> ClipPerception:
    """Faces when the file has video, speech and voices when it has audio."""
    faces, times = perceive_faces(models, clip, frames_reader) if frames_reader is not None else ((), ())
    speech = perceive_speech(models, clip, audio_track) if audio_track is not None else ()
    return ClipPerception(clip=clip, faces=faces, speech=speech, sample_times_s=times)
