"""The whisperx backend's pure parts: its config string, audio conversion and record
conversion. These need neither whisperx nor a model, so they run in every environment."""
from __future__ import annotations

import numpy as np
import pytest

from m3mem.errors import ConfigError
from models.speech_whisperx import ALIGN_ENV, PYANNOTE_ENV, parse_options, to_mono_16k, to_segments


def test_options_are_parsed_from_the_config_string():
    o = parse_options("/models/faster-whisper-small?align=/models/wav2vec2&diarize=/models/pyannote-3.1"
                      "&language=en&compute_type=int8_float16&batch_size=16&chunk_size=10&num_speakers=2"
                      "&min_speakers=1&max_speakers=3", env={})
    assert o.model == "/models/faster-whisper-small"
    assert (o.align_dir, o.diarize_dir) == ("/models/wav2vec2", "/models/pyannote-3.1")
    assert (o.language, o.compute_type, o.batch_size, o.chunk_size) == ("en", "int8_float16", 16, 10)
    assert (o.num_speakers, o.min_speakers, o.max_speakers) == (2, 1, 3)


def test_folders_fall_back_to_the_environment_and_the_string_wins():
    env = {ALIGN_ENV: "/env/align", PYANNOTE_ENV: "/env/pyannote"}
    o = parse_options("large-v3", env=env)
    assert (o.model, o.align_dir, o.diarize_dir, o.language) == ("large-v3", "/env/align", "/env/pyannote", None)
    assert parse_options("large-v3?align=/mine", env=env).align_dir == "/mine"
    assert parse_options("large-v3", env={}).align_dir is None


@pytest.mark.parametrize("bad", ["small?beam=5", "small?batch_size=many", "small?chunk_size=0", "small?language",
                                 "small?language=", ""])
def test_bad_option_strings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        parse_options(bad or None, env={})


def test_audio_is_resampled_to_16k_mono():
    sr = 44100
    t = np.arange(sr * 2) / sr
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    stereo = np.stack([tone, tone], axis=1)
    out = to_mono_16k(stereo, sr)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) - 32000) <= 1
    # still a 440 Hz tone after resampling
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16000 / len(out) - 440) < 2
    same = np.zeros(16000, np.float32)
    assert len(to_mono_16k(same, 16000)) == 16000


def test_whisperx_results_become_speech_segments():
    result = {"segments": [
        {"start": -0.2, "end": 2.0, "text": " hello there ", "speaker": "SPEAKER_01",
         "words": [{"word": "hello", "start": 0.1, "end": 0.5, "score": 0.9},
                   {"word": "1984"},  # no characters the aligner knows: no times
                   {"word": "there", "start": 0.6, "end": 1.1, "score": float("nan")}]},
        {"start": 2.5, "end": 3.0, "text": "   "},  # nothing said
        {"start": 3.0, "end": 99.0, "text": "bye", "speaker": "SPEAKER_00"},
    ]}
    emb = {"SPEAKER_01": [3.0, 4.0], "SPEAKER_00": [float("nan"), 1.0]}
    segs = to_segments(result, emb, duration_s=10.0)
    assert [s.text for s in segs] == ["hello there", "bye"]
    first, last = segs
    assert (first.start_s, first.end_s, first.speaker) == (0.0, 2.0, "SPEAKER_01")
    assert [(w.text, w.start_s, w.end_s) for w in first.words] == [("hello", 0.1, 0.5), ("there", 0.6, 1.1)]
    assert first.words[1].score == 0.0
    np.testing.assert_allclose(first.embedding, [0.6, 0.8])
    assert first.embedding.dtype == np.float32
    assert last.end_s == 10.0 and last.embedding is None  # a NaN centroid is no embedding
