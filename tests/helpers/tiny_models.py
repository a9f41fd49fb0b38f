"""Tiny random-weight transformers models, built offline and saved like real checkpoints.

Each ``save_*`` writes a folder with config.json, safetensors weights, a byte-level BPE
tokenizer trained on a few sentences, a Qwen-style chat template and, for the
multimodal models, the image processor and audio feature extractor with default
settings (plus the video processor when torchvision is installed). The folders load
with ``from_pretrained(..., local_files_only=True)`` exactly as downloaded ones do.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

CORPUS = [
    "Action: [Search] Content: What is the name of <character_1>?",
    "Action: [Answer] Content: Alice puts the keys in the drawer.",
    '{"episodic": ["<face_1> opens the door."], "semantic": ["Equivalence: <face_1>, <voice_1>"]}',
    "The quick brown fox jumps over the lazy dog. Hello world, frame at 1.0 s.",
]

BASE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
VL_SPECIAL = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
OMNI_SPECIAL = ["<|IMAGE|>", "<|AUDIO|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>",
                "<|audio_bos|>", "<|audio_eos|>"]
OMNI_TOKEN_ATTRS = {
    "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
}

# Qwen-style ChatML; media placeholders as Qwen2.5-VL and Qwen2.5-Omni write them.
_CONTENT = (
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}"
    "{% elif p['type'] == 'image' %}IMAGE_PLACEHOLDER"
    "{% elif p['type'] == 'video' %}VIDEO_PLACEHOLDER"
    "{% elif p['type'] == 'audio' %}AUDIO_PLACEHOLDER"
    "{% endif %}{% endfor %}{% endif %}"
)
_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n" + _CONTENT + "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
TEXT_TEMPLATE = (_TEMPLATE.replace("IMAGE_PLACEHOLDER", "").replace("VIDEO_PLACEHOLDER", "")
                 .replace("AUDIO_PLACEHOLDER", ""))
VL_TEMPLATE = (_TEMPLATE.replace("IMAGE_PLACEHOLDER", "<|vision_start|><|image_pad|><|vision_end|>")
               .replace("VIDEO_PLACEHOLDER", "<|vision_start|><|video_pad|><|vision_end|>")
               .replace("AUDIO_PLACEHOLDER", ""))
OMNI_TEMPLATE = (_TEMPLATE.replace("IMAGE_PLACEHOLDER", "<|vision_bos|><|IMAGE|><|vision_eos|>")
                 .replace("VIDEO_PLACEHOLDER", "<|vision_bos|><|VIDEO|><|vision_eos|>")
                 .replace("AUDIO_PLACEHOLDER", "<|audio_bos|><|AUDIO|><|audio_eos|>"))


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def build_tokenizer(special: list[str], template: str, token_attrs: dict | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    kwargs = {"extra_special_tokens": token_attrs} if token_attrs else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=template, **kwargs)


def _text_config(tokenizer, **extra) -> dict:
    cfg = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
               eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
               pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), bos_token_id=None)
    cfg.update(extra)
    return cfg


def _vision_config() -> dict:
    return dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0], window_size=112)


def _image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # default Qwen settings, with a small pixel budget so the tiny model sees few patches
    return Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})


def _video_processor():
    from transformers import Qwen2VLVideoProcessor

    return Qwen2VLVideoProcessor(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})


def _fix_processor_class(folder: Path, name: str) -> None:
    """Name the real processor class in the saved files, as downloaded checkpoints do."""
    for fname in ("processor_config.json", "tokenizer_config.json", "preprocessor_config.json"):
        path = folder / fname
        if path.is_file():
            data = json.loads(path.read_text())
            data["processor_class"] = name
            path.write_text(json.dumps(data, indent=2))


def save_tiny_causal(folder: Path, model_type: str = "qwen3", seed: int = 0) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = build_tokenizer(BASE_SPECIAL, TEXT_TEMPLATE)
    extra = {"head_dim": 8} if model_type == "qwen3" else {}
    config = AutoConfig.for_model(model_type, **_text_config(tok, **extra))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)


def save_tiny_qwen2_5_vl(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    folder = Path(folder)
    tok = build_tokenizer(BASE_SPECIAL + VL_SPECIAL, VL_TEMPLATE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VL_SPECIAL}
    config = Qwen2_5_VLConfig(
        text_config=_text_config(tok, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                       "mrope_section": [1, 1, 2]}),
        vision_config=_vision_config(),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(folder)
    if has_torchvision():
        from transformers import Qwen2_5_VLProcessor

        proc = Qwen2_5_VLProcessor(image_processor=_image_processor(), tokenizer=tok,
                                   video_processor=_video_processor(), chat_template=VL_TEMPLATE)
    else:
        from models.chat_transformers import _processor_subclasses

        proc = _processor_subclasses()[0](image_processor=_image_processor(), tokenizer=tok, chat_template=VL_TEMPLATE)
    proc.save_pretrained(folder)
    _fix_processor_class(folder, "Qwen2_5_VLProcessor")
    return folder


def _omni_thinker_config(tok):
    from transformers import Qwen2_5OmniThinkerConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in OMNI_SPECIAL}
    return Qwen2_5OmniThinkerConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=32, n_window=100, max_source_positions=1500),
        vision_config=_vision_config(),
        text_config=_text_config(tok, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                       "mrope_section": [1, 1, 2]}),
        audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"], video_token_index=ids["<|VIDEO|>"],
        audio_start_token_id=ids["<|audio_bos|>"], audio_end_token_id=ids["<|audio_eos|>"],
        vision_start_token_id=ids["<|vision_bos|>"], vision_end_token_id=ids["<|vision_eos|>"],
    )


def _save_omni_processor(folder: Path, tok) -> None:
    from transformers import WhisperFeatureExtractor

    feature_extractor = WhisperFeatureExtractor(feature_size=128)  # Qwen2.5-Omni's 128 mel bins
    if has_torchvision():
        from transformers import Qwen2_5OmniProcessor

        proc = Qwen2_5OmniProcessor(image_processor=_image_processor(), video_processor=_video_processor(),
                                    feature_extractor=feature_extractor, tokenizer=tok, chat_template=OMNI_TEMPLATE)
    else:
        from models.chat_transformers import _processor_subclasses

        proc = _processor_subclasses()[1](image_processor=_image_processor(), feature_extractor=feature_extractor,
                                          tokenizer=tok, chat_template=OMNI_TEMPLATE)
    proc.save_pretrained(folder)
    _fix_processor_class(folder, "Qwen2_5OmniProcessor")


def save_tiny_qwen2_5_omni_thinker(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    folder = Path(folder)
    tok = build_tokenizer(BASE_SPECIAL + OMNI_SPECIAL, OMNI_TEMPLATE, OMNI_TOKEN_ATTRS)
    torch.manual_seed(seed)
    Qwen2_5OmniThinkerForConditionalGeneration(_omni_thinker_config(tok)).save_pretrained(folder)
    _save_omni_processor(folder, tok)
    return folder


def save_tiny_qwen2_5_omni(folder: Path, seed: int = 0) -> Path:
    """A full Omni checkpoint (model_type qwen2_5_omni); only its thinker has weights here."""
    import torch
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    folder = Path(folder)
    tok = build_tokenizer(BASE_SPECIAL + OMNI_SPECIAL, OMNI_TEMPLATE, OMNI_TOKEN_ATTRS)
    config = Qwen2_5OmniConfig(thinker_config=_omni_thinker_config(tok).to_dict(), enable_audio_output=False)
    torch.manual_seed(seed)
    Qwen2_5OmniForConditionalGeneration(config).save_pretrained(folder)
    # the loader reads the speaker table that real Omni checkpoints ship
    torch.save({}, folder / "spk_dict.pt")
    _save_omni_processor(folder, tok)
    return folder
