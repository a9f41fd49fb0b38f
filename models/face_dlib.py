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

from m3mem.errors import ModelError
from m3mem.records import FaceObservation, l2_normalize
from models.calibration import DLIB_FACE

log = logging.getLogger(__name__)


def _model_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("face_recognition_models")
    return Path(list(spec.submodule_search_locations)[0]) / "models"


class DlibFaceModel:
    name = "dlib"
    dim = 128
    match_threshold = DLIB_FACE["match_threshold"]

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        import dlib

        folder = _model_dir(arg)
        shape = folder / "shape_predictor_5_face_landmarks.dat"
        resnet = folder / "dlib_face_recognition_resnet_model_v1.dat"
        for f in (shape, resnet):
            if not f.is_file():
                raise ModelError(
                    f"dlib face model file {f} is missing; install 'face_recognition_models' "
                    f"(pip install 'm3mem[offline]') or pass a folder holding {shape.name} and {resnet.name}"
                )
        self._detector = dlib.get_frontal_face_detector()
        self._shape = dlib.shape_predictor(str(shape))
        self._embed = dlib.face_recognition_model_v1(str(resnet))
        self._dlib = dlib

    def detect(self, frames: Sequence[np.ndarray]) -> list[FaceObservation]:
        out: list[FaceObservation] = []
        for i, frame in enumerate(frames):
            img = np.ascontiguousarray(frame, dtype=np.uint8)
            h, w = img.shape[:2]
            # HOG finds faces of 80 px and up; upsampling small frames finds 40 px faces
            upsample = 1 if min(h, w) < 400 else 0
            rects, scores, _ = self._detector.run(img, upsample, 0.0)
            if not rects:
                continue
            shapes = self._dlib.full_object_detections()
            for r in rects:
                shapes.append(self._shape(img, r))
            descriptors = self._embed.compute_face_descriptor(img, shapes)
            for r, s, d in zip(rects, scores, descriptors):
                box = (float(max(0, r.left())), float(max(0, r.top())), float(min(w, r.right())), float(min(h, r.bottom())))
                if box[2] <= box[0] or box[3] <= box[1]:
                    continue
                # HOG scores are margins around 0..3; squash to 0..1 so quality is comparable across backends
                det = float(1.0 / (1.0 + np.exp(-2.0 * s)))
                out.append(FaceObservation(frame=i, bbox=box, det_score=det, embedding=l2_normalize(np.asarray(d))))
        return out
