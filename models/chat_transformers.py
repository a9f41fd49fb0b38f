"""Chat with a local Hugging Face transformers model folder (no download, ever).

    transformers:/models/M3-Agent-Memorization       Qwen2.5-Omni thinker: video, its audio, images
    transformers:/models/Qwen2.5-Omni-7B             full Omni checkpoint; only the thinker is loaded
    transformers:/models/Qwen2.5-VL-7B-Instruct      images and video frames
    transformers:/models/M3-Agent-Control            Qwen3 (any causal LM): text only
    transformers:/models/Qwen3-8B?max_frames=32&device_map=auto

The class is chosen from the folder's ``config.json`` (``model_type``, ``architectures``):
``qwen2_5_omni_thinker`` -> ``Qwen2_5OmniThinkerForConditionalGeneration`` with
``Qwen2_5OmniProcessor``; ``qwen2_5_omni`` -> ``Qwen2_5OmniForConditionalGeneration``
without its talker; ``qwen2_5_vl`` -> ``Qwen2_5_VLForConditionalGeneration`` with
``Qwen2_5_VLProcessor``; any other type that ``AutoModelForCausalLM`` knows -> causal LM
with the tokenizer's chat template. GPU in bfloat16 when ``device`` is CUDA, else CPU
in float32.

Video: with torchvision installed, a ``video`` part goes to the processor as a video
(temporal patches, time-aware positions) and an ``audio`` part right after it is that
video's soundtrack for Omni (``use_audio_in_video``), as M3-Agent feeds its clips.
Without torchvision (transformers' video processors need it), video frames go as
separate images, each labelled with its time, and the audio as a standalone part.
Parts a model cannot take (images for a text-only LM, audio for Qwen2.5-VL) are
dropped with a debug log.

Query options: ``max_frames`` (frames per video part, default 16), ``frame_max_px``
(longest side of a video frame, default 448), ``device_map`` (for example
``auto`` to spread a large model over several GPUs).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import logging
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from m3mem.errors import ConfigError, ModelError
from models.media import as_rgb_uint8, parts_of, resample, sample_frames

log = logging.getLogger(__name__)

AUDIO_SR = 16000

DOWNLOAD_HINT = """Download the weights into a folder first (this machine never downloads them), for example:
    huggingface-cli download ByteDance-Seed/M3-Agent-Memorization --local-dir {folder}   # memorization (Qwen2.5-Omni thinker)
    huggingface-cli download ByteDance-Seed/M3-Agent-Control --local-dir {folder}        # control (Qwen3)
or a base model: Qwen/Qwen2.5-Omni-7B, Qwen/Qwen2.5-VL-7B-Instruct, Qwen/Qwen3-8B.
Then point m3mem at the folder: memorize_model = "transformers:{folder}" or control_model = "transformers:{folder}"
(M3MEM_MEMORIZE_MODEL / M3MEM_CONTROL_MODEL, or the same keys in the config file)."""

KINDS = ("causal", "qwen2_5_vl", "qwen2_5_omni_thinker", "qwen2_5_omni")


def _parse_arg(arg: str | None) -> tuple[Path, dict[str, str]]:
    if not arg:
        raise ModelError("the transformers backend needs a model folder: 'transformers:/path/to/model'.\n"
                         + DOWNLOAD_HINT.format(folder="/models/NAME"))
    path, _, query = arg.partition("?")
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    unknown = set(options) - {"max_frames", "frame_max_px", "device_map"}
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(sorted(unknown))} in 'transformers:{arg}'; "
                          f"options: max_frames, frame_max_px, device_map")
    return Path(path).expanduser(), options


def model_kind(config: dict) -> str:
    """Which loader a ``config.json`` needs; see the module doc."""
    model_type = str(config.get("model_type", ""))
    archs = [str(a) for a in config.get("architectures") or []]
    if model_type == "qwen2_5_omni_thinker" or "Qwen2_5OmniThinkerForConditionalGeneration" in archs:
        return "qwen2_5_omni_thinker"
    if model_type == "qwen2_5_omni" or any(a in ("Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration")
                                           for a in archs):
        return "qwen2_5_omni"
    if model_type == "qwen2_5_vl" or "Qwen2_5_VLForConditionalGeneration" in archs:
        return "qwen2_5_vl"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or any(a.endswith("ForCausalLM") for a in archs):
        return "causal"
    raise ModelError(
        f"config.json has model_type {model_type!r} (architectures {archs}), which this backend does not load; "
        f"it loads Qwen2.5-Omni, Qwen2.5-VL and any causal language model (Qwen2, Qwen3, Llama, ...)")


@functools.lru_cache(maxsize=1)
def _processor_subclasses():
    """Qwen processors without a video processor, for machines without torchvision.

    transformers' Qwen video processors import torchvision, and its processors refuse
    to be built without every sub-processor. These subclasses declare only the parts
    they have; videos then reach the model as images.
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2_5OmniProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen2_5_VLImageProcessorOnly(Qwen2_5_VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    class Qwen2_5OmniImageAudioProcessor(Qwen2_5OmniProcessor):
        def __init__(self, image_processor=None, feature_extractor=None, tokenizer=None, chat_template=None):
            for attr in ("image_token", "audio_token", "video_token", "image_token_id", "audio_token_id",
                         "video_token_id", "vision_bos_token", "vision_eos_token", "audio_bos_token",
                         "audio_eos_token"):
                setattr(self, attr, getattr(tokenizer, attr))
            ProcessorMixin.__init__(self, image_processor, feature_extractor, tokenizer, chat_template=chat_template)

    return Qwen2_5_VLImageProcessorOnly, Qwen2_5OmniImageAudioProcessor


def _chat_template(folder: Path, tokenizer) -> str | None:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.chat_template
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    js = folder / "chat_template.json"
    if js.is_file():
        return json.loads(js.read_text()).get("chat_template")
    return None


@dataclass
class _Prepared:
    """One conversation turned into template messages plus the media they refer to."""

    messages: list[dict]
    images: list[np.ndarray] = field(default_factory=list)
    videos: list[np.ndarray] = field(default_factory=list)  # (T, H, W, 3) each
    video_fps: list[float] = field(default_factory=list)
    audios: list[np.ndarray] = field(default_factory=list)  # 16 kHz, in order of appearance
    audio_video: list[int | None] = field(default_factory=list)  # per audio: index into videos, or None

    @property
    def paired(self) -> bool:
        return any(i is not None for i in self.audio_video)


class TransformersChatModel:
    """``ChatModel`` over a local transformers folder; ``chat_batch`` pads on the left."""

    def __init__(self, arg: str | None, device: str = "cpu"):
        folder, options = _parse_arg(arg)
        config_path = folder / "config.json"
        if not config_path.is_file():
            what = "does not exist" if not folder.exists() else "has no config.json"
            raise ModelError(f"model folder {folder} {what}.\n" + DOWNLOAD_HINT.format(folder=folder))
        try:
            config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelError(f"cannot read {config_path}: {e}; re-download the model folder") from e
        try:
            self.max_frames = int(options.get("max_frames", 16))
            self.frame_max_px = int(options.get("frame_max_px", 448))
        except ValueError as e:
            raise ConfigError(f"'transformers:{arg}': max_frames and frame_max_px must be integers") from e

        import torch  # noqa: F401  (the llm extra: transformers needs torch)
        import transformers  # noqa: F401

        self.folder = folder
        self.device = device
        self.kind = model_kind(config)
        self.name = f"transformers:{folder}"
        self.native_video = importlib.util.find_spec("torchvision") is not None
        self._lock = threading.Lock()
        self._load(options.get("device_map"))
        log.info("loaded %s (%s) on %s", folder, self.kind, device)

    # ------------------------------------------------------------ loading
    def _load(self, device_map: str | None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cuda = str(self.device).startswith("cuda")
        kwargs: dict = {"dtype": torch.bfloat16 if cuda else torch.float32, "local_files_only": True}
        if cuda:
            kwargs["device_map"] = device_map or self.device
        elif device_map:
            kwargs["device_map"] = device_map
        folder = str(self.folder)
        try:
            if self.kind == "causal":
                self.model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
                self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
                self.processor = None
            elif self.kind == "qwen2_5_vl":
                from transformers import Qwen2_5_VLForConditionalGeneration

                self.model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, **kwargs)
                self.processor = self._load_processor()
            elif self.kind == "qwen2_5_omni_thinker":
                from transformers import Qwen2_5OmniThinkerForConditionalGeneration

                self.model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(folder, **kwargs)
                self.processor = self._load_processor()
            else:  # full Omni checkpoint: keep the thinker (text out), skip the talker and token2wav
                from transformers import AutoConfig, Qwen2_5OmniForConditionalGeneration

                config = AutoConfig.from_pretrained(folder, local_files_only=True)
                config.enable_audio_output = False
                full = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, config=config, **kwargs)
                self.model = full.thinker
                self.processor = self._load_processor()
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(f"cannot load the {self.kind} model in {folder}: {e}\n"
                             f"Is the folder complete (config.json, weights, tokenizer files)? "
                             + DOWNLOAD_HINT.format(folder=folder)) from e
        if self.processor is not None:
            self.tokenizer = self.processor.tokenizer
        self.model.eval()
        self.tokenizer.padding_side = "left"  # generation continues from the right edge
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if not _chat_template(self.folder, self.tokenizer):
            raise ModelError(f"{folder} has no chat template (tokenizer_config.json or chat_template.jinja); "
                             f"use an instruction-tuned model folder")

    def _load_processor(self):
        from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoProcessor, AutoTokenizer

        folder = str(self.folder)
        if self.native_video:
            try:
                return AutoProcessor.from_pretrained(folder, local_files_only=True)
            except (ImportError, RuntimeError) as e:
                # a torchvision built for another torch fails on import, not on find_spec
                log.warning("the video processor of %s does not load (%s)", self.folder, e)
                self.native_video = False
        log.warning("no usable torchvision: %s gets video as separate frames (install the torchvision "
                    "that matches your torch for native video input)", self.folder)
        vl_cls, omni_cls = _processor_subclasses()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        image_processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
        template = _chat_template(self.folder, tokenizer)
        if self.kind == "qwen2_5_vl":
            return vl_cls(image_processor=image_processor, tokenizer=tokenizer, chat_template=template)
        feature_extractor = AutoFeatureExtractor.from_pretrained(folder, local_files_only=True)
        return omni_cls(image_processor=image_processor, feature_extractor=feature_extractor,
                        tokenizer=tokenizer, chat_template=template)

    # ------------------------------------------------------------ messages
    @property
    def takes_images(self) -> bool:
        return self.kind != "causal"

    @property
    def takes_audio(self) -> bool:
        return self.kind in ("qwen2_5_omni_thinker", "qwen2_5_omni")

    def _frame(self, frame: np.ndarray) -> np.ndarray:
        from PIL import Image

        img = as_rgb_uint8(frame)
        h, w = img.shape[:2]
        if max(h, w) > self.frame_max_px:
            s = self.frame_max_px / max(h, w)
            img = np.asarray(Image.fromarray(img).resize((max(1, round(w * s)), max(1, round(h * s))),
                                                         Image.BILINEAR))
        return img

    def prepare(self, messages: list[dict]) -> _Prepared:
        """Template messages (parts reduced to placeholders) and the media, in order."""
        prep = _Prepared(messages=[])
        for m in messages:
            parts = parts_of(m)
            if self.kind == "causal":
                dropped = [p["type"] for p in parts if p["type"] != "text"]
                if dropped:
                    log.debug("%s is text-only: dropped %s parts", self.name, ", ".join(dropped))
                prep.messages.append({"role": m["role"],
                                      "content": "\n".join(p["text"] for p in parts if p["type"] == "text")})
                continue
            content: list[dict] = []
            last_video: int | None = None  # index of a video part just before, for its soundtrack
            for p in parts:
                kind = p["type"]
                if kind == "text":
                    content.append({"type": "text", "text": str(p.get("text", ""))})
                    last_video = None
                elif kind == "image":
                    content.append({"type": "image"})
                    prep.images.append(as_rgb_uint8(p["image"]))
                    last_video = None
                elif kind == "video":
                    sampled = sample_frames(p.get("frames", []), float(p.get("fps", 1.0)), self.max_frames)
                    if not sampled:
                        continue
                    if self.native_video:
                        times = [t for t, _ in sampled]
                        fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] \
                            else float(p.get("fps", 1.0))
                        content.append({"type": "video"})
                        prep.videos.append(np.stack([self._frame(f) for _, f in sampled]))
                        prep.video_fps.append(fps)
                        last_video = len(prep.videos) - 1
                    else:
                        for t_s, frame in sampled:
                            content.append({"type": "text", "text": f"[frame at {t_s:.1f} s]"})
                            content.append({"type": "image"})
                            prep.images.append(self._frame(frame))
                        last_video = None
                elif kind == "audio":
                    if not self.takes_audio:
                        log.debug("%s does not hear audio: dropped an audio part", self.name)
                        continue
                    prep.audios.append(resample(p["audio"], int(p.get("sr", AUDIO_SR)), AUDIO_SR))
                    if last_video is not None:
                        prep.audio_video.append(last_video)  # the video's soundtrack: no placeholder
                    else:
                        prep.audio_video.append(None)
                        content.append({"type": "audio"})
                    last_video = None
            prep.messages.append({"role": m["role"], "content": content})
        return prep

    def _template(self, messages: list[dict], enable_thinking: bool | None) -> str:
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        from jinja2 import TemplateError

        owner = self.processor if self.processor is not None else self.tokenizer
        try:
            return owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except (TemplateError, ValueError, TypeError, KeyError) as e:
            raise ModelError(f"the chat template of {self.folder} cannot render these messages: {e}") from e

    # ------------------------------------------------------------ generation
    def chat(self, messages: list[dict], max_new_tokens: int = 1024, temperature: float = 0.0,
             top_p: float | None = None, max_tokens: int | None = None, enable_thinking: bool | None = None) -> str:
        return self.chat_batch([messages], max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               max_tokens=max_tokens, enable_thinking=enable_thinking)[0]

    def chat_batch(self, conversations: list[list[dict]], max_new_tokens: int = 1024, temperature: float = 0.0,
                   top_p: float | None = None, max_tokens: int | None = None,
                   enable_thinking: bool | None = None) -> list[str]:
        """Replies to several chats, generated together (left padding) where their inputs allow."""
        if not conversations:
            return []
        limit = int(max_tokens if max_tokens is not None else max_new_tokens)
        prepared = [self.prepare(c) for c in conversations]
        # a batch shares one use_audio_in_video flag and one video fps (Omni's processor takes one)
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(prepared):
            key = (p.paired, tuple(sorted(set(round(f, 3) for f in p.video_fps))) if self.takes_audio else ())
            groups.setdefault(key, []).append(i)
        out: list[str | None] = [None] * len(conversations)
        for idx in groups.values():
            replies = self._generate([prepared[i] for i in idx], limit, temperature, top_p, enable_thinking)
            for i, r in zip(idx, replies):
                out[i] = r
        return out  # type: ignore[return-value]

    def _inputs(self, batch: list[_Prepared], enable_thinking: bool | None):
        texts = [self._template(p.messages, enable_thinking) for p in batch]
        if self.processor is None:
            return self.tokenizer(texts, return_tensors="pt", padding=True), {}
        images = [im for p in batch for im in p.images]
        videos, video_fps, audios, audio_video = [], [], [], []
        for p in batch:
            offset = len(videos)
            videos += list(p.videos)
            video_fps += p.video_fps
            audios += p.audios
            audio_video += [None if v is None else v + offset for v in p.audio_video]
        kwargs: dict = {"text": texts, "return_tensors": "pt", "padding": True}
        if images:
            kwargs["images"] = images
        if videos:
            kwargs["videos"] = videos
            kwargs["do_sample_frames"] = False  # frames are sampled already, at known times
            kwargs["video_metadata"] = [
                {"total_num_frames": len(v), "fps": f, "frames_indices": list(range(len(v))),
                 "height": v.shape[1], "width": v.shape[2], "duration": len(v) / f}
                for v, f in zip(videos, video_fps)]
        gen: dict = {}
        if audios:
            kwargs["audio"] = audios
            if any(v is not None for v in audio_video):
                kwargs["load_audio_from_video"] = True
                kwargs["audio_from_video_indices"] = audio_video
                gen["use_audio_in_video"] = True
        if videos and self.takes_audio:
            kwargs["fps"] = video_fps[0]
        return self.processor(**kwargs), gen

    def _generate(self, batch: list[_Prepared], limit: int, temperature: float, top_p: float | None,
                  enable_thinking: bool | None) -> list[str]:
        import torch

        inputs, gen = self._inputs(batch, enable_thinking)
        device = self.model.device
        dtype = self.model.dtype
        moved = {}
        for k, v in inputs.items():
            if isinstance(v, torch.Tensor):
                v = v.to(device)
                if v.is_floating_point():
                    v = v.to(dtype)  # pixel values and audio features in the model's precision
            moved[k] = v
        gen.update(max_new_tokens=limit, pad_token_id=self.tokenizer.pad_token_id)
        if temperature and temperature > 0:
            gen.update(do_sample=True, temperature=float(temperature))
            if top_p is not None:
                gen["top_p"] = float(top_p)
        else:
            # greedy: clear the sampling defaults a checkpoint's generation_config may carry
            gen.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        prompt_len = moved["input_ids"].shape[1]
        with self._lock, torch.inference_mode():
            out = self.model.generate(**moved, **gen)
        new = out[:, prompt_len:]
        return [t.strip() for t in self.tokenizer.batch_decode(new, skip_special_tokens=True)]
