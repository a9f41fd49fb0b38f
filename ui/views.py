"""HTML for the app's panels: pure functions from plain data to markup.

Every string that comes from the store or from a user (file names, names,
memory lines, errors) is escaped here: Gradio shows this HTML as it is.
"""
from __future__ import annotations

import base64
from html import escape
from urllib.parse import quote

from pipelines.memorize import fmt_time

KIND_COLOURS = {
    "character": "#7e57c2", "face": "#ef6c00", "voice": "#00897b", "episodic": "#78909c",
    "semantic": "#1e88e5", "clip": "#43a047", "video": "#2e7d32",
}
STATUS_COLOURS = {"done": "#2e7d32", "failed": "#c62828", "partial": "#ef6c00", "ingesting": "#1565c0",
                  "pending": "#616161", "perceived": "#1565c0", "identified": "#1565c0", "skipped": "#616161"}

CSS = """
.m3-table { border-collapse: collapse; width: 100%; font-size: 0.92em; }
.m3-table th, .m3-table td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
.m3-status { font-weight: 600; }
.m3-error { color: #c62828; }
.m3-muted { color: #757575; }
.m3-card { border: 1px solid #ddd; border-radius: 8px; padding: 8px 12px; margin: 6px 0; }
.m3-crops img { height: 72px; border-radius: 4px; margin-right: 4px; }
.m3-answer { font-size: 1.1em; padding: 8px 12px; border-left: 4px solid #7e57c2; background: #f6f3fb; }
.m3-clips { display: flex; flex-wrap: wrap; gap: 12px; }
.m3-clip { border: 1px solid #ddd; border-radius: 8px; padding: 6px; }
.m3-clip video { width: 360px; max-width: 100%; }
.m3-round { margin: 6px 0; }
.m3-round ul { margin: 2px 0 2px 16px; }
"""

# Chromium honours the #t= fragment; this also puts a clip back at its start after
# the element reloads, and does it for players added after the page loaded.
HEAD = """<script>
document.addEventListener('loadedmetadata', function (e) {
  var el = e.target, start = parseFloat(el && el.dataset ? el.dataset.start : NaN);
  if (!isNaN(start) && Math.abs(el.currentTime - start) > 0.25) { el.currentTime = start; }
}, true);
</script>"""


def file_url(path) -> str:
    return "/gradio_api/file=" + quote(str(path))


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _status(status: str) -> str:
    colour = STATUS_COLOURS.get(status, "#616161")
    return f'<span class="m3-status" style="color:{colour}">{escape(status)}</span>'


def _span(a: float, b: float) -> str:
    return f"{fmt_time(a)}&ndash;{fmt_time(b)}"


# --- library -------------------------------------------------------------------


def library(videos: list[dict]) -> str:
    """videos: dicts with id, name, path, duration_s, status, error, clips (list of dicts)."""
    if not videos:
        return '<p class="m3-muted" data-library-empty>No videos yet: upload one or give a server path.</p>'
    rows = []
    for v in videos:
        clips = v["clips"]
        done = sum(1 for c in clips if c["status"] == "done")
        failed = [c for c in clips if c["status"] == "failed"]
        clip_rows = "".join(
            f'<tr data-clip="{c["id"]}"><td>{c["index"]}</td><td>{_span(c["start_s"], c["end_s"])}</td>'
            f'<td>{_status(c["status"])}</td><td class="m3-error">{escape(c["error"] or "")}</td></tr>'
            for c in clips
        )
        error = f'<div class="m3-error">{escape(v["error"])}</div>' if v["error"] else ""
        rows.append(
            f'<tr data-video="{v["id"]}" data-name="{escape(v["name"])}" data-status="{escape(v["status"])}">'
            f'<td><b>{escape(v["name"])}</b><div class="m3-muted">{escape(v["path"])}</div>{error}</td>'
            f'<td>{fmt_time(v["duration_s"])}</td><td>{_status(v["status"])}</td>'
            f'<td>{done} of {len(clips)} done' + (f', <span class="m3-error">{len(failed)} failed</span>' if failed else "")
            + f'<details><summary>clips</summary><table class="m3-table"><tr><th>#</th><th>time</th><th>status</th>'
            f'<th>reason</th></tr>{clip_rows}</table></details></td></tr>'
        )
    return ('<table class="m3-table" data-library><tr><th>video</th><th>length</th><th>status</th><th>clips</th></tr>'
            + "".join(rows) + "</table>")


def progress(lines: list[tuple[str, int, int]], note: str = "") -> str:
    """Live ingestion progress: one bar per label (a file, or the whole batch)."""
    bars = []
    for label, done, total in lines:
        pct = 100.0 * done / total if total else 100.0
        bars.append(
            f'<div data-progress="{escape(label)}" data-done="{done}" data-total="{total}">'
            f'{escape(label)}: {done} of {total} clips'
            f'<div style="background:#eee;height:8px;border-radius:4px">'
            f'<div style="background:#7e57c2;width:{pct:.0f}%;height:8px;border-radius:4px"></div></div></div>'
        )
    return f'<div data-ingest="running"><p>{escape(note)}</p>{"".join(bars)}</div>'


def ingest_report(results: list[dict], wall_s: float, refused: list[str]) -> str:
    """results: FileResult dicts (path, status, clips_done, clips_failed, clips_skipped, error)."""
    rows = "".join(
        f'<tr data-file="{escape(r["path"])}" data-status="{escape(r["status"])}"><td>{escape(r["path"])}</td>'
        f'<td>{_status(r["status"])}</td><td>{r["clips_done"]} done, {r["clips_skipped"]} skipped, '
        f'{r["clips_failed"]} failed</td><td class="m3-error">{escape(r.get("error") or "")}</td></tr>'
        for r in results
    )
    refusals = "".join(f'<li class="m3-error" data-refused>{escape(x)}</li>' for x in refused)
    failed = sum(1 for r in results if r["status"] in ("failed", "partial")) + len(refused)
    head = f"Ingestion finished in {wall_s:.1f} s" + (f", {failed} with problems" if failed else "")
    return (f'<div data-ingest="finished" data-failed="{failed}"><p><b>{escape(head)}</b></p>'
            + (f"<ul>{refusals}</ul>" if refusals else "")
            + (f'<table class="m3-table"><tr><th>file</th><th>status</th><th>clips</th><th>reason</th></tr>{rows}</table>'
               if rows else "") + "</div>")


def message(text: str, error: bool = False) -> str:
    cls = "m3-error" if error else "m3-muted"
    return f'<p class="{cls}" data-message="{"error" if error else "ok"}">{escape(text)}</p>'


# --- ask -----------------------------------------------------------------------


def player(media, label: str, attrs: str = "") -> str:
    """A player that starts at the clip's start and stops at its end."""
    src = f"{file_url(media.path)}#t={media.start_s:.3f},{media.end_s:.3f}"
    tag = "video" if media.kind == "video" else "audio"
    return (f'<{tag} controls preload="auto" src="{escape(src)}" data-start="{media.start_s:.3f}" '
            f'data-end="{media.end_s:.3f}" {attrs}></{tag}><div>{escape(label)}</div>')


def answer(question: str, text: str, clips: list[dict], rounds: list[dict], number: int = 0) -> str:
    """clips: citations with video, start, end and either media html or an error; ``number`` counts the asks."""
    cited = []
    for c in clips:
        label = f'{c["video"]} {fmt_time(c["start"])}-{fmt_time(c["end"])}'
        body = c["html"] if c.get("html") else f'<div class="m3-error">{escape(c.get("error") or "")}</div>'
        cited.append(f'<div class="m3-clip" data-cited="{escape(c["video"])}" data-clip-start="{c["start"]}">'
                     f'{body}{"" if c.get("html") else escape(label)}</div>')
    return (f'<div data-answer="{number}"><p class="m3-muted">{escape(question)}</p>'
            f'<div class="m3-answer" data-answer-text>{escape(text)}</div>'
            f'<h4>Cited clips</h4><div class="m3-clips">{"".join(cited) or "<p class=m3-muted>none</p>"}</div>'
            f'<h4>How it was answered</h4>{rounds_html(rounds)}</div>')


def rounds_html(rounds: list[dict]) -> str:
    out = []
    for r in rounds:
        action = r.get("action", "")
        head = f'<b>Round {escape(str(r.get("round", "")))}: {escape(action)}</b>'
        if r.get("query"):
            head += f' &mdash; query <q>{escape(str(r["query"]))}</q>'
        items = []
        for c in r.get("clips", []):
            lines = "".join(f"<li>{escape(line)}</li>" for line in c.get("lines", [])[:6])
            score = f' score {c["score"]:.3f}' if isinstance(c.get("score"), (int, float)) else ""
            items.append(f'<li data-found="{escape(c.get("video", ""))}">{escape(c.get("video", ""))} '
                         f'{_span(c.get("start", 0.0), c.get("end", 0.0))}{score}<ul>{lines}</ul></li>')
        found = f'<ul>{"".join(items)}</ul>' if items else ""
        output = "" if action == "search" and items else (
            f'<div>{escape(str(r.get("output", "")))}</div>' if r.get("output") else "")
        out.append(f'<div class="m3-round" data-round="{escape(str(r.get("round", "")))}">{head}{found}{output}</div>')
    return "".join(out)


# --- people --------------------------------------------------------------------


def people(cards: list[dict]) -> str:
    """cards: id, name, faces [(face_id, jpeg or None)], voices [(voice_id, wav or None, where)], appearances."""
    if not cards:
        return '<p class="m3-muted" data-people-empty>No people yet.</p>'
    out = []
    for p in cards:
        crops = "".join(
            f'<img data-face="{escape(fid)}" title="{escape(fid)}" alt="{escape(fid)}" src="{data_url("image/jpeg", jpeg)}">'
            if jpeg else f'<span class="m3-muted">{escape(fid)} (no crop)</span>'
            for fid, jpeg in p["faces"]
        )
        voices = "".join(
            f'<div data-voice="{escape(vid)}">{escape(vid)} <span class="m3-muted">{escape(where)}</span><br>'
            + (f'<audio controls preload="metadata" src="{data_url("audio/wav", wav)}"></audio>' if wav else "")
            + "</div>"
            for vid, wav, where in p["voices"]
        )
        spans = p["appearances"]
        seen = ", ".join(f'{escape(a["video"])} {_span(a["start"], a["end"])} ({escape(a["kind"])})' for a in spans[:6])
        more = f" and {len(spans) - 6} more" if len(spans) > 6 else ""
        title = escape(p["name"]) + f' <span class="m3-muted">{escape(p["id"])}</span>' if p["name"] else escape(p["id"])
        out.append(
            f'<div class="m3-card" data-person="{escape(p["id"])}" data-name="{escape(p["name"] or "")}">'
            f'<b>{title}</b><div class="m3-crops">{crops}</div>{voices}'
            f'<div class="m3-muted">{seen}{more}</div></div>'
        )
    return "".join(out)


# --- pictures ------------------------------------------------------------------


def timeline(video: str, duration_s: float, rows: list[tuple[str, list[tuple[float, float, str]]]],
             clip_bounds: list[float]) -> str:
    """Who appears (thick bar) and speaks (thin bar) when; one row per person."""
    if not rows:
        return f'<p class="m3-muted" data-timeline-empty>Nobody was seen or heard in {escape(video)}.</p>'
    label_w, width, row_h, top = 170, 900, 30, 24
    scale = (width - label_w - 30) / max(duration_s, 1e-6)
    height = top + row_h * len(rows) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" data-timeline="{escape(video)}" '
             f'font-family="sans-serif" font-size="12">']
    for t in _ticks(duration_s):
        x = label_w + t * scale
        parts.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 6}" stroke="#eee"/>'
                     f'<text x="{x:.1f}" y="{top - 10}" text-anchor="middle" fill="#757575">{fmt_time(t)}</text>')
    for b in clip_bounds:
        x = label_w + b * scale
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#bbb" '
                     f'stroke-dasharray="3,3"/>')
    for i, (label, spans) in enumerate(rows):
        y = top + i * row_h
        parts.append(f'<g data-row="{escape(label)}"><text x="4" y="{y + 18}">{escape(label[:24])}</text>')
        for a, b, kind in spans:
            x, w = label_w + a * scale, max(2.0, (b - a) * scale)
            if kind == "face":
                parts.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="12" rx="2" '
                             f'fill="{KIND_COLOURS["face"]}"><title>{escape(label)} seen {fmt_time(a)}-{fmt_time(b)}</title></rect>')
            else:
                parts.append(f'<rect x="{x:.1f}" y="{y + 19}" width="{w:.1f}" height="6" rx="2" '
                             f'fill="{KIND_COLOURS["voice"]}"><title>{escape(label)} speaks {fmt_time(a)}-{fmt_time(b)}</title></rect>')
        parts.append("</g>")
    parts.append("</svg>")
    legend = (f'<div class="m3-muted"><span style="color:{KIND_COLOURS["face"]}">&#9632;</span> seen &nbsp; '
              f'<span style="color:{KIND_COLOURS["voice"]}">&#9644;</span> speaking &nbsp; dashed: clip bounds</div>')
    return f"<div><b>{escape(video)}</b>{''.join(parts)}{legend}</div>"


def _ticks(duration_s: float) -> list[float]:
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600) if duration_s / s <= 12), 7200)
    return [k * step for k in range(int(duration_s // step) + 1)]


def graph(center: str, nodes: list[dict], edges: list[tuple[str, str, str]], positions: dict[str, tuple[float, float]]) -> str:
    """nodes: id, kind, label, title, image (jpeg or None); positions in [-1, 1]."""
    if not nodes:
        return '<p class="m3-muted">Nothing linked.</p>'
    width, height, pad = 900, 620, 60

    def xy(n: str) -> tuple[float, float]:
        x, y = positions[n]
        return pad + (x + 1) / 2 * (width - 2 * pad), pad + (y + 1) / 2 * (height - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" data-graph="{escape(center)}" '
             f'font-family="sans-serif" font-size="11">']
    for a, b, kind in edges:
        (x1, y1), (x2, y2) = xy(a), xy(b)
        dash = ' stroke-dasharray="4,3"' if kind in ("conflict", "not_same_person") else ""
        colour = "#c62828" if kind in ("conflict", "not_same_person") else "#b0bec5"
        parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}"{dash}>'
                     f'<title>{escape(kind)}</title></line>')
    for n in nodes:
        x, y = xy(n["id"])
        colour = KIND_COLOURS.get(n["kind"], "#9e9e9e")
        r = 16 if n["id"] == center else 10
        parts.append(f'<g data-node="{escape(n["id"])}" data-kind="{escape(n["kind"])}"><title>{escape(n["title"])}</title>')
        if n.get("image"):
            parts.append(f'<image href="{data_url("image/jpeg", n["image"])}" x="{x - 16:.1f}" y="{y - 16:.1f}" '
                         f'width="32" height="32"/><circle cx="{x:.1f}" cy="{y:.1f}" r="17" fill="none" stroke="{colour}" stroke-width="2"/>')
        else:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + r + 12:.1f}" text-anchor="middle">{escape(n["label"][:28])}</text></g>')
    parts.append("</svg>")
    legend = " &nbsp; ".join(f'<span style="color:{c}">&#9679;</span> {k}' for k, c in KIND_COLOURS.items()
                             if k != "video")
    return f'<div>{"".join(parts)}<div class="m3-muted">{legend}; red dashes: never the same person</div></div>'

