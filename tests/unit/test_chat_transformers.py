"""TransformersChatModel on tiny random-weight models that the tests build and save themselves."""
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from m3mem.errors import ConfigError, ModelError  # noqa: E402
from models.chat_transformers import TransformersChatModel, model_kind  # noqa: E402
from tests.helpers import tiny_models as tm  # noqa: E402

RNG = np.random.default_rng(0)


def image(h=60, w=80):
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def tone(seconds=2.0, sr=16000):
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def text_chat(text):
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each tiny model is built once per module; building is the slow part."""
    cache = {}

    def get(kind):
        if kind not in cache:
            folder = tmp_path_factory.mktemp(kind)
            cache[kind] = getattr(tm, f"save_tiny_{kind}")(folder)
        return cache[kind]

    return get


class Calls:
    """Counts forward calls of a submodule and the first dimension of its first input."""

    def __init__(self, module):
        self.inputs = []
        module.register_forward_hook(lambda mod, args, out: self.inputs.append(tuple(args[0].shape)))

    def __len__(self):
        return len(self.inputs)


# ---------------------------------------------------------------- errors and dispatch

def test_missing_folder_says_what_to_download_and_where(tmp_path):
    folder = tmp_path / "M3-Agent-Memorization"
    with pytest.raises(ModelError) as e:
        TransformersChatModel(str(folder), device="cpu")
    msg = str(e.value)
    assert str(folder) in msg and "does not exist" in msg
    for repo in ("ByteDance-Seed/M3-Agent-Memorization", "ByteDance-Seed/M3-Agent-Control", "Qwen/Qwen2.5-Omni-7B",
                 "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-8B"):
        assert repo in msg
    assert f"--local-dir {folder}" in msg


def test_folder_without_config_and_no_folder_at_all(tmp_path):
    with pytest.raises(ModelError, match="has no config.json"):
        TransformersChatModel(str(tmp_path), device="cpu")
    with pytest.raises(ModelError, match="needs a model folder"):
        TransformersChatModel(None, device="cpu")
    with pytest.raises(ConfigError, match="unknown option"):
        TransformersChatModel(f"{tmp_path}?frames=3", device="cpu")


@pytest.mark.parametrize("config, kind", [
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, "causal"),
    ({"model_type": "qwen2"}, "causal"),
    ({"model_type": "llama"}, "causal"),
    ({"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"]}, "qwen2_5_vl"),
    ({"model_type": "qwen2_5_omni_thinker"}, "qwen2_5_omni_thinker"),
    ({"architectures": ["Qwen2_5OmniThinkerForConditionalGeneration"]}, "qwen2_5_omni_thinker"),
    ({"model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniModel"]}, "qwen2_5_omni"),
])
def test_model_kind_dispatch(config, kind):
    assert model_kind(config) == kind


def test_unsupported_model_type_is_a_model_error():
    with pytest.raises(ModelError, match="does not load"):
        model_kind({"model_type": "vit", "architectures": ["ViTForImageClassification"]})


def test_unreadable_weights_are_a_model_error(folders, tmp_path):
    src = folders("causal")
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(ModelError, match="cannot load the causal model"):
        TransformersChatModel(str(tmp_path), device="cpu")


# ---------------------------------------------------------------- text-only causal LMs

@pytest.mark.parametrize("model_type", ["qwen3", "qwen2"])
def test_causal_lm_generates_and_batches_with_left_padding(tmp_path, model_type):
    folder = tm.save_tiny_causal(tmp_path / model_type, model_type=model_type)
    model = TransformersChatModel(str(folder), device="cpu")
    assert model.kind == "causal" and model.model.dtype == torch.float32
    assert type(model.model).__name__ == f"{model_type.capitalize()}ForCausalLM"
    convs = [text_chat("Hello world"), text_chat("the quick brown fox jumps over the lazy dog"), text_chat("Action")]
    single = [model.chat(c, max_new_tokens=6) for c in convs]
    assert all(isinstance(s, str) for s in single)
    # left padding: each reply in a batch equals the reply to that chat alone
    assert model.chat_batch(convs, max_new_tokens=6) == single
    assert model.tokenizer.padding_side == "left"


def test_causal_lm_generates_the_requested_number_of_tokens(folders):
    model = TransformersChatModel(str(folders("causal")), device="cpu")
    seen = []
    original = model.model.generate

    def spy(**kw):
        out = original(**kw)
        seen.append(out.shape[1] - kw["input_ids"].shape[1])
        return out

    model.model.generate = spy
    model.chat(text_chat("Hello"), max_new_tokens=5)
    model.chat(text_chat("Hello"), max_tokens=3)
    # a random model may stop at its end token; it never writes past the limit
    assert 1 <= seen[0] <= 5 and 1 <= seen[1] <= 3


def test_causal_lm_drops_media_and_renders_thinking_switch(folders):
    model = TransformersChatModel(str(folders("causal")), device="cpu")
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image", "image": image()}]}]
    prep = model.prepare(msg)
    assert prep.messages == [{"role": "user", "content": "what is this?"}] and prep.images == []
    assert isinstance(model.chat(msg, max_new_tokens=2), str)
    assert model._template(prep.messages, enable_thinking=False).endswith("<think>\n\n</think>\n\n")
    assert "<think>" not in model._template(prep.messages, enable_thinking=None)


def test_sampling_with_temperature_runs(folders):
    model = TransformersChatModel(str(folders("causal")), device="cpu")
    torch.manual_seed(1)
    assert isinstance(model.chat(text_chat("Hello"), max_new_tokens=4, temperature=0.8, top_p=0.9), str)


def test_registry_loads_transformers_backend(folders):
    from models.registry import load_chat_model

    model = load_chat_model(f"transformers:{folders('causal')}", device="cpu")
    assert isinstance(model, TransformersChatModel)


# ---------------------------------------------------------------- Qwen2.5-VL

def test_qwen2_5_vl_sees_images(folders):
    model = TransformersChatModel(str(folders("qwen2_5_vl")), device="cpu")
    assert model.kind == "qwen2_5_vl"
    assert type(model.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    calls = Calls(model.model.model.visual)
    assert isinstance(model.chat(text_chat("Hello world"), max_new_tokens=3), str)
    assert len(calls) == 0
    msg = [{"role": "user", "content": [{"type": "text", "text": "<face_1>:"}, {"type": "image", "image": image()},
                                        {"type": "audio", "audio": tone(), "sr": 16000}]}]
    assert isinstance(model.chat(msg, max_new_tokens=3), str)
    assert len(calls) == 1 and calls.inputs[0][0] > 0  # patches of one image went through the vision tower
    assert model.prepare(msg).audios == []  # Qwen2.5-VL does not hear: audio dropped


def test_qwen2_5_vl_video_frames(folders):
    model = TransformersChatModel(f"{folders('qwen2_5_vl')}?max_frames=3", device="cpu")
    calls = Calls(model.model.model.visual)
    frames = [image() for _ in range(8)]
    msg = [{"role": "user", "content": [{"type": "video", "frames": frames, "fps": 1.0},
                                        {"type": "text", "text": "What happens?"}]}]
    prep = model.prepare(msg)
    if model.native_video:
        assert len(prep.videos) == 1 and prep.videos[0].shape[0] == 3
    else:
        # without torchvision: the three sampled frames go as images, labelled with their times
        assert len(prep.images) == 3
        texts = [p["text"] for p in prep.messages[0]["content"] if p["type"] == "text"]
        assert texts[:3] == ["[frame at 0.0 s]", "[frame at 4.0 s]", "[frame at 7.0 s]"]
    assert isinstance(model.chat(msg, max_new_tokens=3), str)
    assert len(calls) == 1


def test_qwen2_5_vl_batch_mixes_text_and_images(folders):
    model = TransformersChatModel(str(folders("qwen2_5_vl")), device="cpu")
    img = image()
    convs = [text_chat("Hello world"),
             [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "describe"}]}],
             text_chat("the quick brown fox jumps over the lazy dog")]
    single = [model.chat(c, max_new_tokens=4) for c in convs]
    assert model.chat_batch(convs, max_new_tokens=4) == single


# ---------------------------------------------------------------- Qwen2.5-Omni

def test_qwen2_5_omni_thinker_hears_video_audio_and_sees_frames(folders):
    model = TransformersChatModel(f"{folders('qwen2_5_omni_thinker')}?max_frames=4", device="cpu")
    assert model.kind == "qwen2_5_omni_thinker"
    assert type(model.model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    vision = Calls(model.model.model.visual)
    audio = Calls(model.model.model.audio_tower)
    assert isinstance(model.chat(text_chat("Hello world"), max_new_tokens=3), str)
    assert (len(vision), len(audio)) == (0, 0)

    frames = [image() for _ in range(6)]
    msg = [{"role": "user", "content": [
        {"type": "text", "text": "The clip:"},
        {"type": "video", "frames": frames, "fps": 2.0},
        {"type": "audio", "audio": tone(3.0, 8000), "sr": 8000},
        {"type": "text", "text": "<face_1>:"}, {"type": "image", "image": image(40, 40)},
        {"type": "text", "text": "Write the memory."}]}]
    prep = model.prepare(msg)
    assert len(prep.audios) == 1 and prep.audios[0].shape == (48000,)  # resampled to 16 kHz
    if model.native_video:
        assert prep.audio_video == [0] and len(prep.videos) == 1  # the soundtrack of the video
    else:
        assert prep.audio_video == [None] and len(prep.images) == 4 + 1
    assert isinstance(model.chat(msg, max_new_tokens=3), str)
    assert len(vision) == 1 and len(audio) == 1


def test_qwen2_5_omni_thinker_batch(folders):
    model = TransformersChatModel(str(folders("qwen2_5_omni_thinker")), device="cpu")
    convs = [text_chat("Hello world"),
             [{"role": "user", "content": [{"type": "audio", "audio": tone(1.0), "sr": 16000},
                                           {"type": "text", "text": "what was said?"}]}],
             [{"role": "user", "content": [{"type": "image", "image": image()}, {"type": "text", "text": "who?"}]}]]
    single = [model.chat(c, max_new_tokens=4) for c in convs]
    assert model.chat_batch(convs, max_new_tokens=4) == single


def test_full_qwen2_5_omni_checkpoint_loads_only_the_thinker(folders):
    folder = folders("qwen2_5_omni")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2_5_omni"
    model = TransformersChatModel(str(folder), device="cpu")
    assert model.kind == "qwen2_5_omni"
    assert type(model.model).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    msg = [{"role": "user", "content": [{"type": "audio", "audio": tone(1.0), "sr": 16000},
                                        {"type": "text", "text": "what was said?"}]}]
    audio = Calls(model.model.model.audio_tower)
    assert isinstance(model.chat(msg, max_new_tokens=3), str)
    assert len(audio) == 1


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_cuda_loads_bfloat16(folders):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = TransformersChatModel(str(folders("causal")), device="cuda")
    assert model.model.dtype == torch.bfloat16 and model.model.device.type == "cuda"
    assert isinstance(model.chat(text_chat("Hello"), max_new_tokens=3), str)
