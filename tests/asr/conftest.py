"""Fixtures for the whisperx backend tests. They run in the whisperx virtualenv
(``.ci/asr-env.sh``); elsewhere the test modules skip themselves."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def read_wav(name: str) -> tuple[np.ndarray, int]:
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"real media not found at {path} (see the README)")
    from scipy.io import wavfile

    sr, audio = wavfile.read(path)
    if audio.dtype == np.int16:
        audio = audio.astype(np.float32) / 32768.0
    return audio.astype(np.float32), int(sr)


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory) -> Path:
    from tests.asr.tiny_models import build_whisper

    return build_whisper(tmp_path_factory.mktemp("whisper") / "faster-whisper-tiny-random")


@pytest.fixture(scope="session")
def tiny_wav2vec2(tmp_path_factory) -> Path:
    from tests.asr.tiny_models import build_wav2vec2

    return build_wav2vec2(tmp_path_factory.mktemp("align") / "wav2vec2-tiny-random")


@pytest.fixture(scope="session")
def tiny_pyannote(tmp_path_factory) -> Path:
    from tests.asr.tiny_models import build_pyannote

    return build_pyannote(tmp_path_factory.mktemp("diarize") / "pyannote-tiny-random")


@pytest.fixture(scope="session")
def punkt_data(tmp_path_factory):
    """Offline punkt_tab data on NLTK's search path for the whole session."""
    import nltk

    from tests.asr.tiny_models import build_punkt

    root = build_punkt(tmp_path_factory.mktemp("nltk_data"))
    nltk.data.path.insert(0, str(root))
    yield root
    nltk.data.path.remove(str(root))
