"""The web app's file rules and markup, without a browser: uploads, server paths, playback, escaping."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from m3mem.errors import InputError
from ui import media, views
from ui.app import is_loopback, parse_auth, serve


def test_upload_names_lose_their_folders_and_odd_characters():
    assert media.safe_name("../../etc/passwd") == "passwd"
    assert media.safe_name("C:\\Users\\x\\My Talk (final).MP4") == "My_Talk_final.mp4"
    assert media.safe_name("...") == "upload"
    assert "/" not in media.safe_name("a/b/../../c.wav")


def test_an_upload_moves_into_the_store_and_the_same_content_is_kept_once(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    first = tmp_path / "t1" / "talk.mp4"
    first.parent.mkdir()
    first.write_bytes(b"one")
    kept = media.accept_upload(store, first, "../talk.mp4", max_bytes=100)
    assert kept == (store / "uploads" / "talk.mp4").resolve() and kept.read_bytes() == b"one"
    assert not first.exists()
    again = tmp_path / "again.mp4"
    again.write_bytes(b"one")
    assert media.accept_upload(store, again, "talk.mp4", max_bytes=100) == kept
    other = tmp_path / "other.mp4"
    other.write_bytes(b"two")
    second = media.accept_upload(store, other, "talk.mp4", max_bytes=100)
    assert second.name == "talk-2.mp4" and second.read_bytes() == b"two"
    assert sorted(p.name for p in (store / "uploads").iterdir()) == ["talk-2.mp4", "talk.mp4"]


def test_an_upload_over_the_limit_or_empty_is_refused(tmp_path):
    big = tmp_path / "big.mp4"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(InputError, match="over this server's upload limit"):
        media.accept_upload(tmp_path, big, "big.mp4", max_bytes=1024)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        media.accept_upload(tmp_path, empty, "empty.mp4", max_bytes=1024)
    assert not (tmp_path / "uploads" / "big.mp4").exists()


def test_server_paths_stay_inside_the_allowed_folders(tmp_path):
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (allowed / "a.mp4").write_bytes(b"a")
    (allowed / "sub" / "b.wav").write_bytes(b"b")
    (allowed / "notes.txt").write_text("not media")
    (outside / "secret.mp4").write_bytes(b"s")
    os.symlink(outside / "secret.mp4", allowed / "link.mp4")
    os.symlink(outside, allowed / "linkdir")
    roots = [allowed.resolve()]

    assert media.server_files(str(allowed), roots) == [(allowed / "a.mp4").resolve(), (allowed / "sub" / "b.wav").resolve()]
    assert media.server_files(str(allowed / "sub" / "b.wav"), roots) == [(allowed / "sub" / "b.wav").resolve()]
    for bad in (str(outside / "secret.mp4"), str(allowed / "link.mp4"), str(allowed / "linkdir"),
                str(allowed / ".." / "outside" / "secret.mp4"), "/etc/passwd"):
        with pytest.raises(InputError, match="outside the folders"):
            media.server_files(bad, roots)
    with pytest.raises(InputError, match="absolute path"):
        media.server_files("allowed/a.mp4", roots)
    with pytest.raises(InputError, match="--allow"):
        media.server_files(str(allowed / "a.mp4"), [])


def test_only_loopback_may_go_without_a_login():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert parse_auth("ann:secret:with:colons") == ("ann", "secret:with:colons")
    for bad in ("ann", ":pw", "ann:"):
        with pytest.raises(InputError):
            parse_auth(bad)
    with pytest.raises(InputError, match="--auth"):
        serve("/nonexistent-store", host="0.0.0.0", auth=None)


def test_markup_escapes_names_lines_and_file_names():
    hostile = '<img src=x onerror="alert(1)">'
    html = views.people([{"id": "character_1", "name": hostile, "faces": [("face_1", None)],
                          "voices": [], "appearances": [{"video": hostile, "start": 0, "end": 1, "kind": "face"}]}])
    html += views.answer(hostile, hostile, [], [{"round": 1, "action": "search", "query": hostile,
                                                  "clips": [{"video": hostile, "start": 0, "end": 1, "lines": [hostile]}]}])
    html += views.library([{"id": 1, "name": hostile, "path": hostile, "duration_s": 3.0, "status": "failed",
                            "error": hostile, "clips": []}])
    html += views.timeline(hostile, 3.0, [(hostile, [(0.0, 1.0, "face")])], [])
    assert "<img src=x" not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed")
def test_a_playable_source_is_served_at_the_clip_start_and_others_become_excerpts(tmp_path, shared_data):
    store = tmp_path / "store"
    store.mkdir()
    wav = shared_data / "jfk.wav"
    mpg = shared_data / "grid" / "bbaf2n.mpg"
    clip = media.clip_media(store, str(wav), 1, 5.0, 10.0, servable=[shared_data])
    assert (clip.path, clip.start_s, clip.end_s, clip.kind) == (wav.resolve(), 5.0, 10.0, "audio")
    # the same file outside the servable folders is cut to an excerpt inside the store
    clip = media.clip_media(store, str(wav), 1, 5.0, 10.0, servable=[store / "uploads"])
    assert clip.path.parent == (store / media.CACHE).resolve() and clip.start_s == 0.0 and clip.kind == "audio"
    assert abs(_duration(clip.path) - 5.0) < 0.05
    # MPEG-1 does not play in browsers: an H.264 excerpt of the clip
    clip = media.clip_media(store, str(mpg), 2, 1.0, 3.0, servable=[shared_data])
    assert clip.kind == "video" and clip.path.suffix == ".mp4" and clip.start_s == 0.0
    assert abs(_duration(clip.path) - 2.0) < 0.1
    assert _codec(clip.path) == "h264"
    sample = media.voice_sample_wav(str(wav), 0.3, 9.0, max_s=2.0)
    assert sample[:4] == b"RIFF" and abs((len(sample) - 44) / 2 / media.SAMPLE_RATE - 2.0) < 0.01


def _duration(path: Path) -> float:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout)


def _codec(path: Path) -> str:
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name",
                          "-of", "csv=p=0", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()
