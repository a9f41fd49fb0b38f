"""Split stage on small media that the tests make with ffmpeg: clip plan, probe, frames
by timestamp (constant and variable frame rate), audio decoded once, bad input, clip files."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from m3mem.errors import ConfigError, InputError
from m3mem.records import Clip, VideoInfo
from pipelines.split import AudioTrack, FrameReader, plan_clips, probe, write_clip_file

if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
    pytest.skip("ffmpeg/ffprobe are not installed", allow_module_level=True)

FPS = 25
# Each frame paints its own frame number n (counted at 25 fps, before any frame is
# dropped) into its colour: r, g, b hold n's base-16 digits, so a decoded pixel says
# exactly which frame it came from.
NUMBERED = (
    "format=rgb24,geq=r='mod(N,16)*16+8':g='mod(floor(N/16),16)*16+8':b='mod(floor(N/256),16)*16+8'"
)


def ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", *args], check=True, capture_output=True)


def frame_number(frame: np.ndarray) -> int:
    r, g, b = (int(round((float(np.median(frame[..., c])) - 8) / 16)) for c in range(3))
    return r + 16 * g + 256 * b


def numbered_video(out: Path, seconds: float, keep: str | None = None, size: str = "64x48",
                   extra: tuple[str, ...] = ()) -> Path:
    """H.264 (B-frames, a keyframe every 2 s) whose frames carry their number; ``keep``
    is an ffmpeg select expression that drops frames to make variable frame rate."""
    vf = NUMBERED + (f",select='{keep}'" if keep else "")
    ffmpeg("-f", "lavfi", "-i", f"color=c=black:s={size}:r={FPS}:d={seconds}", "-vf", vf,
           *(("-vsync", "vfr") if keep else ()), *extra,
           "-c:v", "libx264", "-g", "50", "-bf", "2", "-pix_fmt", "yuv420p", str(out))
    return out


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="module")
def numbered(media) -> Path:
    return numbered_video(media / "numbered.mp4", 12)


# --- clip plan --------------------------------------------------------------------


def _info(duration_s: float) -> VideoInfo:
    return VideoInfo("x.mp4", duration_s, True, True, 25.0, 64, 48)


def _bounds(clips: list[Clip]) -> list[tuple[float, float]]:
    return [(c.start_s, c.end_s) for c in clips]


@pytest.mark.parametrize(
    "duration, bounds",
    [
        (65.0, [(0, 30), (30, 60), (60, 65)]),
        (60.4, [(0, 30), (30, 60.4)]),  # a 0.4 s remainder joins the previous clip
        (60.0, [(0, 30), (30, 60)]),  # no empty trailing clip
        (61.0, [(0, 30), (30, 60), (60, 61)]),  # a 1 s remainder is a clip of its own
        (10.0, [(0, 10)]),
        (0.5, [(0, 0.5)]),  # a file shorter than a second is still one clip
    ],
)
def test_plan_clips_windows_cover_the_file_without_empty_or_sub_second_tails(duration, bounds):
    clips = plan_clips(_info(duration), "vid")
    assert _bounds(clips) == [pytest.approx(b) for b in bounds]
    assert [c.index for c in clips] == list(range(len(bounds)))
    assert all(c.video_id == "vid" for c in clips)


def test_plan_clips_honours_the_clip_length():
    clips = plan_clips(_info(25.0), "vid", clip_s=10)
    assert _bounds(clips) == [(0, 10), (10, 20), (20, 25)]


@pytest.mark.parametrize("clip_s", [0, -5, float("nan")])
def test_plan_clips_rejects_a_clip_length_that_is_not_positive(clip_s):
    with pytest.raises(ConfigError, match="clip length"):
        plan_clips(_info(10.0), "vid", clip_s=clip_s)


def test_generated_65_second_video_splits_into_30_30_5(media):
    path = media / "v65.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=gray:s=32x32:r=10:d=65", "-f", "lavfi", "-i",
           "sine=f=440:sample_rate=16000:d=65", "-c:v", "libx264", "-c:a", "aac", "-shortest", str(path))
    info = probe(path)
    assert info.duration_s == pytest.approx(65.0, abs=0.05)
    assert (info.has_video, info.has_audio, info.width, info.height) == (True, True, 32, 32)
    assert info.fps == pytest.approx(10.0)
    clips = plan_clips(info, "v65")
    assert [(c.start_s, c.end_s) for c in clips[:2]] == [(0, 30), (30, 60)]
    assert clips[2].start_s == 60 and clips[2].end_s == pytest.approx(65.0, abs=0.05)


def test_generated_60_4_second_video_gives_two_clips_ending_at_60_4(media):
    path = media / "v60_4.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=gray:s=32x32:r=10:d=60.4", "-c:v", "libx264", str(path))
    info = probe(path)
    clips = plan_clips(info, "v")
    assert len(clips) == 2
    assert clips[1].start_s == 30 and clips[1].end_s == pytest.approx(60.4, abs=1e-3)


def test_generated_10_second_video_is_one_clip(numbered, media):
    path = media / "v10.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=gray:s=32x32:r=10:d=10", "-c:v", "libx264", str(path))
    clips = plan_clips(probe(path), "v")
    assert len(clips) == 1 and clips[0].start_s == 0 and clips[0].end_s == pytest.approx(10.0)


# --- frames -----------------------------------------------------------------------


def test_frames_at_given_times_are_the_frames_on_screen_then(numbered):
    times = [0.01, 1.5, 2.0, 3.99, 7.33, 11.98]  # 2.0 is a keyframe, 3.99 the frame before one
    with FrameReader(numbered) as reader:
        assert reader.backend == "decord" and len(reader.frame_starts_s) == 12 * FPS
        frames = reader.frames_at(times)
    assert frames.dtype == np.uint8 and frames.shape == (len(times), 48, 64, 3)
    assert [frame_number(f) for f in frames] == [math.floor(t * FPS + 1e-9) for t in times]


@pytest.mark.parametrize(
    "suffix, codec, backend",
    [
        ("mkv", "libx264", "decord"),
        ("webm", "libvpx-vp9", "decord"),
        ("avi", "mpeg4", "decord"),
        # no frame index in MPEG program/transport streams: decord seeks land frames
        # off there, so these go through ffmpeg
        ("ts", "libx264", "ffmpeg"),
        ("mpg", "mpeg2video", "ffmpeg"),
    ],
)
def test_frames_are_exact_in_every_common_container(media, suffix, codec, backend):
    path = media / f"numbered_{codec}.{suffix}"
    ffmpeg("-f", "lavfi", "-i", f"color=c=black:s=64x48:r={FPS}:d=8", "-vf", NUMBERED, "-c:v", codec,
           "-g", "50", "-q:v", "2", "-pix_fmt", "yuv420p", str(path))
    times = [0.02, 5.33, 2.5, 7.9, 4.0]
    with FrameReader(path) as reader:
        assert reader.backend == backend
        got = [frame_number(f) for f in reader.frames_at(times)]
    assert got == [math.floor(t * FPS + 1e-9) for t in times]


def test_the_ffmpeg_pass_agrees_with_seeking_before_between_and_after_frames(numbered):
    times = [-1.0, 0.0, 0.03, 6.5, 6.5, 3.0, 11.99, 30.0]
    with FrameReader(numbered, backend="ffmpeg") as slow, FrameReader(numbered) as fast:
        a, b = slow.frames_at(times), fast.frames_at(times)
    assert [frame_number(f) for f in a] == [0, 0, 0, 162, 162, 75, 299, 299]
    assert np.array_equal(a, b)
    with FrameReader(numbered, backend="ffmpeg") as slow:
        # only times past the end: the seek finds nothing, the last frame is still on screen
        assert [frame_number(f) for f in slow.frames_at([40.0, 50.0])] == [299, 299]


def test_unknown_frame_backend_is_a_config_error(numbered):
    with pytest.raises(ConfigError, match="unknown frame backend"):
        FrameReader(numbered, backend="opencv")


def test_frames_come_back_in_the_order_asked_with_repeats(numbered):
    times = [9.5, 0.5, 9.5, 4.2]
    with FrameReader(numbered) as reader:
        frames = reader.frames_at(times)
    assert [frame_number(f) for f in frames] == [237, 12, 237, 105]


def test_frames_are_downscaled_keeping_aspect_and_never_upscaled(media):
    path = numbered_video(media / "wide.mp4", 2, size="320x180")
    with FrameReader(path) as reader:
        small = reader.frames_at([0.5, 1.5], max_side_px=160)
        same = reader.frames_at([0.5], max_side_px=1000)
        none = reader.frames_at([], max_side_px=160)
    assert small.shape == (2, 90, 160, 3)
    assert [frame_number(f) for f in small] == [12, 37]
    assert same.shape == (1, 180, 320, 3)
    assert none.shape == (0, 90, 160, 3)


def test_sample_times_are_mid_step_inside_the_clip(numbered):
    with FrameReader(numbered) as reader:
        assert reader.sample_times(Clip("v", 0, 0.0, 10.0), 1.0) == pytest.approx(
            [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5])
        assert reader.sample_times(Clip("v", 1, 10.0, 12.0), 2.0) == pytest.approx([10.25, 10.75, 11.25, 11.75])
        # 5.7 s at 1 fps: 5.5 is still inside the clip
        assert len(reader.sample_times(Clip("v", 0, 0.0, 5.7), 1.0)) == 6
        # a clip shorter than one step still gets a frame, from its middle
        assert reader.sample_times(Clip("v", 0, 4.0, 4.4), 1.0) == pytest.approx([4.2])


def test_variable_frame_rate_maps_times_through_frame_timestamps(media):
    # 25 fps for 0-4 s, 2.5 fps for 4-8 s, 25 fps again for 8-12 s
    path = numbered_video(media / "vfr.mp4", 12, keep="lt(n\\,100)+gte(n\\,200)+not(mod(n\\,10))")
    kept = sorted(set(range(100)) | set(range(100, 200, 10)) | set(range(200, 300)))
    times = [0.5, 3.9, 4.05, 5.3, 7.95, 8.02, 10.0, 11.5]
    with FrameReader(path) as reader:
        assert len(reader.frame_starts_s) == len(kept)
        got = [frame_number(f) for f in reader.frames_at(times)]
    with FrameReader(path, backend="ffmpeg") as reader:
        assert [frame_number(f) for f in reader.frames_at(times)] == got
    on_screen = [max(n for n in kept if n <= math.floor(t * FPS + 1e-9)) for t in times]
    assert got == on_screen
    # the check has teeth: a constant-rate mapping (index = t * average fps) picks other frames
    avg_fps = len(kept) / 12.0
    naive = [kept[min(len(kept) - 1, int(t * avg_fps))] for t in times]
    assert sum(a != b for a, b in zip(naive, on_screen)) >= 4


def test_a_video_that_starts_after_the_audio_is_placed_on_the_file_timeline(media):
    # the audio starts at 0, the picture 1 s later: frame n is on screen at 1 + n / 25
    path = media / "late_video.mp4"
    ffmpeg("-itsoffset", "1", "-f", "lavfi", "-i", f"color=c=black:s=64x48:r={FPS}:d=4",
           "-f", "lavfi", "-i", "sine=f=440:sample_rate=16000:d=5",
           "-vf", NUMBERED, "-vsync", "passthrough",  # keep the gap, do not fill it with copies
           "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", str(path))
    info = probe(path)
    for backend in ("decord", "ffmpeg"):
        with FrameReader(path, backend=backend) as reader:
            assert reader.start_s == pytest.approx(1.0, abs=0.03)
            frames = reader.frames_at([2.02, 4.5])  # mid-frame: 25.5 and 87.5 frames in
            # no sample before the picture starts
            assert min(reader.sample_times(Clip("v", 0, 0.0, info.duration_s), 1.0)) >= 1.0
        assert [frame_number(f) for f in frames] == [25, 87], backend


def test_a_clip_past_the_end_of_the_picture_gets_no_frames(media):
    path = media / "short_picture.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=gray:s=32x32:r=10:d=2", "-f", "lavfi", "-i",
           "sine=f=440:sample_rate=16000:d=4", "-c:v", "libx264", "-c:a", "aac", str(path))
    with FrameReader(path) as reader:
        assert reader.sample_times(Clip("v", 1, 2.5, 4.0), 1.0) == []
        assert reader.sample_times(Clip("v", 0, 0.0, 4.0), 1.0) == pytest.approx([0.5, 1.5])


def test_frame_reader_refuses_a_file_without_video(media):
    path = media / "tone_only.wav"
    ffmpeg("-f", "lavfi", "-i", "sine=f=440:sample_rate=16000:d=1", str(path))
    with pytest.raises(InputError, match="has no video stream"):
        FrameReader(path)


# --- audio ------------------------------------------------------------------------


def test_a_video_without_audio_has_no_audio_track(numbered):
    info = probe(numbered)
    assert info.has_video and not info.has_audio
    assert AudioTrack.open(numbered, info) is None
    assert AudioTrack.open(numbered) is None  # probes by itself when not told


def test_audio_only_wav_slices_have_the_right_length_and_content(media):
    # 44.1 kHz stereo in, 16 kHz mono out: silence for 2 s, then a 440 Hz tone
    path = media / "tone.wav"
    ffmpeg("-f", "lavfi", "-i", "aevalsrc='if(gte(t,2),0.5*sin(2*PI*440*t),0)|0':s=44100:d=7.3", str(path))
    info = probe(path)
    assert (info.has_video, info.has_audio, info.fps, info.width) == (False, True, 0.0, 0)
    assert info.duration_s == pytest.approx(7.3, abs=1e-3)
    clips = plan_clips(info, "tone", clip_s=3.0)
    assert _bounds(clips) == [(0, 3), (3, 6), (6, pytest.approx(7.3))]
    with AudioTrack.open(path, info) as track:
        assert track.sr == 16000
        assert track.duration_s == pytest.approx(7.3, abs=1 / 16000)
        slices = [track.slice(c.start_s, c.end_s) for c in clips]
        assert [len(s) for s in slices] == [48000, 48000, 20800]
        assert all(s.dtype == np.float32 for s in slices)
        silent, tone = track.slice(0.0, 1.9), track.slice(2.1, 3.0)
    assert np.abs(silent).max() < 1e-3
    # channels are averaged: half of the left channel's 0.5 amplitude
    assert np.abs(tone).max() == pytest.approx(0.25, abs=0.02)
    spectrum = np.abs(np.fft.rfft(tone))
    assert np.fft.rfftfreq(len(tone), 1 / 16000)[spectrum.argmax()] == pytest.approx(440, abs=2)


def test_a_loud_stereo_track_is_averaged_to_mono_without_exceeding_full_scale(media):
    path = media / "loud_stereo.wav"
    ffmpeg("-f", "lavfi", "-i", "aevalsrc='0.9*sin(2*PI*440*t)|0.9*sin(2*PI*440*t)':s=48000:d=1", str(path))
    with AudioTrack.open(path) as track:
        assert np.abs(track.slice(0.0, 1.0)).max() == pytest.approx(0.9, abs=0.01)


def test_audio_that_starts_late_is_padded_onto_the_file_timeline(media):
    path = media / "late_audio.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=gray:s=32x32:r=10:d=4", "-itsoffset", "1", "-f", "lavfi", "-i",
           "sine=f=440:sample_rate=16000:d=3", "-c:v", "libx264", "-c:a", "pcm_s16le", str(path.with_suffix(".mov")))
    info = probe(path.with_suffix(".mov"))
    with AudioTrack.open(path.with_suffix(".mov"), info) as track:
        assert track.duration_s == pytest.approx(info.duration_s, abs=0.05)
        assert np.abs(track.slice(0.0, 0.95)).max() < 1e-3
        assert np.abs(track.slice(1.05, 2.0)).max() > 0.05


def test_audio_track_reads_slices_past_the_end_short_and_cleans_up(media, tmp_path):
    path = media / "tone2.wav"
    ffmpeg("-f", "lavfi", "-i", "sine=f=440:sample_rate=16000:d=2", str(path))
    cache = tmp_path / "cache"
    track = AudioTrack.open(path, cache_dir=cache)
    raws = list(cache.iterdir())
    assert len(raws) == 1 and raws[0].stat().st_size == 2 * 16000 * 4
    assert len(track.slice(1.5, 5.0)) == 8000
    assert len(track.slice(3.0, 4.0)) == 0
    assert len(track.slice(1.0, 0.5)) == 0
    one = track.slice(0.0, 1.0)
    one[:] = 0  # a copy: the caller may write to it
    assert np.abs(track.slice(0.0, 1.0)).max() > 0.1  # ffmpeg's sine is 1/8 of full scale
    track.close()
    assert list(cache.iterdir()) == []
    with pytest.raises(ValueError, match="closed"):
        track.slice(0.0, 1.0)
    track.close()  # closing twice is harmless


def test_cover_art_is_not_video(media):
    cover = media / "cover.png"
    ffmpeg("-f", "lavfi", "-i", "color=c=red:s=32x32", "-frames:v", "1", str(cover))
    path = media / "song.m4a"
    ffmpeg("-f", "lavfi", "-i", "sine=f=440:d=3", "-i", str(cover), "-map", "0:a", "-map", "1:v",
           "-c:a", "aac", "-c:v", "png", "-disposition:v:0", "attached_pic", str(path))
    info = probe(path)
    assert (info.has_video, info.has_audio) == (False, True)
    assert info.duration_s == pytest.approx(3.0, abs=0.05)


# --- bad input --------------------------------------------------------------------


def test_missing_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match=r"nope\.mp4: no such file"):
        probe(tmp_path / "nope.mp4")


def test_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        probe(tmp_path)


def test_zero_byte_file_is_an_input_error(tmp_path):
    path = tmp_path / "empty.mp4"
    path.touch()
    with pytest.raises(InputError, match=r"empty\.mp4 is empty"):
        probe(path)


def test_text_file_named_mp4_is_an_input_error_with_ffprobes_reason(tmp_path):
    path = tmp_path / "notes.mp4"
    path.write_text("this is a shopping list, not a video\n" * 20)
    with pytest.raises(InputError) as e:
        probe(path)
    msg = str(e.value)
    assert "notes.mp4 is not a readable video or audio file (ffprobe: " in msg
    assert "Invalid data" in msg and str(path.resolve()) + ":" not in msg.split("(ffprobe:")[1]


def test_truncated_mp4_is_an_input_error(numbered, tmp_path):
    data = numbered.read_bytes()
    # ffmpeg writes the index (moov) last, so the first half has none: probe fails
    half = tmp_path / "half.mp4"
    half.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"half\.mp4 is not a readable video or audio file \(ffprobe: .*moov"):
        probe(half)
    # with the index first (web-optimised files), probe succeeds and reading the frames fails
    fast = tmp_path / "fast.mp4"
    ffmpeg("-i", str(numbered), "-c", "copy", "-movflags", "+faststart", str(fast))
    fast_half = tmp_path / "fast_half.mp4"
    fast_half.write_bytes(fast.read_bytes()[: fast.stat().st_size // 2])
    assert probe(fast_half).has_video
    with pytest.raises(InputError, match=r"fast_half\.mp4: cannot read video frames .*damaged or truncated"):
        FrameReader(fast_half)


def test_a_frame_that_fails_to_decode_is_an_input_error_naming_file_and_time(numbered):
    import decord

    class Damaged:
        """Decodes like the real reader until frame 150 (6 s), then fails as decord does."""

        def __init__(self, vr):
            self.vr = vr

        def __getattr__(self, name):
            return getattr(self.vr, name)

        def get_batch(self, indices):
            if max(indices) >= 150:
                raise decord.DECORDError("[10:00:00] /src/video/video_reader.cc:1: Error: av_read_frame failed")
            return self.vr.get_batch(indices)

    with FrameReader(numbered) as reader:
        reader._vr = Damaged(reader._vr)
        assert reader.frames_at([1.0, 5.9]).shape[0] == 2
        with pytest.raises(InputError, match=r"numbered\.mp4: cannot decode the frame at 7\.500 s \(Error: av_read"):
            reader.frames_at([1.0, 5.9, 7.5, 9.5])


def test_file_without_video_or_audio_is_an_input_error(tmp_path):
    path = tmp_path / "subs.srt"
    path.write_text("1\n00:00:00,000 --> 00:00:01,000\nhello\n")
    with pytest.raises(InputError, match=r"subs\.srt .*no video or audio stream"):
        probe(path)


def test_still_image_has_no_duration_and_is_an_input_error(media):
    path = media / "still.png"
    ffmpeg("-f", "lavfi", "-i", "color=c=red:s=32x32", "-frames:v", "1", str(path))
    with pytest.raises(InputError, match=r"still\.png has zero or unknown duration"):
        probe(path)


# --- clip files -------------------------------------------------------------------


def test_clip_file_has_the_exact_bounds(numbered, media, tmp_path):
    src = media / "numbered_av.mp4"
    ffmpeg("-i", str(numbered), "-f", "lavfi", "-i", "sine=f=440:sample_rate=16000:d=12",
           "-c:v", "copy", "-c:a", "aac", "-shortest", str(src))
    # 5.0 is not a keyframe (they are every 2 s): a stream copy would start at 4.0
    out = write_clip_file(src, Clip("v", 1, 5.0, 8.0), tmp_path / "clips" / "c1.mp4")
    info = probe(out)
    assert info.has_video and info.has_audio
    assert info.duration_s == pytest.approx(3.0, abs=0.07)
    with FrameReader(out) as reader:
        assert len(reader.frame_starts_s) == 3 * FPS
        first, last = reader.frames_at([0.0, 2.99])
    assert (frame_number(first), frame_number(last)) == (5 * FPS, 8 * FPS - 1)


def test_clip_file_from_a_bad_source_is_an_input_error(tmp_path):
    src = tmp_path / "bad.mp4"
    src.write_text("not a video")
    with pytest.raises(InputError, match=r"bad\.mp4: cannot write clip 0"):
        write_clip_file(src, Clip("v", 0, 0.0, 1.0), tmp_path / "c.mp4")
