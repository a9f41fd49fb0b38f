"""Faces offline: dlib's HOG detector, 5-point alignment and 128-d ResNet embedder.

The weights ship inside the PyPI package ``face_recognition_models``. Its
``__init__`` imports ``pkg_resources`` (gone from setuptools 81), so the model
files are located by path instead of importing it.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from m3mem.errors import InputError, ModelError
from m3mem.records import FaceObservation, l2_normalize
from models.calibration import DLIB_FACE

log = logging.getLogger(__name__)

SHAPE_FILE = "shape_predictor_5_face_landmarks.dat"
RESNET_FILE = "dlib_face_recognition_resnet_model_v1.dat"


def model_folder(arg: str | None) -> Path:
    """The folder holding dlib's model files: ``arg``, or the one inside face_recognition_models."""
    if arg:
        return Path(arg).expanduser()
    # find_spec locates the package without running its __init__ (which needs pkg_resources)
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'face_recognition_models'")
    return Path(list(spec.submodule_search_locations)[0]) / "models"


class DlibFaceModel:
    name = "dlib"
    dim = 128
    match_threshold = DLIB_FACE["match_threshold"]
    # HOG finds faces of about 80 px and up; frames whose smaller side is below this are
    # upsampled 2x first so that 40 px faces are found (GRID's 360x288, 720p downscaled to
    # 960x540). Upsampling costs about 4x the time per frame, so large frames skip it.
    upsample_below_px = 600

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        import dlib

        folder = model_folder(arg)
        missing = [f for f in (SHAPE_FILE, RESNET_FILE) if not (folder / f).is_file()]
        if missing:
            raise ModelError(
                f"dlib face model folder {folder} lacks {', '.join(missing)}; install the package "
                f"face_recognition_models (pip install 'm3mem[offline]'), or pass face_model='dlib:/folder' "
                f"with a folder holding {SHAPE_FILE} and {RESNET_FILE} (from dlib.net/files, unpacked)"
            )
        # dlib runs on the CPU here (the dlib-bin wheel has no CUDA); device is accepted for the interface
        self._dlib = dlib
        self._detector = dlib.get_frontal_face_detector()
        self._shape = dlib.shape_predictor(str(folder / SHAPE_FILE))
        self._embedder = dlib.face_recognition_model_v1(str(folder / RESNET_FILE))

    def detect(self, frames: Sequence[np.ndarray]) -> list[FaceObservation]:
        out: list[FaceObservation] = []
        for i, frame in enumerate(frames):
            img = np.ascontiguousarray(frame, dtype=np.uint8)
            if img.ndim != 3 or img.shape[2] != 3:
                raise InputError(f"frame {i} must be RGB (H, W, 3) uint8, got shape {img.shape}")
            out.extend(self._detect_one(i, img))
        return out

    def _detect_one(self, index: int, img: np.ndarray) -> list[FaceObservation]:
        h, w = img.shape[:2]
        upsample = 1 if min(h, w) < self.upsample_below_px else 0
        rects, scores, _ = self._detector.run(img, upsample, 0.0)
        if not rects:
            return []
        shapes = self._dlib.full_object_detections()
        for r in rects:
            shapes.append(self._shape(img, r))
        descriptors = self._embedder.compute_face_descriptor(img, shapes)
        out = []
        for r, score, d in zip(rects, scores, descriptors):
            # dlib's boxes may extend past the image for faces at its border
            box = (float(max(0, r.left())), float(max(0, r.top())),
                   float(min(w, r.right() + 1)), float(min(h, r.bottom() + 1)))
            if box[2] <= box[0] or box[3] <= box[1]:
                continue
            out.append(FaceObservation(
                frame=index,
                bbox=box,
                det_score=detection_score(score),
                embedding=l2_normalize(np.asarray(d, dtype=np.float32)),
            ))
        return out


def detection_score(hog_margin: float) -> float:
    """HOG's SVM margin (0 at dlib's own threshold, about 3 for a clear frontal face)
    squashed to 0..1, so face quality is on the same scale as other backends' scores."""
    return float(1.0 / (1.0 + np.exp(-2.0 * hog_margin)))
