"""Forget a person: every trace of them leaves the store and its indexes.

What goes: the person's face and voice nodes with their embeddings (face,
voice), face crops and appearances; every memory line that mentions them
(through a ``mentions`` edge, or by their name) with its text embedding and its
edges; the equivalence, conflict, member and hand-edit edges that touch them;
their character node and name; journal entries that name them; and, inside the
cached perception of each clip they were in, their face tracks (embedding and
crop) and their utterances, so that no later step can bring them back from the
cache. Vectors leave the FAISS indexes and the index files are rewritten;
SQLite overwrites freed pages (``secure_delete``) and the write-ahead log is
truncated, so the deleted rows do not linger on disk.

A person seen again in a video ingested later is a new face or voice: forgetting
is not a block list.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass

from m3mem.people import resolve, members
from m3mem.records import ClipPerception
from m3mem.store import SPACES

log = logging.getLogger(__name__)

# edges that carry identity; all of them go with a forgotten face or voice
_IDENTITY_EDGES = ("member", "equivalence", "conflict", "same_person", "not_same_person", "mentions")


@dataclass(frozen=True)
class ForgetReport:
    person: str                    # the character id that was forgotten
    entities: tuple[str, ...]      # its face and voice nodes, now gone
    lines: int                     # memory lines (episodic, semantic) removed
    embeddings: int                # vectors removed, all spaces together
    crops: int
    appearances: int
    clips_scrubbed: int            # clips whose cached perception was rewritten without them

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"entities": list(self.entities)}


def forget_person(store, person: str) -> ForgetReport:
    """Remove ``person`` (a character id, one of its face/voice ids, or its name) from ``store``."""
    from m3mem.writer import refresh_characters

    cid = resolve(store, person)
    ents = members(store, cid)
    name = (store.node(cid) or {}).get("name")
    # Load every index first, so the removals below reach it and the file is rewritten without them.
    for space in SPACES:
        store.index(space)

    previous_secure = store.execute("PRAGMA secure_delete").fetchone()[0]
    store.execute("PRAGMA secure_delete = ON")
    try:
        with store.transaction() as c:
            lines = _lines_about(store, [*ents, cid], name)
            doomed = [*lines, *ents]
            vector_ids = _select(c, "SELECT id FROM embeddings WHERE node_id IN ({})", doomed)
            for eid in vector_ids:
                store.remove_embedding(eid)
            clip_ids = _select(c, "SELECT DISTINCT clip_id FROM appearances WHERE node_id IN ({})", ents)
            appearances = _count(c, "DELETE FROM appearances WHERE node_id IN ({})", ents)
            crops = _count(c, "DELETE FROM crops WHERE node_id IN ({})", ents)
            _count(c, "DELETE FROM edges WHERE src IN ({})", [*doomed, cid])
            _count(c, "DELETE FROM edges WHERE dst IN ({})", [*doomed, cid])
            _count(c, "DELETE FROM nodes WHERE id IN ({})", [*doomed, cid])
            scrubbed = sum(_scrub_clip(c, clip_id, set(ents)) for clip_id in clip_ids)
            _scrub_journal(c, [*ents, cid], name)
            store.journal("person_forgotten",
                          detail=f"{cid}: {len(ents)} faces/voices, {len(lines)} memory lines")
        refresh_characters(store)
    finally:
        store.execute(f"PRAGMA secure_delete = {int(previous_secure)}")
    store.save_indexes()
    store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    report = ForgetReport(cid, tuple(ents), len(lines), len(vector_ids), crops, appearances, scrubbed)
    log.info("forgot %s: %s", cid, report.to_json())
    return report


def _lines_about(store, ids: list[str], name: str | None) -> list[str]:
    """Episodic and semantic nodes that mention any of ``ids``, or ``name`` as a whole word."""
    found = set(_select(store, "SELECT src FROM edges WHERE kind='mentions' AND dst IN ({})", ids))
    if name:
        # a chat memorizer may write the name itself instead of a tag
        pattern = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)", re.IGNORECASE)
        for nid, text in store.execute(
            "SELECT id, text FROM nodes WHERE kind IN ('episodic','semantic') AND text LIKE ?", (f"%{name}%",)
        ):
            if pattern.search(text or ""):
                found.add(nid)
    return sorted(n for n in found if n.startswith(("episodic_", "semantic_")))


def _scrub_clip(c, clip_id: int, ents: set[str]) -> int:
    """Drop the forgotten face tracks and utterances from a clip's cached perception and identity."""
    row = c.execute("SELECT perception, identity FROM clips WHERE id=?", (clip_id,)).fetchone()
    if row is None or not row[1]:
        return 0
    identity = json.loads(row[1])
    faces = identity.get("faces", {})
    voices = identity.get("voices", {})
    gone_faces = {k for k, v in faces.items() if v in ents}
    gone_segments = {int(k) for k, v in voices.items() if v in ents}
    if not gone_faces and not gone_segments:
        return 0
    identity["faces"] = {k: v for k, v in faces.items() if k not in gone_faces}
    perception_json = row[0]
    if row[0]:
        perception = ClipPerception.from_dict(json.loads(row[0]))
        kept = [i for i in range(len(perception.speech)) if i not in gone_segments]
        # identity keys voices by utterance position; renumber them to the positions that remain
        position = {old: new for new, old in enumerate(kept)}
        identity["voices"] = {str(position[int(k)]): v for k, v in voices.items() if int(k) not in gone_segments}
        perception = dataclasses.replace(
            perception,
            faces=tuple(t for t in perception.faces if str(t.local_id) not in gone_faces),
            speech=tuple(perception.speech[i] for i in kept),
        )
        perception_json = json.dumps(perception.to_dict())
    else:
        identity["voices"] = {k: v for k, v in voices.items() if int(k) not in gone_segments}
    c.execute("UPDATE clips SET perception=?, identity=? WHERE id=?", (perception_json, json.dumps(identity), clip_id))
    return 1


def _scrub_journal(c, ids: list[str], name: str | None) -> None:
    words = [*ids, *([name] if name else [])]
    for word in words:
        pattern = re.compile(rf"(?<![\w]){re.escape(word)}(?![\w])", re.IGNORECASE)
        rows = c.execute("SELECT id, detail FROM journal WHERE detail LIKE ?", (f"%{word}%",)).fetchall()
        gone = [jid for jid, detail in rows if pattern.search(detail or "")]
        _count(c, "DELETE FROM journal WHERE id IN ({})", gone)


def _select(c, sql: str, values: list) -> list:
    out = []
    for chunk in range(0, len(values), 900):
        part = values[chunk:chunk + 900]
        out += [r[0] for r in c.execute(sql.format(",".join("?" * len(part))), part)]
    return out


def _count(c, sql: str, values: list) -> int:
    n = 0
    for chunk in range(0, len(values), 900):
        part = values[chunk:chunk + 900]
        n += c.execute(sql.format(",".join("?" * len(part))), part).rowcount
    return n
