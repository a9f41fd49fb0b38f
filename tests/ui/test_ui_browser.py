"""The web app in a real browser: Debian's Chromium, headless, driven by Playwright.

``m3mem serve`` runs as a user would start it. Through the page: a GRID video is
uploaded (with a broken file beside it) and jfk.wav ingested from an allowed
server folder; a question is answered with its rounds and cited clips that play
from their start; a person is renamed and the new name comes back in an answer;
the pictures show them; they are forgotten and no answer finds them again.
Screenshots go to ``$M3MEM_TEST_OUTPUT/ui`` (default ``test-output/ui``).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ui, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GRID = "bbaf2n.mpg"
NEW_NAME = "Grid Speaker"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
INGEST_TIMEOUT_MS = 240_000


def _chromium() -> str:
    for candidate in (os.environ.get("M3MEM_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("Chromium is not installed (apt-get install chromium, or set $M3MEM_CHROMIUM)")


@pytest.fixture(scope="module")
def shots() -> Path:
    out = Path(os.environ.get("M3MEM_TEST_OUTPUT", REPO / "test-output")) / "ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _start(store: Path, extra: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """``m3mem serve`` on a free loopback port, once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "m3mem", "serve", "--store", str(store), "--port", str(port),
                                 *extra], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"m3mem serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return proc, url
        except urllib.error.HTTPError:
            return proc, url  # it answers (a login page may say 401)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("m3mem serve did not answer within 120 s")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_data, shots):
    """5-second clips, so that a cited clip can start later than 0; uploads up to 2 MB."""
    pytest.importorskip("gradio")
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    store = tmp_path_factory.mktemp("ui") / "store"
    proc, url = _start(store, ["--allow", str(shared_data), "--max-upload-mb", "2", "--set", "clip_seconds=5"],
                       shots / "server.log")
    yield url, store
    _stop(proc)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(server, browser, shared_data, shots, tmp_path_factory):
    """A page on a library holding the GRID video (uploaded) and jfk.wav (from a server folder)."""
    url, store = server
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(30_000)
    page.goto(url)
    page.wait_for_selector("#library [data-library-empty]")

    broken = tmp_path_factory.mktemp("upload") / "broken.mp4"
    broken.write_text("this is not a video")
    page.set_input_files("#upload-files input[type=file]", [str(shared_data / "grid" / GRID), str(broken)])
    page.click("#ingest-uploads")
    page.wait_for_selector("#ingest-status [data-ingest=running]")
    # live progress: a bar for the file being ingested appears before the end
    page.wait_for_selector("#ingest-status [data-progress]", timeout=INGEST_TIMEOUT_MS)
    page.wait_for_selector("#ingest-status [data-ingest=finished]", timeout=INGEST_TIMEOUT_MS)
    failed = page.locator("#ingest-status tr[data-status=failed]")
    assert failed.count() == 1 and "broken.mp4" in failed.inner_text()
    assert "not a readable video or audio file" in failed.inner_text()

    page.fill("#server-path textarea", "/etc/passwd")
    page.click("#ingest-path")
    page.wait_for_selector("#ingest-status [data-refused]")
    assert "outside the folders this server allows" in page.inner_text("#ingest-status")

    page.fill("#server-path textarea", str(shared_data / "jfk.wav"))
    page.click("#ingest-path")
    page.wait_for_selector("#ingest-status [data-ingest=running]")
    page.wait_for_selector("#ingest-status [data-ingest=finished]", timeout=INGEST_TIMEOUT_MS)
    page.wait_for_selector("#library [data-name='jfk.wav']")
    _shot(page, shots, "01-library.png")
    yield page
    page.close()


def _settled(page) -> None:
    """Wait until no panel shows Gradio's busy overlay (before a screenshot or a read)."""
    page.wait_for_function("() => document.querySelectorAll("
                           "'[data-testid=status-tracker].pending, [data-testid=status-tracker].generating').length === 0")


def _shot(page, shots: Path, name: str) -> None:
    _settled(page)
    page.screenshot(path=str(shots / name), full_page=True)


def _choose(page, dropdown: str, label: str) -> None:
    page.click(f"{dropdown} input")
    page.locator(dropdown).get_by_role("option", name=label, exact=True).click()


def _ask(page, question: str) -> str:
    page.get_by_role("tab", name="Ask").click()
    page.fill("#question textarea", question)
    # answers are numbered: wait for one newer than the answer on show
    last = page.evaluate("() => Number((document.querySelector('#answer [data-answer]') || {dataset: {answer: 0}})"
                         ".dataset.answer)")
    page.click("#ask-btn")
    page.wait_for_function("n => { const a = document.querySelector('#answer [data-answer]');"
                           " return a && Number(a.dataset.answer) > n; }", arg=last)
    assert page.inner_text("#answer [data-answer] > p") == question
    return page.inner_text("#answer [data-answer-text]")


def _check_plays_from_start(page, media) -> dict:
    """The player starts at the clip's start, then plays: not paused, its clock moving."""
    media.evaluate("m => new Promise(r => m.readyState >= 1 ? r() : m.addEventListener('loadedmetadata', r, {once: true}))")
    state = media.evaluate("m => ({start: parseFloat(m.dataset.start), t: m.currentTime, tag: m.tagName,"
                           " width: m.videoWidth || 0, error: m.error && m.error.code})")
    assert state["error"] is None
    assert abs(state["t"] - state["start"]) < 0.3, state
    media.evaluate("m => m.play()")
    media.evaluate("(m, t0) => new Promise((ok, fail) => { const s = Date.now(); (function poll() {"
                   " if (!m.paused && m.currentTime > t0 + 0.3) return ok();"
                   " if (m.error || Date.now() - s > 20000) return fail(new Error('did not play: ' + m.currentTime));"
                   " setTimeout(poll, 100); })(); })", state["start"])
    return state


def test_the_library_shows_videos_clips_status_and_failures(page, server):
    url, store = server
    rows = {r.get_attribute("data-name"): r.get_attribute("data-status")
            for r in page.locator("#library tr[data-video]").all()}
    assert rows == {GRID: "done", "jfk.wav": "done"}
    assert "1 of 1 done" in page.inner_text(f"#library tr[data-name='{GRID}']")
    assert "3 of 3 done" in page.inner_text("#library tr[data-name='jfk.wav']")
    # uploads land in the store's folder, and no bigger than the limit (2 MB here)
    assert (store / "uploads" / GRID).is_file()
    assert (store / "uploads" / ".incoming").is_dir()
    response = page.request.post(url + "gradio_api/upload", multipart={
        "files": {"name": "big.mp4", "mimeType": "video/mp4", "buffer": b"\0" * (3 * 2**20)}})
    assert response.status == 413


def test_an_answer_shows_its_rounds_and_cited_clips_that_play_from_their_start(page, shots):
    answer = _ask(page, "What did the speaker ask people to do for their country?")
    assert answer.strip() and "Nothing in memory" not in answer
    rounds = page.locator("#answer [data-round]")
    assert rounds.count() >= 2
    assert page.locator("#answer [data-round] [data-found]").count() >= 1
    assert "query" in rounds.first.inner_text()
    players = page.locator("#answer [data-cited] video, #answer [data-cited] audio")
    assert players.count() >= 1
    starts = [_check_plays_from_start(page, players.nth(i))["start"] for i in range(players.count())]
    _shot(page, shots, "02-ask.png")
    print("cited clips start at", starts)


def test_people_have_face_crops_and_voice_samples(page, shots):
    page.get_by_role("tab", name="People").click()
    page.wait_for_selector("#people [data-person] img[data-face]")
    sample = page.locator("#people [data-voice] audio").first
    sample.evaluate("a => new Promise(r => { a.addEventListener('loadedmetadata', r, {once: true}); a.load(); })")
    assert sample.evaluate("a => a.duration") > 0.5
    size = page.locator("#people img[data-face]").first.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    assert min(size) >= 32


def test_a_renamed_person_is_named_in_the_next_answer(page, shots):
    page.get_by_role("tab", name="People").click()
    card = page.locator("#people [data-person]:has(img[data-face])").first
    person = card.get_attribute("data-person")
    _choose(page, "#person", person)
    page.fill("#new-name textarea", NEW_NAME)
    page.click("#rename-btn")
    page.wait_for_selector(f"#people [data-person='{person}'][data-name='{NEW_NAME}']")
    _shot(page, shots, "03-people-renamed.png")

    answer = _ask(page, f"When is {NEW_NAME} visible?")
    assert NEW_NAME in answer
    grid_clip = page.locator(f"#answer [data-cited='{GRID}'] video")
    assert grid_clip.count() == 1
    state = _check_plays_from_start(page, grid_clip)
    assert state["tag"] == "VIDEO" and state["width"] == 360  # real frames decoded, GRID is 360x288
    _shot(page, shots, "04-answer-with-name.png")


def test_pictures_show_who_appears_when_and_the_graph_around_a_person(page, shots):
    page.get_by_role("tab", name="People").click()
    card = page.locator("#people [data-person]:has(img[data-face])").first
    person, name = card.get_attribute("data-person"), card.get_attribute("data-name")
    label = f"{name} ({person})" if name else person
    page.get_by_role("tab", name="Pictures").click()
    _choose(page, "#timeline-video", GRID)
    page.wait_for_selector(f"#timeline svg[data-timeline='{GRID}'] g[data-row='{name or person}'] rect")
    _choose(page, "#graph-center", f"person: {label}")
    page.wait_for_selector(f"#graph svg[data-graph='{person}']")
    kinds = [g.get_attribute("data-kind") for g in page.locator("#graph g[data-node]").all()]
    assert {"character", "face", "episodic", "clip"} <= set(kinds)
    assert page.locator("#graph g[data-kind=face] image").count() >= 1
    _shot(page, shots, "05-pictures.png")


def test_two_people_merged_by_hand_become_one_and_split_apart_again(page, shots):
    page.get_by_role("tab", name="People").click()
    seen = page.locator("#people [data-person]:has(img[data-face])").first
    heard = page.locator("#people [data-person]:not(:has(img[data-face]))").first
    person, other = seen.get_attribute("data-person"), heard.get_attribute("data-person")
    moved = heard.locator("[data-voice]").first.get_attribute("data-voice")
    _choose(page, "#person", _label(seen))
    _choose(page, "#merge-other", _label(heard))
    page.click("#merge-btn")
    page.wait_for_selector(f"#people [data-person='{other}']", state="detached")
    assert page.inner_text("#people-msg [data-message]") == f"merged into {person}"
    merged = page.locator(f"#people [data-person='{person}']")
    assert merged.locator(f"[data-voice='{moved}']").count() == 1
    _shot(page, shots, "06-merged.png")

    _choose(page, "#person", _label(merged))
    page.locator("#split-parts").get_by_label(moved, exact=True).check()
    page.click("#split-btn")
    # the cards are redrawn after the message, so once they show the split the message is this one's
    page.wait_for_selector(f"#people [data-person]:not([data-person='{person}']) [data-voice='{moved}']")
    assert page.inner_text("#people-msg [data-message]").startswith(f"{moved} now form")
    assert page.locator(f"#people [data-person='{person}'] [data-voice='{moved}']").count() == 0
    assert page.locator(f"#people [data-person='{person}'] img[data-face]").count() == 1


def _label(card) -> str:
    """The choice that names a person card in the dropdowns."""
    person, name = card.get_attribute("data-person"), card.get_attribute("data-name")
    return f"{name} ({person})" if name else person


def test_a_forgotten_person_is_gone_from_people_answers_and_the_store(page, server, shots):
    from m3mem.store import Store

    _, store_dir = server
    page.get_by_role("tab", name="People").click()
    card = page.locator("#people [data-person]:has(img[data-face])").first
    person, name = card.get_attribute("data-person"), card.get_attribute("data-name")
    faces = [i.get_attribute("data-face") for i in card.locator("img[data-face]").all()]
    _choose(page, "#person", f"{name} ({person})" if name else person)
    page.click("#forget-btn")  # not confirmed: refused
    page.wait_for_selector("#people-msg [data-message=error]")
    page.check("#forget-confirm input")
    page.click("#forget-btn")
    page.wait_for_selector(f"#people [data-person='{person}']", state="detached")
    assert page.inner_text("#people-msg [data-message]").startswith(f"forgot {person}")
    assert page.locator("#people img[data-face]").count() == 0
    _shot(page, shots, "07-forgotten.png")

    question = f"When is {name or person} visible?"
    answer = _ask(page, question)
    rest = page.inner_text("#answer").replace(question, "")  # all but the echoed question
    assert (name or person) not in answer and (name or person) not in rest
    assert page.locator(f"#answer [data-cited='{GRID}'], #answer [data-found='{GRID}']").count() == 0
    _shot(page, shots, "08-answer-after-forget.png")

    with Store.open(store_dir, create=False, read_only=True) as store:
        for face in faces:
            assert store.node(face) is None and store.best_crop(face) is None
        assert store.execute("SELECT COUNT(*) FROM embeddings WHERE space='face'").fetchone()[0] == 0
        texts = " ".join(t for (t,) in store.execute("SELECT text FROM nodes WHERE text IS NOT NULL"))
        assert not any(f in texts for f in faces)


def test_with_a_login_nothing_is_served_before_signing_in(tmp_path, shared_data, shots):
    """Pages, the API and media files all sit behind --auth."""
    pytest.importorskip("gradio")
    proc, url = _start(tmp_path / "store", ["--auth", "ann:s3cret", "--allow", str(shared_data)],
                       shots / "server-auth.log")
    media_url = f"{url}gradio_api/file={shared_data / 'jfk.wav'}"
    try:
        for target in (media_url, url + "config"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(target, timeout=10)
            assert refused.value.code in (401, 403), target
        jar = urllib.request.HTTPCookieProcessor()
        opener = urllib.request.build_opener(jar)
        form = "username=ann&password=wrong".encode()
        with pytest.raises(urllib.error.HTTPError):
            opener.open(url + "login", data=form, timeout=10)
        opener.open(url + "login", data=b"username=ann&password=s3cret", timeout=10).read()
        with opener.open(media_url, timeout=10) as r:
            assert r.status == 200 and r.read(4) == b"RIFF"
    finally:
        _stop(proc)
