"""The durable memory store: SQLite (WAL, transactions) plus FAISS indexes beside it.

A store is a folder:

    memory.db        videos, clips, nodes, edges, embeddings, appearances, crops, journal
    face.faiss       vector indexes, caches of the embeddings table (see vectors.py)
    voice.faiss
    text.faiss

Nothing is pickled: a store from an untrusted source is opened with SQLite and
numpy only, and index files that disagree with the database are rebuilt.

Node ids are stable strings: ``face_N``, ``voice_N``, ``character_N``,
``episodic_N``, ``semantic_N``. Clips and videos are rows; in the graph view
they appear as ``clip_<id>`` and ``video_<id>``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from m3mem.errors import StoreError
from m3mem.records import Clip, ClipPerception, VideoInfo
from m3mem.vectors import VectorIndex

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SPACES = ("face", "voice", "text")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS videos (
    id INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL,
    name TEXT NOT NULL,
    duration_s REAL NOT NULL,
    has_video INTEGER NOT NULL,
    has_audio INTEGER NOT NULL,
    fps REAL, width INTEGER, height INTEGER,
    status TEXT NOT NULL DEFAULT 'pending',
    error TEXT,
    added_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS clips (
    id INTEGER PRIMARY KEY,
    video_id INTEGER NOT NULL REFERENCES videos(id),
    idx INTEGER NOT NULL,
    start_s REAL NOT NULL,
    end_s REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',  -- pending | perceived | identified | done | failed
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    perception TEXT,   -- ClipPerception as JSON (cached so a re-run skips perception)
    identity TEXT,     -- {"faces": {local_id: face_N}, "voices": {segment_index: voice_N}}
    UNIQUE (video_id, idx)
);
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,          -- face | voice | character | episodic | semantic
    text TEXT,
    clip_id INTEGER REFERENCES clips(id),
    weight REAL NOT NULL DEFAULT 1.0,
    name TEXT,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS nodes_kind ON nodes(kind);
CREATE INDEX IF NOT EXISTS nodes_clip ON nodes(clip_id);
CREATE INDEX IF NOT EXISTS nodes_seq ON nodes(seq);
CREATE TABLE IF NOT EXISTS edges (
    src TEXT NOT NULL,
    dst TEXT NOT NULL,
    kind TEXT NOT NULL,          -- mentions | equivalence | conflict | member | supports
    weight REAL NOT NULL DEFAULT 1.0,
    PRIMARY KEY (src, dst, kind)
);
CREATE INDEX IF NOT EXISTS edges_dst ON edges(dst, kind);
CREATE TABLE IF NOT EXISTS embeddings (
    id INTEGER PRIMARY KEY,
    node_id TEXT NOT NULL,
    space TEXT NOT NULL,         -- face | voice | text
    vector BLOB NOT NULL,        -- little-endian float32, L2-normalised
    quality REAL NOT NULL DEFAULT 0,
    clip_id INTEGER
);
CREATE INDEX IF NOT EXISTS embeddings_node ON embeddings(node_id);
CREATE INDEX IF NOT EXISTS embeddings_space ON embeddings(space, id);
CREATE TABLE IF NOT EXISTS appearances (
    node_id TEXT NOT NULL,
    clip_id INTEGER NOT NULL,
    start_s REAL NOT NULL,
    end_s REAL NOT NULL,
    kind TEXT NOT NULL           -- face | voice
);
CREATE INDEX IF NOT EXISTS appearances_node ON appearances(node_id);
CREATE INDEX IF NOT EXISTS appearances_clip ON appearances(clip_id);
CREATE TABLE IF NOT EXISTS crops (
    node_id TEXT NOT NULL,
    clip_id INTEGER NOT NULL,
    quality REAL NOT NULL,
    jpeg BLOB NOT NULL,
    PRIMARY KEY (node_id, clip_id)
);
CREATE TABLE IF NOT EXISTS counters (kind TEXT PRIMARY KEY, next INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY,
    ts REAL NOT NULL,
    video_id INTEGER,
    clip_id INTEGER,
    event TEXT NOT NULL,
    detail TEXT
);
"""


@dataclass(frozen=True)
class VideoRow:
    id: int
    sha256: str
    path: str
    name: str
    duration_s: float
    has_video: bool
    has_audio: bool
    status: str
    error: str | None


@dataclass(frozen=True)
class ClipRow:
    id: int
    video_id: int
    index: int
    start_s: float
    end_s: float
    status: str
    error: str | None

    def as_clip(self) -> Clip:
        return Clip(str(self.video_id), self.index, self.start_s, self.end_s)


def _blob(v: np.ndarray) -> bytes:
    return np.asarray(v, dtype="<f4").tobytes()


def _vec(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<f4").astype(np.float32)


class Store:
    """One memory store folder. Open with ``Store.open(dir)``; use as a context manager."""

    def __init__(self, root: Path, conn: sqlite3.Connection, read_only: bool):
        self.root = root
        self.read_only = read_only
        self._conn = conn
        self._lock = threading.RLock()
        self._depth = 0
        self._indexes: dict[str, VectorIndex] = {}
        self._pending: dict[str, list[tuple[int, np.ndarray]]] = {s: [] for s in SPACES}
        self._removed: dict[str, list[int]] = {s: [] for s in SPACES}

    # opening ----------------------------------------------------------------

    @classmethod
    def open(cls, root: str | Path, create: bool = True, read_only: bool = False) -> "Store":
        root = Path(root)
        db = root / "memory.db"
        if not db.exists():
            if not create or read_only:
                raise StoreError(f"no m3mem store at {root} (missing {db.name}); run 'm3mem ingest ... --store {root}' first")
            root.mkdir(parents=True, exist_ok=True)
        elif root.is_file():
            raise StoreError(f"{root} is a file; a store is a folder")
        try:
            conn = sqlite3.connect(str(db), timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 30000")
            if not read_only:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            store = cls(root, conn, read_only)
            store._init_schema()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{db} is not a readable m3mem store: {e}") from e
        return store

    def _init_schema(self) -> None:
        row = None
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError:
            pass  # a new database: no meta table yet
        if row is None:
            if self.read_only:
                raise StoreError(f"{self.root} is not an m3mem store (no schema version)")
            with self.transaction():
                # executescript would commit the open transaction; run statements one by one
                for statement in _split_sql(_SCHEMA):
                    self._conn.execute(statement)
                self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        version = int(row[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {self.root} has schema version {version}, newer than this m3mem ({SCHEMA_VERSION}); upgrade m3mem"
            )
        if not self.read_only:
            # indexes added within a schema version are created on first writable open
            with self.transaction():
                for statement in _split_sql(_SCHEMA):
                    if statement.startswith("CREATE INDEX"):
                        self._conn.execute(statement)

    def close(self) -> None:
        if not self.read_only:
            self.save_indexes()
        self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # transactions -----------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Nestable; the outermost level commits, or rolls back on any exception.

        Vectors added inside reach the in-memory indexes only after the commit.
        """
        if self.read_only:
            raise StoreError(f"store {self.root} was opened read-only")
        with self._lock:
            outer = self._depth == 0
            if outer:
                self._conn.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self._conn
            except BaseException:
                self._depth -= 1
                if outer:
                    self._conn.execute("ROLLBACK")
                    self._pending = {s: [] for s in SPACES}
                    self._removed = {s: [] for s in SPACES}
                raise
            self._depth -= 1
            if outer:
                self._conn.execute("COMMIT")
                self._flush_vectors()

    def _flush_vectors(self) -> None:
        for space in SPACES:
            if self._removed[space] and space in self._indexes:
                self._indexes[space].remove(self._removed[space])
            if self._pending[space] and space in self._indexes:
                ids = np.array([i for i, _ in self._pending[space]])
                self._indexes[space].add(ids, np.stack([v for _, v in self._pending[space]]))
        self._pending = {s: [] for s in SPACES}
        self._removed = {s: [] for s in SPACES}

    def execute(self, sql: str, params: Iterable = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.execute(sql, tuple(params))

    # meta -------------------------------------------------------------------

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def check_backends(self, backends: dict[str, str]) -> None:
        """Embeddings from two backends cannot be compared: refuse to mix them in one store."""
        with self.transaction() as c:
            for role, spec in backends.items():
                row = c.execute("SELECT value FROM meta WHERE key=?", (f"backend.{role}",)).fetchone()
                if row is None:
                    c.execute("INSERT INTO meta VALUES (?, ?)", (f"backend.{role}", spec))
                elif row[0] != spec:
                    raise StoreError(
                        f"store {self.root} was built with {role} model {row[0]!r}, not {spec!r}; "
                        f"its embeddings cannot be compared. Use the same {role}_model or a new --store"
                    )

    # ids --------------------------------------------------------------------

    def new_id(self, kind: str) -> str:
        with self.transaction() as c:
            row = c.execute("SELECT next FROM counters WHERE kind=?", (kind,)).fetchone()
            n = row[0] if row else 1
            c.execute("INSERT OR REPLACE INTO counters VALUES (?, ?)", (kind, n + 1))
        return f"{kind}_{n}"

    # videos and clips -------------------------------------------------------

    def find_video(self, sha256: str) -> VideoRow | None:
        row = self.execute(
            "SELECT id, sha256, path, name, duration_s, has_video, has_audio, status, error FROM videos WHERE sha256=?",
            (sha256,),
        ).fetchone()
        return VideoRow(*row) if row else None

    def add_video(self, sha256: str, info: VideoInfo, clips: list[Clip]) -> tuple[int, list[ClipRow]]:
        """Insert a video and its planned clips; a known hash returns the existing rows."""
        with self.transaction() as c:
            existing = self.find_video(sha256)
            if existing is None:
                cur = c.execute(
                    "INSERT INTO videos (sha256, path, name, duration_s, has_video, has_audio, fps, width, height, added_at)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (sha256, info.path, Path(info.path).name, info.duration_s, int(info.has_video),
                     int(info.has_audio), info.fps, info.width, info.height, time.time()),
                )
                vid = int(cur.lastrowid)
                c.executemany(
                    "INSERT INTO clips (video_id, idx, start_s, end_s) VALUES (?,?,?,?)",
                    [(vid, cl.index, cl.start_s, cl.end_s) for cl in clips],
                )
                self.journal("video_added", video_id=vid, detail=info.path)
            else:
                vid = existing.id
                if existing.path != info.path:
                    c.execute("UPDATE videos SET path=?, name=? WHERE id=?", (info.path, Path(info.path).name, vid))
        return vid, self.clips(vid)

    def videos(self) -> list[VideoRow]:
        rows = self.execute(
            "SELECT id, sha256, path, name, duration_s, has_video, has_audio, status, error FROM videos ORDER BY id"
        ).fetchall()
        return [VideoRow(*r) for r in rows]

    def video(self, video_id: int) -> VideoRow:
        row = self.execute(
            "SELECT id, sha256, path, name, duration_s, has_video, has_audio, status, error FROM videos WHERE id=?",
            (video_id,),
        ).fetchone()
        if row is None:
            raise StoreError(f"no video {video_id} in store {self.root}")
        return VideoRow(*row)

    def set_video_status(self, video_id: int, status: str, error: str | None = None) -> None:
        with self.transaction() as c:
            c.execute("UPDATE videos SET status=?, error=? WHERE id=?", (status, error, video_id))

    def clips(self, video_id: int | None = None) -> list[ClipRow]:
        sql = "SELECT id, video_id, idx, start_s, end_s, status, error FROM clips"
        if video_id is None:
            rows = self.execute(sql + " ORDER BY video_id, idx").fetchall()
        else:
            rows = self.execute(sql + " WHERE video_id=? ORDER BY idx", (video_id,)).fetchall()
        return [ClipRow(*r) for r in rows]

    def clip(self, clip_id: int) -> ClipRow:
        row = self.execute(
            "SELECT id, video_id, idx, start_s, end_s, status, error FROM clips WHERE id=?", (clip_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"no clip {clip_id} in store {self.root}")
        return ClipRow(*row)

    def set_clip_status(self, clip_id: int, status: str, error: str | None = None) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE clips SET status=?, error=?, attempts=attempts+? WHERE id=?",
                (status, error, 1 if status == "failed" else 0, clip_id),
            )
            self.journal(f"clip_{status}", clip_id=clip_id, detail=error)

    def save_perception(self, clip_id: int, perception: ClipPerception) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE clips SET perception=?, status='perceived', error=NULL WHERE id=?",
                (json.dumps(perception.to_dict()), clip_id),
            )

    def perception(self, clip_id: int) -> ClipPerception | None:
        row = self.execute("SELECT perception FROM clips WHERE id=?", (clip_id,)).fetchone()
        return ClipPerception.from_dict(json.loads(row[0])) if row and row[0] else None

    def save_identity(self, clip_id: int, identity: dict) -> None:
        with self.transaction() as c:
            c.execute("UPDATE clips SET identity=?, status='identified' WHERE id=?", (json.dumps(identity), clip_id))

    def identity(self, clip_id: int) -> dict | None:
        row = self.execute("SELECT identity FROM clips WHERE id=?", (clip_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def journal(self, event: str, video_id: int | None = None, clip_id: int | None = None, detail: str | None = None):
        with self.transaction() as c:
            c.execute(
                "INSERT INTO journal (ts, video_id, clip_id, event, detail) VALUES (?,?,?,?,?)",
                (time.time(), video_id, clip_id, event, detail),
            )

    # nodes, edges -----------------------------------------------------------

    def add_node(self, node_id: str, kind: str, text: str | None = None, clip_id: int | None = None,
                 weight: float = 1.0) -> None:
        with self.transaction() as c:
            seq = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM nodes").fetchone()[0]
            c.execute(
                "INSERT INTO nodes (id, kind, text, clip_id, weight, seq) VALUES (?,?,?,?,?,?)",
                (node_id, kind, text, clip_id, weight, seq),
            )

    def node(self, node_id: str) -> dict | None:
        row = self.execute(
            "SELECT id, kind, text, clip_id, weight, name FROM nodes WHERE id=?", (node_id,)
        ).fetchone()
        return dict(zip(("id", "kind", "text", "clip_id", "weight", "name"), row)) if row else None

    def nodes_of_kind(self, kind: str) -> list[str]:
        return [r[0] for r in self.execute("SELECT id FROM nodes WHERE kind=? ORDER BY seq", (kind,))]

    def add_edge(self, src: str, dst: str, kind: str, weight: float = 1.0, accumulate: bool = False) -> None:
        with self.transaction() as c:
            if accumulate:
                c.execute(
                    "INSERT INTO edges VALUES (?,?,?,?) ON CONFLICT(src, dst, kind) DO UPDATE SET weight = weight + excluded.weight",
                    (src, dst, kind, weight),
                )
            else:
                c.execute("INSERT OR REPLACE INTO edges VALUES (?,?,?,?)", (src, dst, kind, weight))

    def edges(self, kind: str | None = None) -> list[tuple[str, str, str, float]]:
        if kind is None:
            return self.execute("SELECT src, dst, kind, weight FROM edges").fetchall()
        return self.execute("SELECT src, dst, kind, weight FROM edges WHERE kind=?", (kind,)).fetchall()

    def neighbours(self, node_id: str, kind: str) -> list[str]:
        rows = self.execute(
            "SELECT dst FROM edges WHERE src=? AND kind=? UNION SELECT src FROM edges WHERE dst=? AND kind=?",
            (node_id, kind, node_id, kind),
        )
        return [r[0] for r in rows]

    # embeddings -------------------------------------------------------------

    def add_embedding(self, node_id: str, space: str, vector: np.ndarray, quality: float = 0.0,
                      clip_id: int | None = None) -> int:
        vector = np.asarray(vector, dtype=np.float32)
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO embeddings (node_id, space, vector, quality, clip_id) VALUES (?,?,?,?,?)",
                (node_id, space, _blob(vector), quality, clip_id),
            )
            eid = int(cur.lastrowid)
            self._pending[space].append((eid, vector))
        return eid

    def remove_embedding(self, embedding_id: int) -> None:
        with self.transaction() as c:
            row = c.execute("SELECT space FROM embeddings WHERE id=?", (embedding_id,)).fetchone()
            if row:
                c.execute("DELETE FROM embeddings WHERE id=?", (embedding_id,))
                self._removed[row[0]].append(embedding_id)

    def embeddings_of(self, node_id: str, space: str) -> list[tuple[int, np.ndarray, float]]:
        rows = self.execute(
            "SELECT id, vector, quality FROM embeddings WHERE node_id=? AND space=? ORDER BY id", (node_id, space)
        ).fetchall()
        return [(r[0], _vec(r[1]), r[2]) for r in rows]

    def embedding_nodes(self, ids: Iterable[int]) -> dict[int, str]:
        ids = [int(i) for i in ids if i >= 0]
        out: dict[int, str] = {}
        for chunk in range(0, len(ids), 900):
            part = ids[chunk:chunk + 900]
            q = ",".join("?" * len(part))
            for eid, nid in self.execute(f"SELECT id, node_id FROM embeddings WHERE id IN ({q})", part):
                out[eid] = nid
        return out

    def vectors_for_nodes(self, node_ids: Iterable[str], space: str) -> tuple[list[str], np.ndarray]:
        node_ids = list(node_ids)
        names: list[str] = []
        vecs: list[np.ndarray] = []
        for chunk in range(0, len(node_ids), 900):
            part = node_ids[chunk:chunk + 900]
            q = ",".join("?" * len(part))
            for nid, blob in self.execute(
                f"SELECT node_id, vector FROM embeddings WHERE space=? AND node_id IN ({q})", [space, *part]
            ):
                names.append(nid)
                vecs.append(_vec(blob))
        return names, (np.stack(vecs) if vecs else np.zeros((0, 0), np.float32))

    def index(self, space: str, dim: int | None = None) -> VectorIndex | None:
        """The FAISS index of a space, loaded (and caught up) on first use."""
        if space in self._indexes:
            return self._indexes[space]
        if dim is None:
            row = self.execute("SELECT vector FROM embeddings WHERE space=? LIMIT 1", (space,)).fetchone()
            if row is None:
                return None
            dim = len(row[0]) // 4
        path = self.root / f"{space}.faiss"

        def count_upto(max_id: int) -> int:
            return self.execute("SELECT COUNT(*) FROM embeddings WHERE space=? AND id<=?", (space, max_id)).fetchone()[0]

        def rows_after(max_id: int):
            cur = self._conn.cursor()
            cur.execute("SELECT id, vector FROM embeddings WHERE space=? AND id>? ORDER BY id", (space, max_id))
            for eid, blob in cur:
                vec = _vec(blob)
                if len(vec) != dim:
                    raise StoreError(f"store {self.root}: embedding {eid} in space {space} has {len(vec)} dims, not {dim}")
                yield eid, vec

        with self._lock:
            self._indexes[space] = VectorIndex.open(path, dim, count_upto, rows_after)
        return self._indexes[space]

    def refresh(self) -> None:
        """Catch the loaded indexes up with rows another process committed (readers during ingestion)."""
        for space, index in list(self._indexes.items()):
            rows = self.execute(
                "SELECT id, vector FROM embeddings WHERE space=? AND id>? ORDER BY id", (space, index.max_id)
            ).fetchall()
            if rows:
                index.add(np.array([r[0] for r in rows]), np.stack([_vec(r[1]) for r in rows]))

    def save_indexes(self) -> None:
        for space, index in self._indexes.items():
            try:
                index.save(self.root / f"{space}.faiss")
            except (OSError, RuntimeError) as e:
                log.warning("could not save the %s index (%s); it will be rebuilt on next open", space, e)

    # appearances and crops --------------------------------------------------

    def add_appearance(self, node_id: str, clip_id: int, start_s: float, end_s: float, kind: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT INTO appearances VALUES (?,?,?,?,?)", (node_id, clip_id, start_s, end_s, kind))

    def add_crop(self, node_id: str, clip_id: int, quality: float, jpeg: bytes) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO crops VALUES (?,?,?,?)", (node_id, clip_id, quality, jpeg))

    def best_crop(self, node_id: str) -> bytes | None:
        row = self.execute(
            "SELECT jpeg FROM crops WHERE node_id=? ORDER BY quality DESC, clip_id LIMIT 1", (node_id,)
        ).fetchone()
        return row[0] if row else None

    # checks -----------------------------------------------------------------

    def integrity_check(self) -> str:
        return self.execute("PRAGMA integrity_check").fetchone()[0]

    def counts(self) -> dict[str, int]:
        out = {}
        for table in ("videos", "clips", "nodes", "edges", "embeddings", "appearances"):
            out[table] = self.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        return out


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
