"""The whisperx backend's loading code, run end to end on tiny random-weight models that the
tests build (tests/asr/tiny_models.py) and on real speech from shared/data.

Random weights produce nonsense words, so these tests assert the structure of what comes
back (times, ordering, labels, embeddings), never the words. They need the whisperx
virtualenv: .ci/asr-env.sh .venv-asr && .venv-asr/bin/python -m pytest tests/asr
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("whisperx", reason="whisperx is not installed here; it runs in its own virtualenv "
                                       "(.ci/asr-env.sh .venv-asr && .venv-asr/bin/python -m pytest tests/asr)")
pytest.importorskip("faster_whisper")

from m3mem.errors import ModelError  # noqa: E402
from models.speech_whisperx import ALIGN_ENV, PYANNOTE_ENV, WhisperXSpeechModel  # noqa: E402
from tests.asr.conftest import read_wav  # noqa: E402
from tests.asr.tiny_models import EMBEDDING_DIM, TEXT_TOKENS_MAX  # noqa: E402

WORD = re.compile(r"^[a-z]+$")


@pytest.fixture(autouse=True)
def _no_model_folders_from_the_environment(monkeypatch):
    monkeypatch.delenv(ALIGN_ENV, raising=False)
    monkeypatch.delenv(PYANNOTE_ENV, raising=False)


def assert_well_formed(segs, duration_s):
    assert segs, "speech was found in real speech"
    for s in segs:
        assert 0.0 <= s.start_s < s.end_s <= duration_s + 1e-6
        assert s.text and s.text == s.text.strip()
        # the tiny decoder writes lower-case letters and spaces, at most TEXT_TOKENS_MAX of them
        assert all(WORD.match(w) for w in s.text.split()), s.text
        assert len(s.text) <= TEXT_TOKENS_MAX
    starts = [s.start_s for s in segs]
    assert starts == sorted(starts)


@pytest.mark.slow
def test_transcribes_real_speech_into_well_formed_segments(tiny_whisper):
    audio, sr = read_wav("jfk.wav")
    m = WhisperXSpeechModel(f"{tiny_whisper}?language=en", device="cpu")
    segs = m.transcribe(audio, sr)
    assert_well_formed(segs, len(audio) / sr)
    # jfk.wav is 11 s of one speech turn; VAD must place it inside, not at the file's edges
    assert segs[0].start_s > 0.0 and segs[-1].end_s < len(audio) / sr
    for s in segs:
        assert s.speaker is None and s.embedding is None and s.words == ()
    assert m.name == f"whisperx:{tiny_whisper.name}"
    # same audio, same model: the same segments
    again = m.transcribe(audio, sr)
    assert [(s.start_s, s.end_s, s.text) for s in again] == [(s.start_s, s.end_s, s.text) for s in segs]


@pytest.mark.slow
def test_silence_gives_no_segments(tiny_whisper):
    m = WhisperXSpeechModel(f"{tiny_whisper}?language=en", device="cpu")
    assert m.transcribe(np.zeros(16000 * 5, np.float32), 16000) == []
    assert m.transcribe(np.zeros(100, np.float32), 16000) == []


@pytest.mark.slow
def test_other_sample_rates_are_resampled_before_transcription(tiny_whisper):
    from scipy.signal import resample_poly

    audio, sr = read_wav("jfk.wav")
    m = WhisperXSpeechModel(f"{tiny_whisper}?language=en", device="cpu")
    at_16k = m.transcribe(audio, sr)
    at_48k = m.transcribe(resample_poly(audio, 3, 1).astype(np.float32), 48000)
    assert_well_formed(at_48k, len(audio) / sr)
    # VAD finds the same speech (to within a frame or two) whatever the input rate
    assert len(at_48k) == len(at_16k)
    for a, b in zip(at_16k, at_48k):
        assert abs(a.start_s - b.start_s) < 0.1 and abs(a.end_s - b.end_s) < 0.1


@pytest.mark.slow
def test_alignment_gives_word_times_inside_their_segment(tiny_whisper, tiny_wav2vec2, punkt_data):
    audio, sr = read_wav("jfk.wav")
    m = WhisperXSpeechModel(f"{tiny_whisper}?language=en&align={tiny_wav2vec2}", device="cpu")
    segs = m.transcribe(audio, sr)
    assert_well_formed(segs, len(audio) / sr)
    words = [w for s in segs for w in s.words]
    assert words, "the aligner placed the words in time"
    for s in segs:
        assert [w.text for w in s.words] == s.text.split()  # all letters: every word is placed
        for w in s.words:
            assert s.start_s - 0.05 <= w.start_s <= w.end_s <= s.end_s + 0.05
            assert 0.0 <= w.score <= 1.0
        assert [w.start_s for w in s.words] == sorted(w.start_s for w in s.words)


@pytest.mark.slow
def test_alignment_folder_is_taken_from_the_environment(tiny_whisper, tiny_wav2vec2, punkt_data, monkeypatch):
    monkeypatch.setenv(ALIGN_ENV, str(tiny_wav2vec2))
    m = WhisperXSpeechModel(f"{tiny_whisper}?language=en", device="cpu")
    audio, sr = read_wav("jfk.wav")
    assert any(s.words for s in m.transcribe(audio, sr))


@pytest.mark.slow
def test_diarization_labels_speakers_and_attaches_their_embeddings(tiny_whisper, tiny_wav2vec2, tiny_pyannote,
                                                                   punkt_data):
    audio, sr = read_wav("pyannote_sample.wav")
    # 5 s chunks give several segments over the 30 s call; two speakers, as the RTTM says
    m = WhisperXSpeechModel(f"{tiny_whisper}?language=en&align={tiny_wav2vec2}&diarize={tiny_pyannote}"
                            f"&chunk_size=5&num_speakers=2", device="cpu")
    segs = m.transcribe(audio, sr)
    assert_well_formed(segs, len(audio) / sr)
    assert len(segs) >= 3
    by_speaker: dict[str, list] = {}
    for s in segs:
        assert s.speaker is not None and re.match(r"^SPEAKER_\d\d$", s.speaker)
        assert s.embedding is not None and s.embedding.shape == (EMBEDDING_DIM,)
        assert s.embedding.dtype == np.float32
        assert abs(float(np.linalg.norm(s.embedding)) - 1.0) < 1e-5
        by_speaker.setdefault(s.speaker, []).append(s.embedding)
    assert len(by_speaker) == 2
    # one centroid per speaker: segments of one speaker share it, two speakers do not
    for embs in by_speaker.values():
        for e in embs[1:]:
            np.testing.assert_array_equal(e, embs[0])
    centroids = [embs[0] for embs in by_speaker.values()]
    for i in range(len(centroids)):
        for j in range(i + 1, len(centroids)):
            assert not np.allclose(centroids[i], centroids[j])


@pytest.mark.slow
def test_registry_builds_the_backend_from_a_config_string(tiny_whisper):
    from models.registry import load_speech_model

    m = load_speech_model(f"whisperx:{tiny_whisper}?language=en", device="cpu")
    assert isinstance(m, WhisperXSpeechModel)
    audio, sr = read_wav("jfk.wav")
    assert_well_formed(m.transcribe(audio, sr), len(audio) / sr)


def test_missing_whisper_folder_says_what_to_download_and_where(tmp_path):
    folder = tmp_path / "faster-whisper-large-v3"
    with pytest.raises(ModelError) as e:
        WhisperXSpeechModel(str(folder), device="cpu")
    msg = str(e.value)
    assert str(folder) in msg and "does not exist" in msg
    assert "Systran/faster-whisper-large-v3" in msg and f"{folder}/model.bin" in msg
    folder.mkdir()
    with pytest.raises(ModelError, match="holds no model.bin"):
        WhisperXSpeechModel(str(folder), device="cpu")


def test_a_size_that_is_not_in_the_local_cache_is_a_model_error(tmp_path, monkeypatch):
    # an empty cache and no network: faster-whisper must not try to download
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as e:
        WhisperXSpeechModel("tiny.en", device="cpu")
    assert "'tiny.en'" in str(e.value) and "huggingface.co/Systran" in str(e.value)


@pytest.mark.slow
def test_missing_alignment_folder_says_what_to_download(tiny_whisper, tmp_path, punkt_data):
    missing = tmp_path / "wav2vec2-en"
    with pytest.raises(ModelError) as e:
        WhisperXSpeechModel(f"{tiny_whisper}?align={missing}", device="cpu")
    msg = str(e.value)
    assert f"{missing} does not exist" in msg and "wav2vec2" in msg and ALIGN_ENV in msg
    # a torchaudio-style folder without the English checkpoint names the file to fetch
    (tmp_path / "torchaudio").mkdir()
    (tmp_path / "torchaudio" / "wav2vec2_voxpopuli_base_10k_asr_fr.pth").write_bytes(b"")
    with pytest.raises(ModelError) as e:
        WhisperXSpeechModel(f"{tiny_whisper}?language=en&align={tmp_path / 'torchaudio'}", device="cpu")
    assert "https://download.pytorch.org/torchaudio/models/wav2vec2_fairseq_base_ls960_asr_ls960.pth" in str(e.value)


@pytest.mark.slow
def test_missing_punkt_data_is_a_model_error_not_a_download(tiny_whisper, tiny_wav2vec2, tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "no-nltk-data")])
    with pytest.raises(ModelError, match="punkt_tab"):
        WhisperXSpeechModel(f"{tiny_whisper}?language=en&align={tiny_wav2vec2}", device="cpu")


@pytest.mark.slow
def test_missing_pyannote_folder_says_what_to_download(tiny_whisper, tmp_path):
    missing = tmp_path / "pyannote-community-1"
    with pytest.raises(ModelError) as e:
        WhisperXSpeechModel(f"{tiny_whisper}?diarize={missing}", device="cpu")
    msg = str(e.value)
    assert f"{missing} does not exist" in msg and "pyannote/speaker-diarization-community-1" in msg
    assert f"{missing}/config.yaml" in msg and PYANNOTE_ENV in msg


@pytest.mark.slow
def test_a_pyannote_config_that_names_hub_models_is_a_model_error(tiny_whisper, tmp_path, monkeypatch):
    # pyannote 3.1's config.yaml names its models on the hub; offline they cannot load
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "pyannote-3.1"
    folder.mkdir()
    (folder / "config.yaml").write_text(
        "version: 3.1.0\npipeline:\n  name: pyannote.audio.pipelines.SpeakerDiarization\n  params:\n"
        "    clustering: AgglomerativeClustering\n    embedding: pyannote/wespeaker-voxceleb-resnet34-LM\n"
        "    segmentation: pyannote/segmentation-3.0\n")
    with pytest.raises(ModelError) as e:
        WhisperXSpeechModel(f"{tiny_whisper}?diarize={folder}", device="cpu")
    assert str(folder) in str(e.value) and "local path" in str(e.value)
