"""Speech in production: whisperX (faster-whisper ASR, wav2vec2 word alignment, pyannote diarization).

Config string::

    whisperx:<folder-or-size>[?option=value&option=value...]

    whisperx:/models/faster-whisper-small
    whisperx:/models/faster-whisper-large-v3?language=en&align=/models/wav2vec2-en&diarize=/models/pyannote-community-1
    whisperx:large-v3?compute_type=int8_float16      (a size must already be in the Hugging Face cache)

Options (a folder given as an option wins over its environment variable):

- ``align=<folder>`` (env ``M3MEM_WHISPERX_ALIGN_DIR``): the word alignment model, either a
  Hugging Face ``Wav2Vec2ForCTC`` folder (config.json, vocab.json, preprocessor_config.json,
  weights) or a folder holding torchaudio's checkpoint for the language, e.g.
  ``wav2vec2_fairseq_base_ls960_asr_ls960.pth`` for English. Without it, segments carry no
  word times.
- ``diarize=<folder>`` (env ``M3MEM_PYANNOTE_DIR``): a pyannote speaker-diarization pipeline
  folder (``config.yaml`` and the models it names). Gives each segment a speaker label and
  the pipeline's centroid embedding of that speaker.
- ``language=<code>``: skip language detection (it is unreliable on clips under 30 s).
- ``compute_type=<type>``: CTranslate2 compute type; float16 on CUDA and int8 on CPU by default.
- ``batch_size=<n>``: VAD chunks decoded at once (8 on CUDA, 4 on CPU by default).
- ``chunk_size=<s>``: the longest stretch of speech (seconds) VAD merges into one chunk, and
  so the longest segment before alignment (30 by default, Whisper's window).
- ``num_speakers=<n>`` or ``min_speakers=<n>``, ``max_speakers=<n>``: the speaker count for
  diarization, when it is known.

whisperx pins its own torch, so it lives in its own virtualenv (``.ci/asr-env.sh``).
Nothing is downloaded: every model comes from a local folder or the local cache.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from m3mem.errors import ConfigError, ModelError
from m3mem.records import SpeechSegment, Word, l2_normalize

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000  # whisperx and pyannote take 16 kHz mono float32
ALIGN_ENV = "M3MEM_WHISPERX_ALIGN_DIR"
PYANNOTE_ENV = "M3MEM_PYANNOTE_DIR"
TORCHAUDIO_MODELS_URL = "https://download.pytorch.org/torchaudio/models/"

ASR_HINT = (
    "download a CTranslate2 Whisper model, e.g. https://huggingface.co/Systran/faster-whisper-large-v3 "
    "(or faster-whisper-small for CPU): `huggingface-cli download Systran/faster-whisper-large-v3 "
    "--local-dir {folder}` so that {folder}/model.bin, config.json, tokenizer.json, vocabulary.json "
    "and preprocessor_config.json exist, then pass 'whisperx:{folder}'"
)
ALIGN_HINT = (
    "download a wav2vec2 CTC model for the language, e.g. `huggingface-cli download "
    "jonatasgrosman/wav2vec2-large-xlsr-53-english --local-dir {folder}`, or put torchaudio's "
    "English checkpoint " + TORCHAUDIO_MODELS_URL + "wav2vec2_fairseq_base_ls960_asr_ls960.pth "
    "into {folder}; then pass '?align={folder}' or set " + ALIGN_ENV
)
DIARIZE_HINT = (
    "download the pyannote pipeline (accept its terms on https://huggingface.co/pyannote/"
    "speaker-diarization-community-1 first): `huggingface-cli download "
    "pyannote/speaker-diarization-community-1 --local-dir {folder}` so that {folder}/config.yaml "
    "exists, then pass '?diarize={folder}' or set " + PYANNOTE_ENV
)

_INT_OPTIONS = ("batch_size", "chunk_size", "num_speakers", "min_speakers", "max_speakers")
_STR_OPTIONS = ("align", "diarize", "language", "compute_type")


@dataclass(frozen=True)
class WhisperXOptions:
    model: str  # a folder or a faster-whisper size name
    align_dir: str | None = None
    diarize_dir: str | None = None
    language: str | None = None
    compute_type: str | None = None
    batch_size: int | None = None
    chunk_size: int | None = None
    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None


def parse_options(arg: str | None, env: dict[str, str] | None = None) -> WhisperXOptions:
    """``<folder-or-size>?key=value&...`` -> options; folders fall back to the environment."""
    env = os.environ if env is None else env
    if not arg:
        raise ConfigError("the whisperx speech backend needs a model: 'whisperx:<folder-or-size>', "
                          "e.g. 'whisperx:/models/faster-whisper-small'")
    model, _, query = arg.partition("?")
    values: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as e:
        raise ConfigError(f"whisperx options in {arg!r} are not key=value pairs joined by '&' ({e})") from e
    for key, value in pairs:
        if key not in _INT_OPTIONS + _STR_OPTIONS:
            raise ConfigError(f"unknown whisperx option {key!r} in {arg!r}; "
                              f"options: {', '.join(_STR_OPTIONS + _INT_OPTIONS)}")
        if not value:
            raise ConfigError(f"whisperx option {key!r} in {arg!r} has no value")
        values[key] = value
    ints: dict[str, int | None] = {}
    for key in _INT_OPTIONS:
        if key in values:
            try:
                ints[key] = int(values[key])
            except ValueError as e:
                raise ConfigError(f"whisperx option {key}={values[key]!r} in {arg!r} is not an integer") from e
            if ints[key] < 1:
                raise ConfigError(f"whisperx option {key}={values[key]!r} in {arg!r} must be at least 1")
        else:
            ints[key] = None
    return WhisperXOptions(
        model=model.strip(),
        align_dir=values.get("align") or env.get(ALIGN_ENV) or None,
        diarize_dir=values.get("diarize") or env.get(PYANNOTE_ENV) or None,
        language=values.get("language") or None,
        compute_type=values.get("compute_type") or None,
        **ints,
    )


def _looks_like_path(model: str) -> bool:
    return "/" in model or "\\" in model or model.startswith((".", "~")) or Path(model).exists()


def _split_device(device: str) -> tuple[str, int]:
    kind, _, index = device.partition(":")
    return kind, int(index) if index else 0


def to_mono_16k(audio: np.ndarray, sr: int) -> np.ndarray:
    a = np.asarray(audio, dtype=np.float32)
    if a.ndim == 2:
        # (samples, channels) as soundfile reads it, or (channels, samples)
        a = a.mean(axis=1 if a.shape[0] > a.shape[1] else 0)
    if a.ndim != 1:
        raise ValueError(f"audio has shape {np.shape(audio)}; expected mono samples")
    if sr != SAMPLE_RATE:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(int(sr), SAMPLE_RATE)
        a = resample_poly(a, SAMPLE_RATE // g, int(sr) // g).astype(np.float32)
    return np.ascontiguousarray(a)


def to_segments(result: dict, speaker_embeddings: dict | None, duration_s: float) -> list[SpeechSegment]:
    """whisperX's segment dicts -> SpeechSegment records (times clamped to the audio)."""
    out: list[SpeechSegment] = []
    for seg in result.get("segments", []):
        text = str(seg.get("text", "")).strip()
        if not text:
            continue
        start = min(max(float(seg["start"]), 0.0), duration_s)
        end = min(max(float(seg["end"]), start), duration_s)
        words = []
        for w in seg.get("words", ()):
            # alignment leaves words without times when none of their characters is in the
            # alignment model's alphabet (digits, symbols); they cannot be placed in time
            if "start" not in w or "end" not in w or not np.isfinite([w["start"], w["end"]]).all():
                continue
            words.append(Word(float(w["start"]), float(w["end"]), str(w.get("word", "")).strip(),
                              float(w.get("score", 1.0)) if np.isfinite(w.get("score", 1.0)) else 0.0))
        speaker = seg.get("speaker")
        embedding = None
        if speaker is not None and speaker_embeddings and speaker in speaker_embeddings:
            v = np.asarray(speaker_embeddings[speaker], dtype=np.float32)
            if v.size and np.isfinite(v).all() and np.linalg.norm(v) > 0:
                embedding = l2_normalize(v)
        out.append(SpeechSegment(start, end, text, speaker=speaker, words=tuple(words), embedding=embedding))
    return out


class WhisperXSpeechModel:
    name = "whisperx"

    def __init__(self, arg: str | None = None, device: str = "cpu"):
        try:
            import whisperx
        except ImportError as e:
            raise ModelError(
                f"whisperx is not importable here ({e}). It pins its own torch, so it needs its own "
                "virtualenv: run .ci/asr-env.sh <venv> and use <venv>/bin/python (see docs/production-models.md)"
            ) from e
        self._whisperx = whisperx
        self.options = opts = parse_options(arg)
        kind, index = _split_device(device)
        self.device = kind
        self._device_index = index
        compute_type = opts.compute_type or ("float16" if kind == "cuda" else "int8")
        model = self._check_asr(opts.model)
        try:
            self._asr = whisperx.load_model(model, kind, device_index=index, compute_type=compute_type,
                                            language=opts.language, local_files_only=True)
        except (OSError, ValueError, RuntimeError) as e:
            # a size name that is not in the local cache ends here (huggingface_hub's
            # LocalEntryNotFoundError is an OSError/ValueError); so does a broken folder
            raise ModelError(f"whisperx could not load the Whisper model {opts.model!r}: {e}; "
                             + ASR_HINT.format(folder=_folder_for(opts.model))) from e
        self._batch_size = opts.batch_size or (8 if kind == "cuda" else 4)
        self._align_dir = self._check_align(opts.align_dir, opts.language)
        self._align_models: dict[str, tuple] = {}
        self._diarize = self._load_diarization(opts.diarize_dir) if opts.diarize_dir else None
        self.name = f"whisperx:{Path(opts.model).name or opts.model}"
        log.info("whisperx %s on %s (%s), alignment %s, diarization %s", opts.model, device, compute_type,
                 self._align_dir or "off", opts.diarize_dir or "off")

    @staticmethod
    def _check_asr(model: str) -> str:
        if not _looks_like_path(model):
            return model
        folder = Path(model).expanduser()
        if not (folder / "model.bin").is_file():
            what = "does not exist" if not folder.exists() else "holds no model.bin"
            raise ModelError(f"Whisper model folder {folder} {what}; " + ASR_HINT.format(folder=folder))
        return str(folder)

    @staticmethod
    def _check_align(align_dir: str | None, language: str | None) -> Path | None:
        if not align_dir:
            return None
        folder = Path(align_dir).expanduser()
        if not folder.is_dir():
            raise ModelError(f"alignment model folder {folder} does not exist; " + ALIGN_HINT.format(folder=folder))
        if not (folder / "config.json").is_file():
            if not any(folder.glob("*.pth")):
                raise ModelError(f"alignment model folder {folder} holds neither a Hugging Face model "
                                 f"(config.json) nor a torchaudio checkpoint (*.pth); "
                                 + ALIGN_HINT.format(folder=folder))
            if language:
                _torchaudio_checkpoint(folder, language)  # fail now, not on the first clip
        _check_punkt(language)
        return folder

    def _load_diarization(self, diarize_dir: str):
        folder = Path(diarize_dir).expanduser()
        if not (folder / "config.yaml").is_file():
            what = "does not exist" if not folder.exists() else "holds no config.yaml"
            raise ModelError(f"pyannote diarization folder {folder} {what}; " + DIARIZE_HINT.format(folder=folder))
        from whisperx.diarize import DiarizationPipeline

        device = f"{self.device}:{self._device_index}" if self.device == "cuda" else self.device
        try:
            return DiarizationPipeline(model_name=str(folder), device=device)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
            # pyannote reads config.yaml and the checkpoints it names; a config that still
            # names models on the hub tries to download them and fails offline
            raise ModelError(f"pyannote could not load the diarization pipeline in {folder}: {e}. "
                             f"Every model named in {folder}/config.yaml must be a local path "
                             f"or a subfolder ($model/...); " + DIARIZE_HINT.format(folder=folder)) from e

    def _align_model(self, language: str):
        if language in self._align_models:
            return self._align_models[language]
        folder = self._align_dir
        if (folder / "config.json").is_file():
            # a Hugging Face folder is one model for one language, whatever was detected
            model_name, model_dir = str(folder), None
        else:
            path = _torchaudio_checkpoint(folder, language, raise_missing=False)
            if path is None:
                log.warning("no alignment checkpoint for language %r in %s; segments in it carry no word times",
                            language, folder)
                self._align_models[language] = (None, None)
                return self._align_models[language]
            model_name, model_dir = None, str(folder)
        try:
            model, meta = self._whisperx.load_align_model(language, self.device, model_name=model_name,
                                                          model_dir=model_dir)
        except (OSError, ValueError, RuntimeError) as e:
            raise ModelError(f"whisperx could not load the alignment model in {folder} for language "
                             f"{language!r}: {e}; " + ALIGN_HINT.format(folder=folder)) from e
        self._align_models[language] = (model, meta)
        return model, meta

    def transcribe(self, audio: np.ndarray, sr: int) -> list[SpeechSegment]:
        audio16 = to_mono_16k(audio, sr)
        duration_s = len(audio16) / SAMPLE_RATE
        if duration_s < 0.1:
            return []
        result = self._asr.transcribe(audio16, batch_size=self._batch_size, language=self.options.language,
                                      chunk_size=self.options.chunk_size or 30)
        language = result.get("language") or self.options.language or "en"
        if not result.get("segments"):
            return []
        if self._align_dir is not None:
            model, meta = self._align_model(language)
            if model is not None:
                aligned = self._whisperx.align(result["segments"], model, meta, audio16, self.device,
                                               return_char_alignments=False)
                result = {"segments": aligned["segments"], "language": language}
        embeddings = None
        if self._diarize is not None:
            out = self._diarize(audio16, num_speakers=self.options.num_speakers,
                                min_speakers=self.options.min_speakers,
                                max_speakers=self.options.max_speakers, return_embeddings=True)
            diarization, embeddings = out if isinstance(out, tuple) else (out, None)
            result = self._whisperx.assign_word_speakers(diarization, result)
        return to_segments(result, embeddings, duration_s)


def _folder_for(model: str) -> str:
    return model if _looks_like_path(model) else f"/models/faster-whisper-{model}"


def _check_punkt(language: str | None) -> None:
    """whisperX's alignment splits sentences with NLTK's punkt_tab data and, when it is
    missing, downloads it in the middle of a run; a missing copy is an error at load time."""
    import nltk

    try:
        from whisperx.utils import PUNKT_LANGUAGES
    except ImportError:  # older whisperx: English punkt for every language
        PUNKT_LANGUAGES = {}
    punkt = PUNKT_LANGUAGES.get(language or "en", "english")
    try:
        nltk.data.find(f"tokenizers/punkt_tab/{punkt}/")
    except LookupError as e:
        raise ModelError(
            f"NLTK's punkt_tab data ({punkt}) is missing; whisperX's alignment needs it. Run "
            "python -c \"import nltk, sys; nltk.download('punkt_tab', download_dir=sys.prefix + '/nltk_data')\" "
            "with the Python of the whisperx environment (.ci/asr-env.sh does this), or set NLTK_DATA "
            "to a folder that holds tokenizers/punkt_tab"
        ) from e


def _torchaudio_checkpoint(folder: Path, language: str, raise_missing: bool = True) -> Path | None:
    """The torchaudio checkpoint whisperX would use for ``language``, if it is in ``folder``."""
    from whisperx.alignment import DEFAULT_ALIGN_MODELS_TORCH

    import torchaudio

    name = DEFAULT_ALIGN_MODELS_TORCH.get(language)
    if name is None:
        if raise_missing:
            raise ModelError(f"torchaudio has no default alignment model for language {language!r}; "
                             f"put a Hugging Face wav2vec2 CTC model for it into {folder} instead. "
                             + ALIGN_HINT.format(folder=folder))
        return None
    filename = Path(getattr(torchaudio.pipelines, name)._path).name
    path = folder / filename
    if path.is_file():
        return path
    if raise_missing:
        raise ModelError(f"alignment checkpoint {path} is missing for language {language!r}; download "
                         f"{TORCHAUDIO_MODELS_URL}{filename} into {folder}")
    return None
