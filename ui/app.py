"""The m3mem web app: what the memory holds, and why it answers as it does.

Four tabs over one store: Library (videos, clips, ingestion with live progress),
Ask (the answer, each retrieval round, the cited clips playing from their
start), People (faces, voice samples; rename, merge, split, forget) and
Pictures (a timeline of who is seen and heard when; the graph around a person
or a clip). It is thin: every action calls what the CLI calls (``Memory``,
``m3mem.people``, ``m3mem.forget``); ``ui/media.py`` owns every file it touches.

Two handles on the store: a writer for ingestion and edits (one at a time, so
an edit never races an ingestion's identity rebuild) and a read-only reader for
asking, so questions are answered while a video is being ingested.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Iterator

from m3mem.config import Config
from m3mem.errors import InputError, M3memError
from pipelines.memorize import fmt_time
from ui import media, pictures, views

log = logging.getLogger(__name__)

DEFAULT_PORT = 7860
DEFAULT_MAX_UPLOAD_MB = 2048
BUSY = "an ingestion is running; edits wait until it has finished (see the Library tab)"


class MemoryApp:
    """The state behind the web app: one store, its allowed folders and upload limit."""

    def __init__(self, store_dir: str | Path, config: Config | None = None, allowed_dirs: tuple = (),
                 max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB):
        from m3mem.memory import Memory

        self.store_dir = Path(store_dir).expanduser().resolve()
        self.config = config or Config()
        self.allowed: list[Path] = []
        for d in allowed_dirs:
            p = Path(d).expanduser()
            if not p.is_dir():
                raise InputError(f"--allow {d}: no such folder on this server")
            self.allowed.append(p.resolve())
        self.max_upload_bytes = int(max_upload_mb * 2**20)
        self.writer = Memory(self.store_dir, self.config)
        self.reader = Memory(self.store_dir, self.config, read_only=True)
        self._write = threading.Lock()
        self._read = threading.Lock()
        self._samples: dict[str, tuple[bytes | None, str]] = {}
        self._asked = 0  # numbers each answer, so a page (or a test) can tell a new one from the last
        (self.store_dir / media.UPLOADS).mkdir(exist_ok=True)

    def servable(self) -> list[Path]:
        """Folders the browser may load files from: uploads, playable excerpts, the allowed folders."""
        return [self.store_dir / media.UPLOADS, self.store_dir / media.CACHE, *self.allowed]

    def close(self) -> None:
        self.reader.close()
        self.writer.close()

    # library ----------------------------------------------------------------

    def library_html(self) -> str:
        store = self.reader.store
        clips: dict[int, list[dict]] = {}
        for c in store.clips():
            clips.setdefault(c.video_id, []).append(
                {"id": c.id, "index": c.index, "start_s": c.start_s, "end_s": c.end_s, "status": c.status,
                 "error": c.error})
        videos = [{"id": v.id, "name": v.name, "path": v.path, "duration_s": v.duration_s, "status": v.status,
                   "error": v.error, "clips": clips.get(v.id, [])} for v in store.videos()]
        return views.library(videos)

    def ingest_uploads(self, files) -> Iterator[tuple[str, str]]:
        paths, refused = [], []
        for f in files or []:
            temp = Path(f if isinstance(f, (str, os.PathLike)) else f.name)
            try:
                paths.append(media.accept_upload(self.store_dir, temp, temp.name, self.max_upload_bytes))
            except (InputError, OSError) as e:
                refused.append(str(e))
        if not paths and not refused:
            refused.append("choose one or more files to upload first")
        yield from self._ingest(paths, refused)

    def ingest_server_path(self, text: str) -> Iterator[tuple[str, str]]:
        try:
            paths, refused = media.server_files(text or "", self.allowed), []
        except InputError as e:
            paths, refused = [], [str(e)]
        yield from self._ingest(paths, refused)

    def _ingest(self, paths: list[Path], refused: list[str]) -> Iterator[tuple[str, str]]:
        """Run ingestion in a thread that outlives the page; stream its progress while the page watches."""
        t0 = time.perf_counter()
        if not paths:
            yield views.ingest_report([], time.perf_counter() - t0, refused), self.library_html()
            return
        if not self._write.acquire(blocking=False):
            yield views.progress([], "waiting for the ingestion already running to finish"), self.library_html()
            self._write.acquire()
        events: queue.Queue = queue.Queue()
        outcome: dict = {}

        def work() -> None:
            try:
                report = self.writer.ingest(paths, progress=lambda label, done, total: events.put((label, done, total)))
                outcome["results"] = report.to_json()["files"]
            except M3memError as e:
                outcome["error"] = str(e)
            except Exception as e:  # the page must hear of any failure, and the lock must be released
                log.exception("ingestion failed")
                outcome["error"] = f"ingestion stopped: {type(e).__name__}: {e}"
            finally:
                self._write.release()
                events.put(None)

        threading.Thread(target=work, name="m3mem-ingest", daemon=True).start()
        bars: dict[str, tuple[int, int]] = {}
        note = f"Ingesting {len(paths)} file{'s' if len(paths) != 1 else ''}"
        yield views.progress([], note), self.library_html()
        while True:
            item = events.get()
            if item is None:
                break
            label, done, total = item
            bars[label] = (done, total)
            while not events.empty():  # fold a burst of updates into one redraw
                nxt = events.get()
                if nxt is None:
                    events.put(None)
                    break
                bars[nxt[0]] = (nxt[1], nxt[2])
            yield views.progress([(k, d, t) for k, (d, t) in bars.items()], note), self.library_html()
        if "error" in outcome:
            refused.append(outcome["error"])
        yield (views.ingest_report(outcome.get("results", []), time.perf_counter() - t0, refused),
               self.library_html())

    # ask --------------------------------------------------------------------

    def ask(self, question: str, before: float | None) -> str:
        question = (question or "").strip()
        if not question:
            return views.message("type a question first", error=True)
        before_s = float(before) if before not in (None, "") and float(before) > 0 else None
        with self._read:
            answer = self.reader.ask(question, before_s=before_s)
            self._asked += 1
            number = self._asked
        clips = []
        for c in answer.citations:
            item = dict(c)
            try:
                item["html"] = self._player(c["path"], c["start"], c["end"], c["video"])
            except M3memError as e:
                item["error"] = str(e)
            clips.append(item)
        return views.answer(question, answer.answer, clips, answer.rounds, number)

    def _player(self, path: str, start_s: float, end_s: float, name: str) -> str:
        row = self.reader.store.execute("SELECT id FROM videos WHERE path=? ORDER BY id LIMIT 1", (path,)).fetchone()
        if row is None:
            raise InputError(f"{name} is no longer in the store")
        clip = media.clip_media(self.store_dir, path, row[0], start_s, end_s, self.servable())
        return views.player(clip, f"{name} {fmt_time(start_s)}-{fmt_time(end_s)}")

    # people -----------------------------------------------------------------

    def people_html(self) -> str:
        store = self.reader.store
        cards = []
        for p in self.reader.people():
            cards.append({
                "id": p.id, "name": p.name, "appearances": list(p.appearances),
                "faces": [(f, store.best_crop(f)) for f in p.faces],
                "voices": [(v, *self._voice_sample(v)) for v in p.voices],
            })
        return views.people(cards)

    def _voice_sample(self, voice_id: str) -> tuple[bytes | None, str]:
        if voice_id not in self._samples:
            row = self.reader.store.execute(
                "SELECT v.path, v.name, a.start_s, a.end_s FROM appearances a JOIN clips c ON c.id = a.clip_id"
                " JOIN videos v ON v.id = c.video_id WHERE a.node_id=? ORDER BY v.id, a.start_s LIMIT 1",
                (voice_id,),
            ).fetchone()
            if row is None:
                return None, "never heard"
            path, name, a, b = row
            where = f"first heard in {name} at {fmt_time(a)}"
            try:
                self._samples[voice_id] = (media.voice_sample_wav(path, a, b), where)
            except M3memError as e:
                return None, f"{where}; no sample: {e}"
        return self._samples[voice_id]

    def person_choices(self) -> list[tuple[str, str]]:
        return [(f"{p.name} ({p.id})" if p.name else p.id, p.id) for p in self.reader.people()]

    def members_of(self, person: str | None) -> list[str]:
        if not person:
            return []
        from m3mem import people

        return people.members(self.reader.store, person)

    def _edit(self, what, *args) -> str:
        if not self._write.acquire(blocking=False):
            return views.message(BUSY, error=True)
        try:
            return views.message(what(*args))
        except M3memError as e:
            return views.message(str(e), error=True)
        finally:
            self._write.release()

    def rename(self, person: str | None, name: str) -> str:
        from m3mem import people

        def run() -> str:
            cid = people.rename(self.writer.store, _need(person), name)
            return f"{cid} is now called {name.strip()}" if (name or "").strip() else f"{cid} has no name now"

        return self._edit(run)

    def merge(self, person: str | None, other: str | None) -> str:
        from m3mem import people

        def run() -> str:
            if not other or other == person:
                raise InputError("choose a second, different person to merge with")
            return f"merged into {people.merge(self.writer.store, _need(person), other)}"

        return self._edit(run)

    def split(self, person: str | None, entities: list[str] | None) -> str:
        from m3mem import people

        def run() -> str:
            new = people.split(self.writer.store, _need(person), list(entities or []))
            return f"{', '.join(entities)} now form {new}"

        return self._edit(run)

    def forget(self, person: str | None, confirmed: bool) -> str:
        from m3mem.forget import forget_person

        def run() -> str:
            if not confirmed:
                raise InputError("tick the box to confirm: forgetting cannot be undone")
            report = forget_person(self.writer.store, _need(person))
            for e in report.entities:
                self._samples.pop(e, None)
            # excerpts are cut footage; drop them with the memory, they are made again when needed
            media.drop_cached_excerpts(self.store_dir)
            faces = sum(1 for e in report.entities if e.startswith("face_"))
            return (f"forgot {report.person}: {_count(faces, 'face')}, {_count(len(report.entities) - faces, 'voice')}, "
                    f"{_count(report.lines, 'memory line')}, {_count(report.embeddings, 'vector')}, "
                    f"{_count(report.crops, 'face crop')}")

        return self._edit(run)

    # pictures ---------------------------------------------------------------

    def video_choices(self) -> list[tuple[str, int]]:
        return [(v.name, v.id) for v in self.reader.store.videos()]

    def timeline_html(self, video_id: int | None) -> str:
        if video_id is None:
            return views.message("choose a video")
        store = self.reader.store
        v = store.video(int(video_id))
        bounds = [c.start_s for c in store.clips(v.id)][1:]
        return views.timeline(v.name, v.duration_s, pictures.timeline_rows(store, v.id), bounds)

    def center_choices(self, video_id: int | None) -> list[tuple[str, str]]:
        out = [(f"person: {label}", pid) for label, pid in self.person_choices()]
        if video_id is not None:
            store = self.reader.store
            v = store.video(int(video_id))
            out += [(f"clip: {v.name} {fmt_time(c.start_s)}-{fmt_time(c.end_s)}", f"clip_{c.id}")
                    for c in store.clips(v.id)]
        return out

    def graph_html(self, center: str | None) -> str:
        if not center:
            return views.message("choose a person or a clip")
        store = self.reader.store
        nodes, edges = pictures.neighbourhood(store, center)
        return views.graph(center, nodes, edges, pictures.layout(nodes, edges, center))

    # the page ---------------------------------------------------------------

    def build(self):
        import gradio as gr

        with gr.Blocks(title="m3mem") as demo:
            gr.Markdown(f"## m3mem &nbsp;<small>{self.store_dir}</small>")
            with gr.Tab("Library", id="library"):
                with gr.Row():
                    with gr.Column():
                        uploads = gr.File(label=f"Upload videos or audio (up to {self.max_upload_bytes // 2**20} MB each)",
                                          file_count="multiple", elem_id="upload-files")
                        upload_btn = gr.Button("Ingest uploads", variant="primary", elem_id="ingest-uploads")
                    with gr.Column():
                        allowed = ", ".join(str(p) for p in self.allowed) or "none: start with --allow DIR"
                        server_path = gr.Textbox(label="Path on the server", placeholder="/videos/meeting.mp4",
                                                 info=f"allowed folders: {allowed}", elem_id="server-path")
                        path_btn = gr.Button("Ingest path", elem_id="ingest-path")
                ingest_out = gr.HTML(elem_id="ingest-status", js_on_load=None)
                refresh_btn = gr.Button("Refresh", size="sm", elem_id="refresh-library")
                library = gr.HTML(elem_id="library", js_on_load=None)
            with gr.Tab("Ask", id="ask"):
                with gr.Row():
                    question = gr.Textbox(label="Question", scale=5, elem_id="question",
                                          placeholder="What did the speaker ask people to do?")
                    before = gr.Number(label="Only memory before (s); 0: all", value=0, minimum=0, scale=1, elem_id="before")
                ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-btn")
                answer_out = gr.HTML(elem_id="answer", js_on_load=None)
            with gr.Tab("People", id="people"):
                with gr.Row():
                    person = gr.Dropdown(label="Person", choices=[], elem_id="person")
                    new_name = gr.Textbox(label="New name", elem_id="new-name")
                    rename_btn = gr.Button("Rename", elem_id="rename-btn")
                with gr.Row():
                    other = gr.Dropdown(label="Merge with", choices=[], elem_id="merge-other")
                    merge_btn = gr.Button("Merge", elem_id="merge-btn")
                    parts = gr.CheckboxGroup(label="Faces and voices to split off", choices=[], elem_id="split-parts")
                    split_btn = gr.Button("Split", elem_id="split-btn")
                with gr.Row():
                    confirm = gr.Checkbox(label="Forget this person for good: their faces, voices and every memory "
                                                "line about them", elem_id="forget-confirm")
                    forget_btn = gr.Button("Forget", variant="stop", elem_id="forget-btn")
                people_msg = gr.HTML(elem_id="people-msg", js_on_load=None)
                people_out = gr.HTML(elem_id="people", js_on_load=None)
            with gr.Tab("Pictures", id="pictures"):
                with gr.Row():
                    video = gr.Dropdown(label="Video", choices=[], elem_id="timeline-video")
                    center = gr.Dropdown(label="Graph around", choices=[], elem_id="graph-center")
                timeline_out = gr.HTML(elem_id="timeline", js_on_load=None)
                graph_out = gr.HTML(elem_id="graph", js_on_load=None)

            def refresh_people(selected=None):
                choices = self.person_choices()
                ids = {c[1] for c in choices}
                keep = selected if selected in ids else None
                return (self.people_html(), gr.Dropdown(choices=choices, value=keep),
                        gr.Dropdown(choices=choices, value=None),
                        gr.CheckboxGroup(choices=self.members_of(keep), value=[]))

            def refresh_all(selected=None, video_id=None, center_id=None):
                videos = self.video_choices()
                vid = video_id if video_id in {v[1] for v in videos} else (videos[0][1] if videos else None)
                centers = self.center_choices(vid)
                keep = center_id if center_id in {c[1] for c in centers} else None
                return (self.library_html(), *refresh_people(selected), gr.Dropdown(choices=videos, value=vid),
                        gr.Dropdown(choices=centers, value=keep), self.timeline_html(vid), self.graph_html(keep))

            everything = [library, people_out, person, other, parts, video, center, timeline_out, graph_out]
            state = [person, video, center]
            demo.load(refresh_all, None, everything)
            refresh_btn.click(refresh_all, state, everything)
            upload_btn.click(self.ingest_uploads, uploads, [ingest_out, library]).then(
                refresh_all, state, everything).then(lambda: None, None, uploads)
            path_btn.click(self.ingest_server_path, server_path, [ingest_out, library]).then(
                refresh_all, state, everything)
            ask_btn.click(self.ask, [question, before], answer_out)
            question.submit(self.ask, [question, before], answer_out)

            person.change(lambda p: gr.CheckboxGroup(choices=self.members_of(p), value=[]), person, parts)
            # an edit changes names everywhere: in the people list, the choices and the pictures
            rename_btn.click(self.rename, [person, new_name], people_msg).then(refresh_all, state, everything)
            merge_btn.click(self.merge, [person, other], people_msg).then(refresh_all, state, everything)
            split_btn.click(self.split, [person, parts], people_msg).then(refresh_all, state, everything)
            forget_btn.click(self.forget, [person, confirm], people_msg).then(
                refresh_all, state, everything).then(lambda: False, None, confirm)

            video.change(lambda v: (self.timeline_html(v), gr.Dropdown(choices=self.center_choices(v))),
                         video, [timeline_out, center])
            center.change(self.graph_html, center, graph_out)
        return demo


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _need(person: str | None) -> str:
    if not person:
        raise InputError("choose a person first")
    return person


def parse_auth(text: str | None) -> tuple[str, str] | None:
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise InputError("--auth expects USER:PASSWORD (or set $M3MEM_UI_AUTH)")
    return user, password


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(store_dir: str | Path, config: Config | None = None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          auth: tuple[str, str] | None = None, allowed_dirs: tuple = (),
          max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB) -> None:
    """Start the app and block until interrupted."""
    if not is_loopback(host) and auth is None:
        raise InputError(f"serving on {host} lets other machines in; give --auth USER:PASSWORD "
                         f"(or $M3MEM_UI_AUTH), or keep the default host 127.0.0.1")
    try:
        import gradio  # noqa: F401  (fail before opening anything)
    except ImportError as e:
        raise M3memError("the web app needs gradio: pip install 'm3mem[ui]'") from e
    app = MemoryApp(store_dir, config, allowed_dirs, max_upload_mb)
    # Gradio writes uploads (and anything it caches) under GRADIO_TEMP_DIR: keep them in the store's folder.
    incoming = app.store_dir / media.UPLOADS / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    os.environ["GRADIO_TEMP_DIR"] = str(incoming)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    demo = app.build()
    demo.queue(default_concurrency_limit=4)
    log.info("serving %s on http://%s:%d", app.store_dir, host, port)
    try:
        demo.launch(
            server_name=host, server_port=port, auth=auth, allowed_paths=[str(p) for p in app.servable()],
            max_file_size=app.max_upload_bytes, ssr_mode=False, show_error=True, css=views.CSS, head=views.HEAD,
            # Gradio would keep each answer (names, crops, voice samples) in the browser, or in a hub
            # bucket, beyond the reach of forget: record nothing.
            run_history=False,
        )
    finally:
        app.close()
