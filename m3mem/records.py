"""Records passed between stages: frozen dataclasses, units in names.

Arrays are float32 and L2-normalised wherever cosine similarity is meant.
Every record converts to and from plain JSON (``to_dict``/``from_dict``) so that
perception results can be cached per clip and cross process boundaries
(Ray, SQLite) without pickle.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np


def encode_vector(v: np.ndarray | None) -> str | None:
    if v is None:
        return None
    return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")


def decode_vector(s: str | None) -> np.ndarray | None:
    if s is None:
        return None
    return np.frombuffer(base64.b64decode(s), dtype="<f4").astype(np.float32)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


@dataclass(frozen=True)
class VideoInfo:
    """What ffprobe says about a media file."""

    path: str
    duration_s: float
    has_video: bool
    has_audio: bool
    fps: float = 0.0
    width: int = 0
    height: int = 0


@dataclass(frozen=True)
class Clip:
    """A time window of a video; splitting is logical, no file is cut."""

    video_id: str
    index: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict:
        return {"video_id": self.video_id, "index": self.index, "start_s": self.start_s, "end_s": self.end_s}

    @classmethod
    def from_dict(cls, d: dict) -> "Clip":
        return cls(str(d["video_id"]), int(d["index"]), float(d["start_s"]), float(d["end_s"]))


@dataclass(frozen=True, eq=False)
class FaceObservation:
    """One detected face in one frame.

    ``frame`` indexes the frames handed to ``FaceModel.detect``; the pipeline
    fills ``t_s`` (seconds from the start of the video).
    """

    frame: int
    bbox: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels
    det_score: float
    embedding: np.ndarray  # float32, L2-normalised
    t_s: float = 0.0

    @property
    def size_px(self) -> float:
        x0, y0, x1, y1 = self.bbox
        return float(min(x1 - x0, y1 - y0))


@dataclass(frozen=True, eq=False)
class FaceTrack:
    """The faces of one person within one clip (grouped by the perceive stage).

    ``times_s`` are the sample times at which the face was seen; two tracks
    that share a time were seen in one frame and are two people.
    """

    local_id: int
    times_s: tuple[float, ...]
    embedding: np.ndarray  # mean of members, L2-normalised
    quality: float
    det_score: float
    crop_jpeg: bytes | None = None

    def to_dict(self) -> dict:
        return {
            "local_id": self.local_id,
            "times_s": list(self.times_s),
            "embedding": encode_vector(self.embedding),
            "quality": self.quality,
            "det_score": self.det_score,
            "crop_jpeg": base64.b64encode(self.crop_jpeg).decode("ascii") if self.crop_jpeg else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "FaceTrack":
        crop = d.get("crop_jpeg")
        return cls(
            int(d["local_id"]),
            tuple(float(t) for t in d["times_s"]),
            decode_vector(d["embedding"]),
            float(d["quality"]),
            float(d["det_score"]),
            base64.b64decode(crop) if crop else None,
        )


@dataclass(frozen=True)
class Word:
    start_s: float
    end_s: float
    text: str
    score: float = 1.0


@dataclass(frozen=True, eq=False)
class SpeechSegment:
    """An utterance; times in seconds from the start of the audio handed to the model
    (the pipeline shifts them to video time).

    ``speaker`` is the ASR backend's own diarization label, if it has one;
    ``embedding`` is the voice embedding (float32, L2-normalised) when the
    segment is long enough to embed.
    """

    start_s: float
    end_s: float
    text: str
    speaker: str | None = None
    words: tuple[Word, ...] = ()
    embedding: np.ndarray | None = None

    def to_dict(self) -> dict:
        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "text": self.text,
            "speaker": self.speaker,
            "words": [[w.start_s, w.end_s, w.text, w.score] for w in self.words],
            "embedding": encode_vector(self.embedding),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "SpeechSegment":
        return cls(
            float(d["start_s"]),
            float(d["end_s"]),
            str(d["text"]),
            d.get("speaker"),
            tuple(Word(float(a), float(b), str(t), float(s)) for a, b, t, s in d.get("words", [])),
            decode_vector(d.get("embedding")),
        )


@dataclass(frozen=True, eq=False)
class ClipPerception:
    """Everything perceived in one clip: the cacheable output of the perceive stage."""

    clip: Clip
    faces: tuple[FaceTrack, ...] = ()
    speech: tuple[SpeechSegment, ...] = ()
    sample_times_s: tuple[float, ...] = ()  # times at which frames were sampled

    def to_dict(self) -> dict:
        return {
            "clip": self.clip.to_dict(),
            "faces": [f.to_dict() for f in self.faces],
            "speech": [s.to_dict() for s in self.speech],
            "sample_times_s": list(self.sample_times_s),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ClipPerception":
        return cls(
            Clip.from_dict(d["clip"]),
            tuple(FaceTrack.from_dict(f) for f in d.get("faces", [])),
            tuple(SpeechSegment.from_dict(s) for s in d.get("speech", [])),
            tuple(float(t) for t in d.get("sample_times_s", [])),
        )


@dataclass(frozen=True)
class ClipMemory:
    """What the memorization model wrote for one clip, ids already global (face_N, voice_N)."""

    episodic: tuple[str, ...] = ()
    semantic: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryNode:
    id: str
    kind: str  # episodic | semantic
    text: str
    clip_id: int | None = None
    weight: float = 1.0
    entities: tuple[str, ...] = field(default=())
