"""The offline backends on real media with ground truth (shared/data, see its MANIFEST.md):
faces found and told apart, speech transcribed, voices and texts embedded."""
from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from models import calibration, registry

pytestmark = pytest.mark.slow


def _rgb(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def _wav(path: Path) -> tuple[np.ndarray, int]:
    sf = pytest.importorskip("soundfile")
    audio, sr = sf.read(str(path), dtype="float32")
    return audio, sr


def _largest(observations):
    return max(observations, key=lambda o: (o.bbox[2] - o.bbox[0]) * (o.bbox[3] - o.bbox[1]))


# ---------------------------------------------------------------- faces


@pytest.fixture(scope="module")
def face_model():
    pytest.importorskip("dlib", reason="dlib is not installed (pip install 'm3mem[offline]')")
    return registry.load_face_model("dlib", device="cpu")


def test_all_six_faces_of_the_group_photo_are_found(face_model, shared_data):
    img = _rgb(shared_data / "faces" / "insightface_t1_group.jpg")
    faces = face_model.detect([img])
    assert len(faces) == 6
    h, w = img.shape[:2]
    for f in faces:
        x0, y0, x1, y1 = f.bbox
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        assert f.frame == 0 and 0.0 < f.det_score < 1.0
        assert f.embedding.dtype == np.float32 and f.embedding.shape == (face_model.dim,)
        assert np.linalg.norm(f.embedding) == pytest.approx(1.0, abs=1e-5)
    # six different people: no two of them match
    emb = np.stack([f.embedding for f in faces])
    sim = emb @ emb.T
    assert sim[~np.eye(6, dtype=bool)].max() < face_model.match_threshold


def test_obama_and_biden_are_found_and_told_apart(face_model, shared_data):
    faces_dir = shared_data / "faces"
    faces = face_model.detect([_rgb(faces_dir / "fr_obama_and_biden.jpg")])
    # the ground truth names two men; the photo also shows a girl's face at its lower right edge
    assert len(faces) >= 2
    two = sorted(faces, key=lambda o: -(o.bbox[2] - o.bbox[0]))[:2]
    obama = _largest(face_model.detect([_rgb(faces_dir / "fr_obama.jpg")])).embedding
    biden = _largest(face_model.detect([_rgb(faces_dir / "fr_biden.jpg")])).embedding
    sim = np.array([[f.embedding @ obama, f.embedding @ biden] for f in two])
    # each reference photo matches exactly one of the two men, and a different one
    assert (sim >= face_model.match_threshold).sum(axis=0).tolist() == [1, 1]
    assert np.argmax(sim[:, 0]) != np.argmax(sim[:, 1])


def test_photo_pairs_are_judged_at_the_calibrated_threshold(face_model, shared_data):
    pairs = list(csv.DictReader(open(shared_data / "gt" / "deepface_pairs.csv")))
    files = sorted({r["file_x"] for r in pairs} | {r["file_y"] for r in pairs})
    emb = {}
    for name in files:
        faces = face_model.detect([_rgb(shared_data / name)])
        assert faces, f"no face found in {name}"
        emb[name] = _largest(faces).embedding
    same = np.array([r["same_person"] == "Yes" for r in pairs])
    sim = np.array([float(emb[r["file_x"]] @ emb[r["file_y"]]) for r in pairs])
    accuracy = float(((sim >= face_model.match_threshold) == same).mean())
    assert accuracy >= 0.9
    assert accuracy == pytest.approx(calibration.DLIB_FACE["photo_pairs"]["accuracy_at_threshold"], abs=1.5 / 78)
    # errors at the threshold are splits of one person, never two people merged
    assert sim[~same].max() < face_model.match_threshold


def _video_frames(path: Path, every_s: float) -> list[np.ndarray]:
    decord = pytest.importorskip("decord")
    vr = decord.VideoReader(str(path))
    step = max(1, int(round(vr.get_avg_fps() * every_s)))
    return list(vr.get_batch(list(range(0, len(vr), step))).asnumpy())


def test_small_video_frames_find_their_face(face_model, shared_data):
    # 360x288 GRID frames and 512x512 talking heads: faces small enough to need upsampling
    for name in ("grid/bbaf2n.mpg", "hdtf_aoc_a.mp4"):
        frames = _video_frames(shared_data / name, every_s=1.0)
        faces = face_model.detect(frames)
        assert sorted({f.frame for f in faces}) == list(range(len(frames))), name


def test_one_person_in_two_videos_matches_and_others_do_not(face_model, shared_data):
    def track(name):
        faces = face_model.detect(_video_frames(shared_data / name, every_s=1.0))
        by_frame = {}
        for f in faces:
            by_frame.setdefault(f.frame, []).append(f)
        mean = np.mean([_largest(fs).embedding for fs in by_frame.values()], axis=0)
        return mean / np.linalg.norm(mean)

    aoc_a, aoc_b, katie = (track(n) for n in ("hdtf_aoc_a.mp4", "retalking_face3.mp4", "hdtf_katie_hill.mp4"))
    assert aoc_a @ aoc_b >= face_model.match_threshold
    assert aoc_a @ katie < face_model.match_threshold and aoc_b @ katie < face_model.match_threshold


def test_a_frame_that_is_not_rgb_is_refused(face_model):
    from m3mem.errors import InputError

    with pytest.raises(InputError, match="RGB"):
        face_model.detect([np.zeros((64, 64), dtype=np.uint8)])


# ---------------------------------------------------------------- speech


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def _wer(ref: list[str], hyp: list[str]) -> float:
    d = np.arange(len(hyp) + 1)
    for i, r in enumerate(ref, 1):
        prev, d[0] = d.copy(), i
        for j, h in enumerate(hyp, 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r != h))
    return d[len(hyp)] / max(1, len(ref))


@pytest.fixture(scope="module")
def speech_model():
    pytest.importorskip("pocketsphinx", reason="pocketsphinx is not installed (pip install 'm3mem[offline]')")
    return registry.load_speech_model("pocketsphinx", device="cpu")


def test_jfk_is_transcribed_with_word_times(speech_model, shared_data):
    audio, sr = _wav(shared_data / "jfk.wav")
    segments = speech_model.transcribe(audio, sr)
    assert segments
    hyp = _words(" ".join(s.text for s in segments))
    ref = _words((shared_data / "gt" / "jfk.txt").read_text())
    assert "country" in hyp
    wer = _wer(ref, hyp)
    assert wer < calibration.POCKETSPHINX_SPEECH["test_bound_wer_jfk"], (wer, hyp)
    duration_s = len(audio) / sr
    previous_end = 0.0
    for seg in segments:
        assert seg.text.strip() and seg.text == " ".join(w.text for w in seg.words)
        assert seg.start_s == seg.words[0].start_s and seg.end_s == seg.words[-1].end_s
        for w in seg.words:
            assert previous_end - 1e-6 <= w.start_s < w.end_s <= duration_s + 1e-6
            assert not re.search(r"[<\[(+]", w.text), w.text
            assert 0.0 <= w.score <= 1.0
            previous_end = w.end_s
    # "country" is the last word, said in the last second and a half
    last = segments[-1].words[-1]
    assert last.text == "country" and last.end_s > duration_s - 1.5


def test_continuous_speech_is_split_into_bounded_regions(shared_data):
    pytest.importorskip("pocketsphinx", reason="pocketsphinx is not installed (pip install 'm3mem[offline]')")
    from models.speech_pocketsphinx import speech_regions, to_mono_16k

    # the sample is a phone call with talk from 6.6 s to its end, 23 s without a pause of 0.5 s
    audio, sr = _wav(shared_data / "pyannote_sample.wav")
    regions = speech_regions(to_mono_16k(audio, sr))
    assert len(regions) >= 2
    assert all(b - a <= 15.0 + 0.15 + 1e-6 for a, b in regions)
    assert all(a1 <= b1 <= a2 for (a1, b1), (a2, _) in zip(regions, regions[1:]))
    # the first words are said at 6.68 s (gt/pyannote_sample.stm), the last end at 29.99 s
    assert regions[0][0] <= 6.68 and regions[-1][1] >= 29.9


# ---------------------------------------------------------------- voices


def single_speaker_stretches(rttm: Path, min_s: float = 1.0) -> list[tuple[float, float, str]]:
    """Stretches of at least ``min_s`` during which the RTTM has exactly one speaker."""
    turns = []
    for line in rttm.read_text().splitlines():
        p = line.split()
        start = float(p[3])
        turns.append((start, start + float(p[4]), p[7]))
    edges = sorted({t for a, b, _ in turns for t in (a, b)})
    out: list[tuple[float, float, str]] = []
    for a, b in zip(edges, edges[1:]):
        who = {s for x, y, s in turns if x < b and y > a}
        if len(who) != 1:
            continue
        speaker = who.pop()
        if out and out[-1][2] == speaker and abs(out[-1][1] - a) < 1e-9:
            out[-1] = (out[-1][0], b, speaker)
        else:
            out.append((a, b, speaker))
    return [s for s in out if s[1] - s[0] >= min_s]


@pytest.fixture(scope="module")
def voice_model():
    pytest.importorskip("resemblyzer", reason="resemblyzer is not installed (pip install 'm3mem[offline]')")
    return registry.load_voice_model("resemblyzer", device="cpu")


@pytest.fixture(scope="module")
def voice_pairs(voice_model, shared_data):
    """Cosines of same- and different-speaker pairs within each recording set."""
    sets = {"ami": ["ami_tst00", "ami_tst01"], "pyannote": ["pyannote_sample"]}
    same, diff = [], []
    for names in sets.values():
        items = []
        for name in names:
            audio, sr = _wav(shared_data / f"{name}.wav")
            for a, b, speaker in single_speaker_stretches(shared_data / "gt" / f"{name}.rttm"):
                e = voice_model.embed(audio[int(a * sr):int(b * sr)], sr)
                assert e.dtype == np.float32 and e.shape == (voice_model.dim,)
                assert np.linalg.norm(e) == pytest.approx(1.0, abs=1e-5)
                items.append((speaker, e))
        for (s1, e1), (s2, e2) in itertools.combinations(items, 2):
            (same if s1 == s2 else diff).append(float(e1 @ e2))
    return np.array(same), np.array(diff)


def test_same_speaker_voices_are_closer_than_different_speakers(voice_pairs):
    same, diff = voice_pairs
    assert len(same) >= 8 and len(diff) >= 16
    assert same.mean() > diff.mean() + 0.1


def test_voice_threshold_separates_speakers_as_calibrated(voice_model, voice_pairs):
    same, diff = voice_pairs
    t = voice_model.match_threshold
    balanced = ((same >= t).mean() + (diff < t).mean()) / 2
    recorded = calibration.RESEMBLYZER_VOICE["whole_stretches"]["at_threshold"]["balanced_accuracy"]
    assert balanced >= 0.8
    assert balanced == pytest.approx(recorded, abs=0.05)


def test_voice_embedding_does_not_depend_on_sample_rate_or_level(voice_model, shared_data):
    from scipy.signal import resample_poly

    audio, sr = _wav(shared_data / "ami_tst00.wav")
    seg = audio[int(15.62 * sr):int(19.01 * sr)]  # FEO072 alone
    base = voice_model.embed(seg, sr)
    at_44k = voice_model.embed(resample_poly(seg, 441, 160).astype(np.float32), 44100)
    quiet = voice_model.embed(seg * 0.05, sr)
    assert float(base @ at_44k) > 0.99
    assert float(base @ quiet) > 0.999


# ---------------------------------------------------------------- text


@pytest.fixture(scope="module")
def text_model():
    pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    return registry.load_text_embedder("minilm", device="cpu")


def test_minilm_ranks_a_paraphrase_above_unrelated_text(text_model, shared_data):
    jfk = (shared_data / "gt" / "jfk.txt").read_text().strip()
    candidates = [
        "The recipe needs two cups of flour and a pinch of salt.",
        "Citizens should ask what they can give to their nation, not what it gives them.",
        "Stock markets fell sharply on Tuesday after the earnings report.",
    ]
    q = text_model.embed([jfk])
    c = text_model.embed(candidates)
    assert q.shape == (1, 384) and c.shape == (3, 384) and c.dtype == np.float32
    assert np.allclose(np.linalg.norm(c, axis=1), 1.0, atol=1e-5)
    scores = c @ q[0]
    assert int(np.argmax(scores)) == 1
    assert scores[1] > max(scores[0], scores[2]) + 0.2


def test_minilm_batches_give_the_same_vectors_as_single_texts(text_model):
    texts = [f"clip {i}: a person speaks about topic number {i}" for i in range(70)]  # more than one batch
    batched = text_model.embed(texts)
    one = np.stack([text_model.embed([t])[0] for t in texts[:3] + texts[-2:]])
    assert batched.shape == (70, text_model.dim)
    assert np.allclose(one, np.concatenate([batched[:3], batched[-2:]]), atol=1e-4)
    assert text_model.embed([]).shape == (0, text_model.dim)


def test_a_sentence_transformers_folder_loads_by_path(text_model):
    from models.text_st import minilm_folder

    model = registry.load_text_embedder(f"sentence-transformers:{minilm_folder()}", device="cpu")
    assert model.name.startswith("sentence-transformers:") and model.dim == 384
    v = model.embed(["ask not what your country can do for you"])
    assert np.allclose(v, text_model.embed(["ask not what your country can do for you"]), atol=1e-5)


def test_missing_voice_weights_file_is_named(tmp_path):
    pytest.importorskip("resemblyzer", reason="resemblyzer is not installed (pip install 'm3mem[offline]')")
    from m3mem.errors import ModelError

    with pytest.raises(ModelError, match="pretrained.pt"):
        registry.load_voice_model(f"resemblyzer:{tmp_path / 'pretrained.pt'}", device="cpu")
