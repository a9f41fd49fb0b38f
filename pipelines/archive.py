"""Archive input: what ``m3mem ingest`` accepts, expanded to the list of files to ingest.

An input is any of:

- a media file (any extension: the probe decides whether it is readable);
- a folder, walked recursively (symlinked folders are not followed, so a link
  loop cannot hang the walk); only files with a media extension are taken;
- a glob pattern (``'archive/**/*.mp4'``, quoted so the shell leaves it alone);
- a list file (``.txt``, ``.lst``, ``.list``): one input per line, ``#`` starts a
  comment, relative paths are relative to the list file's folder;
- an M3-Agent manifest (``.jsonl``, e.g. its ``data.jsonl``): one JSON object per
  line with a ``video_path`` key, optionally ``id`` (kept as the file's label)
  and ``mem_path`` (ignored: the store is the memory).

Whatever the form, files are taken in natural order of their paths and each file
once, so the same inputs always give the same ids. Inputs that cannot be used (a
missing path, a pattern that matches nothing, a bad manifest line) are returned
as problems with a message; the rest of the batch goes on.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

MEDIA_EXTENSIONS = {
    ".mp4", ".mkv", ".mov", ".avi", ".webm", ".mpg", ".mpeg", ".m4v", ".flv", ".wmv", ".ts", ".3gp",
    ".wav", ".mp3", ".flac", ".m4a", ".aac", ".ogg", ".opus",
}
LIST_EXTENSIONS = {".txt", ".lst", ".list"}
MANIFEST_EXTENSIONS = {".jsonl"}
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class InputFile:
    """A file to ingest and, when a manifest named it, the manifest's id for it."""

    path: Path
    source_id: str | None = None


@dataclass(frozen=True)
class InputProblem:
    """An input that gives no file, and why."""

    path: str
    error: str


def natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", str(p))]


def display(path: str | os.PathLike) -> str:
    """A path as text that can always be printed and stored: undecodable bytes become \\xNN."""
    raw = os.fsencode(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace")


def printable(text: str) -> str:
    """A message that may quote such a path, made safe to print and to store the same way."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class DecodablePath:
    """A path every decoder can open: the file's own, or a link to it whose name is valid UTF-8.

    decord takes file names as UTF-8 text and fails on names that are not (bytes from
    another encoding), so such a file is opened through a link named with the bytes
    written out as \\xNN. ``close`` removes the link.
    """

    def __init__(self, path: str | os.PathLike):
        self._tmpdir: str | None = None
        text = os.fspath(path)
        try:
            text.encode("utf-8")
            self.path = text
        except UnicodeEncodeError:
            self._tmpdir = tempfile.mkdtemp(prefix="m3mem-name-")
            link = Path(self._tmpdir) / display(Path(text).name).replace(os.sep, "_")
            os.symlink(os.path.abspath(text), link)
            self.path = str(link)

    def close(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> tuple[list[InputFile], list[InputProblem]]:
    """The files the inputs name, in natural path order, each once; and the inputs that name none."""
    found: list[InputFile] = []
    problems: list[InputProblem] = []
    for raw in inputs:
        _expand(raw, None, found, problems, seen_lists=set())
    unique: dict[Path, InputFile] = {}
    for item in sorted(found, key=lambda f: natural_key(f.path)):
        try:
            key = item.path.resolve()
        except (OSError, RuntimeError):  # a symlink loop resolves to nothing; keep the path as given
            key = item.path.absolute()
        if key not in unique:
            unique[key] = item
        elif unique[key].source_id is None and item.source_id is not None:
            unique[key] = item
    return list(unique.values()), problems


def _expand(raw: str | os.PathLike, source_id: str | None, found: list[InputFile], problems: list[InputProblem],
            seen_lists: set[Path]) -> None:
    p = Path(raw)
    if p.is_dir():
        found.extend(InputFile(f) for f in walk_media(p))
    elif p.is_file():
        suffix = p.suffix.lower()
        if suffix in MANIFEST_EXTENSIONS:
            _read_manifest(p, found, problems, seen_lists)
        elif suffix in LIST_EXTENSIONS:
            _read_list(p, found, problems, seen_lists)
        else:
            found.append(InputFile(p, source_id))
    elif not p.exists() and _GLOB_CHARS.search(str(raw)):
        matches = sorted(glob.glob(str(raw), recursive=True))
        files = [Path(m) for m in matches if Path(m).is_file()]
        for d in (Path(m) for m in matches if Path(m).is_dir()):
            files.extend(walk_media(d))
        if not files:
            problems.append(InputProblem(display(raw), f"{display(raw)}: the pattern matches no files"))
        found.extend(InputFile(f) for f in files)
    elif p.is_symlink():
        problems.append(InputProblem(display(p), f"{display(p)}: a broken symbolic link (its target does not exist)"))
    elif p.exists():
        problems.append(InputProblem(display(p), f"{display(p)}: not a regular file or folder (a device or pipe?)"))
    else:
        problems.append(InputProblem(display(p), f"{display(p)}: no such file or folder"))


def walk_media(root: Path) -> list[Path]:
    """Media files under a folder, recursively; symlinked folders are not followed."""
    out: list[Path] = []
    skipped = 0

    def onerror(e: OSError) -> None:
        log.warning("cannot read folder %s (%s); skipping it", display(e.filename or root), e.strerror or e)

    for folder, _dirs, names in os.walk(root, onerror=onerror, followlinks=False):
        for name in names:
            f = Path(folder) / name
            if f.suffix.lower() in MEDIA_EXTENSIONS and f.is_file():
                out.append(f)
            else:
                skipped += 1
    if skipped:
        log.info("%s: skipped %d files that are not media (by extension)", display(root), skipped)
    return out


def _read_lines(p: Path, problems: list[InputProblem]) -> list[str] | None:
    try:
        return p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        problems.append(InputProblem(display(p), f"{display(p)}: a list or manifest must be UTF-8 text"))
    except OSError as e:
        problems.append(InputProblem(display(p), f"{display(p)}: cannot read it ({e.strerror or e})"))
    return None


def _read_list(p: Path, found: list[InputFile], problems: list[InputProblem], seen_lists: set[Path]) -> None:
    key = p.resolve()
    if key in seen_lists:
        problems.append(InputProblem(display(p), f"{display(p)}: the list includes itself; ignored the second time"))
        return
    seen_lists.add(key)
    lines = _read_lines(p, problems)
    for line in lines or ():
        entry = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if entry:
            _expand(_relative_to(p, entry), None, found, problems, seen_lists)


def _read_manifest(p: Path, found: list[InputFile], problems: list[InputProblem], seen_lists: set[Path]) -> None:
    lines = _read_lines(p, problems)
    for n, line in enumerate(lines or (), start=1):
        if not line.strip():
            continue
        where = f"{display(p)} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(InputProblem(where, f"{where}: not valid JSON ({e.msg}); each line must be one object"))
            continue
        video = obj.get("video_path") if isinstance(obj, dict) else None
        if not isinstance(video, str) or not video.strip():
            problems.append(InputProblem(where, f"{where}: no \"video_path\" string; each line needs one"))
            continue
        source_id = obj.get("id")
        target = _relative_to(p, video.strip())
        if not target.exists():
            problems.append(InputProblem(display(target), f"{display(target)} ({where}): no such file"))
            continue
        _expand(target, None if source_id is None else str(source_id), found, problems, seen_lists)


def _relative_to(listing: Path, entry: str) -> Path:
    q = Path(os.path.expanduser(entry))
    return q if q.is_absolute() else listing.parent / q
