"""The insightface backend's loading code, run on tiny ONNX models that the test builds.

The detector has det_10g's interface (one NCHW input of any size; 9 outputs: scores,
boxes and 5-point landmarks for strides 8, 16 and 32, two anchors per cell) and fires
where the red channel is bright, with a fixed 4-stride box and a face-shaped set of
landmarks, so that where a box must land is known. The embedder has w600k_r50's
interface (1x3x112x112 in, 512 out) with random weights.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("insightface", reason="insightface is not installed (pip install 'm3mem[face]')")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from m3mem.errors import ModelError  # noqa: E402

# insightface's alignment calls a scikit-image API that warns of its own deprecation
pytestmark = pytest.mark.filterwarnings("ignore:`estimate` is deprecated:FutureWarning")

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"

STRIDES = (8, 16, 32)
ANCHORS = 2
BOX_HALF_STRIDES = 2.0  # the detector's box is anchor +- 2 strides: 128 px at stride 32
# ArcFace's 5-point template on a 112 px crop, as offsets from the box centre in strides
ARCFACE_KPS = np.array([[38.29, 51.69], [73.53, 51.50], [56.02, 71.74], [41.55, 92.37], [70.73, 92.20]])
KPS_STRIDES = ((ARCFACE_KPS - 56.0) / 112.0 * 2 * BOX_HALF_STRIDES).reshape(-1)


def _const(name: str, arr: np.ndarray):
    return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


def build_detector(path: Path) -> None:
    nodes, inits, outputs = [], [], {"score": [], "bbox": [], "kps": []}
    for s in STRIDES:
        pooled = f"pool{s}"
        nodes.append(helper.make_node("AveragePool", ["input.1"], [pooled], kernel_shape=[s, s], strides=[s, s]))
        # score: sigmoid(10 * mean red) at stride 32; the finer strides never fire
        w = np.zeros((ANCHORS, 3, 1, 1))
        w[:, 0] = 10.0
        b = np.full(ANCHORS, 0.0 if s == 32 else -40.0)
        heads = {
            "score": (w, b, 1),
            "bbox": (np.zeros((ANCHORS * 4, 3, 1, 1)), np.full(ANCHORS * 4, BOX_HALF_STRIDES), 4),
            "kps": (np.zeros((ANCHORS * 10, 3, 1, 1)), np.tile(KPS_STRIDES, ANCHORS), 10),
        }
        for head, (hw, hb, width) in heads.items():
            inits += [_const(f"{head}{s}_w", hw), _const(f"{head}{s}_b", hb)]
            conv = f"{head}{s}_conv"
            nodes.append(helper.make_node("Conv", [pooled, f"{head}{s}_w", f"{head}{s}_b"], [conv]))
            if head == "score":
                nodes.append(helper.make_node("Sigmoid", [conv], [conv + "_sig"]))
                conv += "_sig"
            # NCHW -> NHWC then one row per (y, x, anchor), the order SCRFD decodes in
            nodes.append(helper.make_node("Transpose", [conv], [conv + "_t"], perm=[0, 2, 3, 1]))
            inits.append(numpy_helper.from_array(np.array([-1, width], dtype=np.int64), f"{head}{s}_shape"))
            out = f"{head}_{s}"
            nodes.append(helper.make_node("Reshape", [conv + "_t", f"{head}{s}_shape"], [out]))
            outputs[head].append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [f"n{s}", width]))
    graph = helper.make_graph(
        nodes, "tiny_scrfd",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, "height", "width"])],
        outputs["score"] + outputs["bbox"] + outputs["kps"], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build_embedder(path: Path, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3 * 14 * 14, 512)).astype(np.float32)
    nodes = [
        helper.make_node("AveragePool", ["input.1"], ["p"], kernel_shape=[8, 8], strides=[8, 8]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "w"], ["683"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_arcface",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["None", 3, 112, 112])],
        [helper.make_tensor_value_info("683", TensorProto.FLOAT, ["None", 512])],
        [_const("w", w)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return w


def make_pack(folder: Path) -> Path:
    folder.mkdir(parents=True)
    build_detector(folder / "det_10g.onnx")
    build_embedder(folder / "w600k_r50.onnx")
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from models.face_insightface import InsightFaceModel

    pack = make_pack(tmp_path_factory.mktemp("packs") / "buffalo_tiny")
    return InsightFaceModel(str(pack), device="cpu")


def red_square_frame(h=480, w=720, x0=300, y0=120, side=200) -> np.ndarray:
    frame = np.zeros((h, w, 3), dtype=np.uint8)
    frame[y0:y0 + side, x0:x0 + side, 0] = 255  # pure red in RGB
    return frame


def test_loads_a_pack_and_reports_its_interface(model):
    assert model.dim == 512
    assert model.providers == ["CPUExecutionProvider"]
    assert set(model._app.models) == {"detection", "recognition"}
    assert model.name == "insightface:buffalo_tiny"
    assert 0.3 <= model.match_threshold < 1.0


def test_detection_decodes_the_box_onto_the_face_in_frame_coordinates(model):
    x0, y0, side = 300, 120, 200
    obs = model.detect([red_square_frame(x0=x0, y0=y0, side=side)])
    assert len(obs) >= 1
    o = max(obs, key=lambda f: f.det_score)
    cx, cy = (o.bbox[0] + o.bbox[2]) / 2, (o.bbox[1] + o.bbox[3]) / 2
    assert x0 <= cx <= x0 + side and y0 <= cy <= y0 + side
    # 128 px in the 640x640 detector input; a 720 px wide frame is scaled by 640/720
    expected_px = 2 * BOX_HALF_STRIDES * 32 * 720 / 640
    assert abs((o.bbox[2] - o.bbox[0]) - expected_px) < 2.0
    assert abs((o.bbox[3] - o.bbox[1]) - expected_px) < 2.0
    assert o.det_score > 0.9 and o.frame == 0
    assert o.embedding.shape == (512,) and o.embedding.dtype == np.float32
    assert abs(float(np.linalg.norm(o.embedding)) - 1.0) < 1e-5


def test_frames_are_handed_to_insightface_in_bgr_order(model):
    # the detector fires on the red channel of what it sees after insightface's own
    # BGR->RGB swap, so a blue square must find nothing: a missing RGB->BGR step would
    # make red and blue trade places
    blue = red_square_frame()[:, :, ::-1].copy()
    assert model.detect([blue]) == []
    assert len(model.detect([red_square_frame()])) >= 1


def test_batch_keeps_frame_indices_and_finds_nothing_on_black(model):
    frames = [np.zeros((360, 640, 3), np.uint8), red_square_frame(), red_square_frame(x0=40, y0=40, side=160)]
    obs = model.detect(frames)
    assert {o.frame for o in obs} == {1, 2}
    for o in obs:
        h, w = frames[o.frame].shape[:2]
        assert 0 <= o.bbox[0] < o.bbox[2] <= w and 0 <= o.bbox[1] < o.bbox[3] <= h


def test_embedding_is_the_normalised_arcface_output_of_the_aligned_crop(model):
    from insightface.utils import face_align

    frame = red_square_frame()
    o = max(model.detect([frame]), key=lambda f: f.det_score)
    det = model._app.det_model
    bgr = np.ascontiguousarray(frame[:, :, ::-1])
    bboxes, kpss = det.detect(bgr, max_num=0)
    best = int(np.argmax(bboxes[:, 4]))
    rec = model._app.models["recognition"]
    raw = rec.get_feat(face_align.norm_crop(bgr, landmark=kpss[best], image_size=112)).ravel()
    assert abs(float(np.linalg.norm(raw)) - 1.0) > 0.1  # the model itself does not normalise
    np.testing.assert_allclose(o.embedding, raw / np.linalg.norm(raw), atol=1e-5)


def test_runs_on_a_real_photo():
    photo = DATA / "faces" / "fr_obama.jpg"
    if not photo.is_file():
        pytest.skip(f"real media not found at {photo}")
    from PIL import Image

    from models.face_insightface import InsightFaceModel

    frame = np.asarray(Image.open(photo).convert("RGB"))
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        m = InsightFaceModel(str(make_pack(Path(d) / "models" / "buffalo_l")), device="cpu")
        obs = m.detect([frame, frame])
    h, w = frame.shape[:2]
    assert obs, "the red-channel detector finds something on a colour photo"
    assert {o.frame for o in obs} == {0, 1}
    by_frame = [sorted(o.bbox for o in obs if o.frame == i) for i in (0, 1)]
    assert by_frame[0] == by_frame[1]  # same frame, same session: same result
    for o in obs:
        assert 0 <= o.bbox[0] < o.bbox[2] <= w and 0 <= o.bbox[1] < o.bbox[3] <= h
        assert 0.5 <= o.det_score <= 1.0
        assert o.embedding.shape == (512,) and abs(float(np.linalg.norm(o.embedding)) - 1.0) < 1e-5


def test_both_folder_layouts_and_a_doubly_unzipped_pack_load(tmp_path):
    from models.face_insightface import InsightFaceModel, find_pack

    canonical = make_pack(tmp_path / "root" / "models" / "antelopev2")
    plain = make_pack(tmp_path / "anywhere" / "faces-pack")
    nested = make_pack(tmp_path / "antelopev2" / "antelopev2")
    assert find_pack(str(tmp_path / "antelopev2")) == nested.resolve()
    for folder in (canonical, plain, tmp_path / "antelopev2"):
        m = InsightFaceModel(str(folder), device="cpu")
        assert len(m.detect([red_square_frame()])) >= 1


def test_missing_pack_says_what_to_download_and_where(tmp_path):
    from models.face_insightface import InsightFaceModel

    missing = tmp_path / "buffalo_l"
    with pytest.raises(ModelError) as e:
        InsightFaceModel(str(missing), device="cpu")
    msg = str(e.value)
    assert "buffalo_l.zip" in msg and "github.com/deepinsight/insightface/releases" in msg
    assert f"{missing}/det_10g.onnx" in msg and "w600k_r50.onnx" in msg


def test_pack_without_a_detector_or_embedder_is_a_model_error(tmp_path):
    from models.face_insightface import InsightFaceModel

    only_rec = tmp_path / "only_rec"
    only_rec.mkdir()
    build_embedder(only_rec / "w600k_r50.onnx")
    with pytest.raises(ModelError, match="no face detector"):
        InsightFaceModel(str(only_rec), device="cpu")
    only_det = tmp_path / "only_det"
    only_det.mkdir()
    build_detector(only_det / "det_10g.onnx")
    with pytest.raises(ModelError, match="no face recognition"):
        InsightFaceModel(str(only_det), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="holds no .onnx files"):
        InsightFaceModel(str(tmp_path / "empty"), device="cpu")


def test_cuda_falls_back_to_cpu_when_onnxruntime_has_no_cuda(tmp_path, monkeypatch):
    import onnxruntime

    from models.face_insightface import _providers

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert _providers("cuda") == ["CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert _providers("cuda") == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert _providers("cpu") == ["CPUExecutionProvider"]


def test_registry_builds_the_backend_from_a_config_string(tmp_path):
    from models import registry

    pack = make_pack(tmp_path / "buffalo_l")
    m = registry.load_face_model(f"insightface:{pack}", device="cpu")
    assert m.dim == 512 and len(m.detect([red_square_frame()])) >= 1
