"""Faces in production: insightface's SCRFD detector and ArcFace embedder from a model pack.

``insightface:/models/buffalo_l`` (SCRFD-10G + ArcFace R50 trained on WebFace600K) or
a folder holding the antelopev2 pack (SCRFD-10G + ArcFace R100 on Glint360K). Both give
512-d embeddings. Weights are never downloaded here: insightface would fetch a pack
into ``~/.insightface`` on its own when a folder is missing, and a model that appears
from the network mid-run is not what a user configured.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from m3mem.errors import ModelError
from m3mem.records import FaceObservation, l2_normalize

log = logging.getLogger(__name__)

# Cosine similarity of normed ArcFace embeddings; at or above means the same person.
INSIGHTFACE_FACE = {
    "match_threshold": 0.45,
    "measured_on": "not yet measured here: no pack weights were available offline. "
                   "Re-measure on shared/data (gt/deepface_pairs.csv and the GRID/talking-head "
                   "tracks, as for dlib in models/calibration.py) once a pack is present",
    "why": "published 1:1 verification thresholds for ArcFace R50/R100 lie at cosine 0.28-0.40 "
           "(deepface uses distance 0.68, i.e. similarity 0.32; insightface's IJB-C operating "
           "points at FAR 1e-4 sit near 0.3-0.36). m3mem matches clip tracks against every face "
           "node in an archive, so many comparisons are made per face and a false merge corrupts "
           "every later answer; 0.45 sits above the 1:1 range on purpose, trading some recall "
           "(a person split in two) for precision",
}

DOWNLOAD_HINT = (
    "download buffalo_l (https://github.com/deepinsight/insightface/releases, buffalo_l.zip, "
    "from the 'model-zoo' release), unzip it to {folder} so that {folder}/det_10g.onnx and "
    "{folder}/w600k_r50.onnx exist (antelopev2.zip works the same way: scrfd_10g_bnkps.onnx "
    "and glintr100.onnx), then pass 'insightface:{folder}'"
)

DEFAULT_FOLDER = "~/.insightface/models/buffalo_l"


def find_pack(arg: str | None) -> Path:
    """The folder that holds the pack's ``*.onnx`` files.

    Accepts the pack folder itself, and the folder one level up when a zip was unpacked
    into a folder of the same name (antelopev2.zip unpacks to antelopev2/antelopev2/).
    """
    folder = Path(arg or DEFAULT_FOLDER).expanduser()
    if not folder.is_dir():
        raise ModelError(f"insightface model pack folder {folder} does not exist; "
                         + DOWNLOAD_HINT.format(folder=folder))
    if any(folder.glob("*.onnx")):
        return folder.resolve()
    nested = [d for d in folder.iterdir() if d.is_dir() and any(d.glob("*.onnx"))]
    if len(nested) == 1:
        return nested[0].resolve()
    raise ModelError(f"insightface model pack folder {folder} holds no .onnx files; "
                     + DOWNLOAD_HINT.format(folder=folder))


def _providers(device: str) -> list[str]:
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" in available:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning("device %s asked for, but onnxruntime has no CUDAExecutionProvider "
                    "(install onnxruntime-gpu instead of onnxruntime); running insightface on CPU", device)
    return ["CPUExecutionProvider"]


class InsightFaceModel:
    name = "insightface"
    dim = 512
    match_threshold = INSIGHTFACE_FACE["match_threshold"]

    def __init__(self, arg: str | None = None, device: str = "cpu", det_size: tuple[int, int] = (640, 640)):
        from insightface.app import FaceAnalysis

        folder = find_pack(arg)
        providers = _providers(device)
        # FaceAnalysis looks for root/models/<name> and downloads it when absent. An absolute
        # folder as the name covers both layouts (<root>/models/<pack> and any other folder)
        # in insightface 0.7 (os.path.join drops root before an absolute name) and 2.x (a name
        # that is a directory is used as is), and the folder exists, so nothing is downloaded.
        try:
            app = FaceAnalysis(name=str(folder), root=str(folder.parent),
                               allowed_modules=["detection", "recognition"], providers=providers)
        except AssertionError as e:
            # FaceAnalysis asserts that a detection model was found among the .onnx files
            raise ModelError(f"no face detector among the .onnx files in {folder} ({e}); "
                             + DOWNLOAD_HINT.format(folder=folder)) from e
        if "recognition" not in app.models:
            raise ModelError(f"no face recognition (ArcFace) model among the .onnx files in {folder}; "
                             + DOWNLOAD_HINT.format(folder=folder))
        ctx_id = 0 if providers[0] == "CUDAExecutionProvider" else -1
        app.prepare(ctx_id=ctx_id, det_size=tuple(det_size))
        self._app = app
        self.folder = folder
        self.providers = providers
        self.name = f"insightface:{folder.name}"
        log.info("insightface pack %s loaded (%s)", folder, providers[0])

    def detect(self, frames: Sequence[np.ndarray]) -> list[FaceObservation]:
        out: list[FaceObservation] = []
        # insightface runs one image per call; the loop reuses the loaded sessions.
        for i, frame in enumerate(frames):
            if frame.ndim != 3 or frame.shape[2] != 3:
                raise ValueError(f"frame {i} has shape {frame.shape}; expected (H, W, 3) RGB uint8")
            h, w = frame.shape[:2]
            # insightface takes OpenCV's BGR order (it swaps to RGB inside its blob step)
            bgr = np.ascontiguousarray(frame[:, :, ::-1], dtype=np.uint8)
            for face in self._app.get(bgr):
                x0, y0, x1, y1 = (float(v) for v in face.bbox[:4])
                box = (max(0.0, x0), max(0.0, y0), min(float(w), x1), min(float(h), y1))
                if box[2] <= box[0] or box[3] <= box[1] or face.embedding is None:
                    continue
                out.append(FaceObservation(frame=i, bbox=box, det_score=float(face.det_score),
                                           embedding=l2_normalize(face.normed_embedding)))
        return out
