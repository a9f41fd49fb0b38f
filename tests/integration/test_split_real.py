"""Split stage on the real media in ../shared/data: every video probes, splits, gives the
frames ffmpeg itself decodes at the same times, and audio whose length matches its duration."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from m3mem.errors import InputError
from pipelines.split import AudioTrack, FrameReader, plan_clips, probe

# the files are listed at collection time (one test each), so the path is resolved
# here rather than through the shared_data fixture; the same place and the same rule
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

if not (DATA / "MANIFEST.md").is_file():
    pytest.skip(f"real test media not found at {DATA} (a folder 'shared/data' beside the repository)",
                allow_module_level=True)
if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
    pytest.skip("ffmpeg/ffprobe are not installed", allow_module_level=True)

VIDEOS = sorted(DATA.glob("*.mp4")) + sorted((DATA / "grid").glob("*.mpg"))
AUDIO = sorted(DATA.glob("*.wav"))
SR = 16000


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _ffprobe_csv(path: Path, *args: str) -> list[str]:
    out = subprocess.run(["ffprobe", "-v", "error", *args, "-of", "csv=p=0", str(path)],
                         check=True, capture_output=True, text=True).stdout
    return [x for x in out.replace(",", " ").split() if x]


def test_the_real_media_is_there():
    assert len(VIDEOS) >= 20 and len(AUDIO) >= 5


@pytest.mark.parametrize("path", VIDEOS, ids=_ids(VIDEOS))
def test_real_video_probes_splits_and_decodes_its_whole_audio(path):
    info = probe(path)
    assert info.has_video and info.has_audio
    assert 1.0 < info.duration_s < 60.0
    assert info.fps > 1 and info.width > 0 and info.height > 0
    clips = plan_clips(info, "vid", clip_s=2.0)  # short clips: several per file
    assert clips[0].start_s == 0 and clips[-1].end_s == pytest.approx(info.duration_s)
    assert all(a.end_s == b.start_s for a, b in zip(clips, clips[1:]))
    assert all(c.duration_s >= 1.0 for c in clips)
    with AudioTrack.open(path, info) as track:
        lengths = [len(track.slice(c.start_s, c.end_s)) for c in clips]
        loud = max(float(np.abs(track.slice(c.start_s, c.end_s)).max()) for c in clips)
    # the sound may end before the file does (retalking_face4: 57 ms earlier): it must
    # last as long as ffprobe says the audio stream does, counted from the file's start
    start, duration = (float(x) for x in _ffprobe_csv(
        path, "-select_streams", "a:0", "-show_entries", "stream=start_time,duration"))
    origin = float(_ffprobe_csv(path, "-show_entries", "format=start_time")[0])
    audio_end_s = min(info.duration_s, start - origin + duration)
    one_frame = SR / info.fps
    assert abs(track.num_samples - SR * audio_end_s) <= one_frame
    assert abs(sum(lengths) - SR * audio_end_s) <= one_frame
    assert all(abs(n - SR * c.duration_s) <= 1 for n, c in zip(lengths[:-1], clips))
    # real sound, averaged to mono: a full-scale stereo track would reach 1.41 with
    # ffmpeg's default downmix; resampling a clipped track overshoots a little
    assert 0.01 < loud < 1.1


@pytest.mark.slow
@pytest.mark.parametrize("path", VIDEOS, ids=_ids(VIDEOS))
def test_real_video_frames_match_ffmpegs_own_decoding(path):
    """Frames at mid-frame times equal, pixel for pixel, the frames ffmpeg decodes in order.

    Frame times come from ffprobe, so this checks the reader's timeline too: in
    hamilton_whitehouse_short.mp4 the picture starts 0.84 s after the sound.
    """
    starts = [float(x) for x in _ffprobe_csv(path, "-select_streams", "v:0", "-show_entries",
                                             "frame=best_effort_timestamp_time")]
    origin = float(_ffprobe_csv(path, "-show_entries", "format=start_time")[0])
    picks = sorted({0, 7, len(starts) // 3, len(starts) // 2, len(starts) - 2})
    times = [(starts[i] + starts[i + 1]) / 2 - origin for i in picks]
    select = "+".join(f"eq(n\\,{i})" for i in picks)
    with FrameReader(path) as reader:
        assert reader.start_s == pytest.approx(starts[0] - origin, abs=1e-3)
        got = reader.frames_at(times)
        small = reader.frames_at(times[:2], max_side_px=128)
        h, w = reader.height, reader.width
    raw = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", str(path), "-vf", f"select='{select}'",
         "-vsync", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"],
        check=True, capture_output=True).stdout
    want = np.frombuffer(raw, dtype=np.uint8).reshape(-1, h, w, 3)
    assert len(want) == len(picks)
    assert got.shape == want.shape
    # the same decoder and colour conversion: equal, or off by rounding only
    assert [float(np.abs(a.astype(int) - b).mean()) for a, b in zip(got, want)] == pytest.approx(
        [0.0] * len(picks), abs=0.5)
    assert max(small.shape[1:3]) == 128 and small.shape[0] == 2


@pytest.mark.slow
@pytest.mark.parametrize("path", VIDEOS, ids=_ids(VIDEOS))
def test_real_video_sample_times_cover_every_clip(path):
    info = probe(path)
    with FrameReader(path) as reader:
        for clip in plan_clips(info, "vid", clip_s=3.0):
            times = reader.sample_times(clip, 1.0)
            assert times, clip
            assert all(clip.start_s <= t < clip.end_s for t in times)
            frames = reader.frames_at(times, max_side_px=256)
            assert frames.shape[0] == len(times) and frames.std() > 5  # a picture, not a blank


@pytest.mark.parametrize("path", AUDIO, ids=_ids(AUDIO))
def test_real_audio_file_has_no_video_and_slices_to_its_duration(path):
    info = probe(path)
    assert (info.has_video, info.has_audio) == (False, True)
    clips = plan_clips(info, "aud", clip_s=10.0)
    with AudioTrack.open(path, info) as track:
        lengths = [len(track.slice(c.start_s, c.end_s)) for c in clips]
    assert sum(lengths) == pytest.approx(SR * info.duration_s, abs=2)
    assert all(n == 10 * SR for n in lengths[:-1])
    with pytest.raises(InputError, match="has no video stream"):
        FrameReader(path)


def test_real_mono_16k_audio_is_passed_through_unchanged():
    """jfk.wav is already 16 kHz mono: the track must hold its samples as they are."""
    import soundfile as sf

    path = DATA / "jfk.wav"
    want, sr = sf.read(path, dtype="float32")
    assert sr == SR and want.ndim == 1
    with AudioTrack.open(path) as track:
        got = track.slice(0.0, track.duration_s)
    assert len(got) == len(want)
    assert np.abs(got - want).max() < 1e-6
