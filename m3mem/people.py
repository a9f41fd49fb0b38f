"""People: characters with their faces, voices, name and when they appear."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Person:
    id: str
    faces: tuple[str, ...]
    voices: tuple[str, ...]
    name: str | None
    appearances: tuple[dict, ...]

    def to_json(self) -> dict:
        return {
            "id": self.id, "faces": list(self.faces), "voices": list(self.voices), "name": self.name,
            "appearances": list(self.appearances),
        }


def list_people(store) -> list[Person]:
    members: dict[str, list[str]] = {}
    for src, dst, _, _ in store.edges("member"):
        members.setdefault(dst, []).append(src)
    names = {r[0]: r[1] for r in store.execute("SELECT id, name FROM nodes WHERE kind='character'")}
    people = []
    for cid in sorted(members, key=_order):
        ents = sorted(members[cid], key=_order)
        q = ",".join("?" * len(ents))
        rows = store.execute(
            f"SELECT v.name, a.start_s, a.end_s, a.kind FROM appearances a"
            f" JOIN clips c ON c.id = a.clip_id JOIN videos v ON v.id = c.video_id"
            f" WHERE a.node_id IN ({q}) ORDER BY v.id, a.start_s, a.kind",
            ents,
        ).fetchall()
        people.append(Person(
            id=cid,
            faces=tuple(e for e in ents if e.startswith("face_")),
            voices=tuple(e for e in ents if e.startswith("voice_")),
            name=names.get(cid),
            appearances=tuple(_merge(rows)),
        ))
    return people


def _merge(rows: list[tuple]) -> list[dict]:
    """Join touching spans of one kind in one video (a person seen across a clip boundary is one span)."""
    out: list[dict] = []
    last: dict[tuple[str, str], dict] = {}
    for video, a, b, kind in rows:
        prev = last.get((video, kind))
        if prev is not None and a <= prev["end"] + 0.05:
            prev["end"] = round(max(prev["end"], b), 2)
            continue
        span = {"video": video, "start": round(a, 2), "end": round(b, 2), "kind": kind}
        out.append(span)
        last[(video, kind)] = span
    return sorted(out, key=lambda s: (s["video"], s["start"], s["kind"]))


def _order(node_id: str) -> tuple[str, int]:
    kind, _, n = node_id.rpartition("_")
    return kind, int(n) if n.isdigit() else 0


# editing by hand -------------------------------------------------------------
# Edits are recorded as edges between face/voice nodes, not as changes to the
# current grouping, so that every later rebuild of characters (after more
# ingestion) respects them: 'same_person' joins, 'not_same_person' keeps apart.


def resolve(store, person: str) -> str:
    """A character id from an id, a face/voice id, or a name."""
    from m3mem.errors import InputError

    row = store.execute("SELECT id FROM nodes WHERE kind='character' AND (id=? OR name=?)", (person, person)).fetchone()
    if row:
        return row[0]
    owner = store.execute("SELECT dst FROM edges WHERE src=? AND kind='member'", (person,)).fetchone()
    if owner:
        return owner[0]
    raise InputError(f"no person {person!r} in the store; see 'm3mem people --store ...'")


def members(store, character_id: str) -> list[str]:
    return sorted(store.neighbours(character_id, "member"), key=_order)


def rename(store, person: str, name: str | None) -> str:
    from m3mem.errors import InputError

    cid = resolve(store, person)
    name = (name or "").strip() or None
    if name is not None:
        clash = store.execute("SELECT id FROM nodes WHERE kind='character' AND name=? AND id<>?", (name, cid)).fetchone()
        if clash:
            raise InputError(f"{clash[0]} is already called {name!r}; merge the two or choose another name")
    with store.transaction() as c:
        c.execute("UPDATE nodes SET name=? WHERE id=?", (name, cid))
        store.journal("person_renamed", detail=f"{cid} -> {name}")
    return cid


def merge(store, a: str, b: str) -> str:
    """Make two people one; the result keeps ``a``'s id and name (or ``b``'s name if ``a`` has none)."""
    from m3mem.errors import InputError
    from m3mem.writer import refresh_characters

    ca, cb = resolve(store, a), resolve(store, b)
    if ca == cb:
        return ca
    ma, mb = members(store, ca), members(store, cb)
    name_a, name_b = store.node(ca)["name"], store.node(cb)["name"]
    with store.transaction() as c:
        for x in ma:
            for y in mb:
                lo, hi = sorted((x, y), key=_order)
                c.execute("DELETE FROM edges WHERE src=? AND dst=? AND kind='not_same_person'", (lo, hi))
        anchor_a, anchor_b = ma[0], mb[0]
        store.add_edge(*sorted((anchor_a, anchor_b), key=_order), "same_person")
        # the merged group votes for a's id: b's members take a's id before the rebuild
        c.execute("UPDATE edges SET dst=? WHERE kind='member' AND dst=?", (ca, cb))
        c.execute("UPDATE nodes SET name=? WHERE id=?", (name_a or name_b, ca))
        store.journal("people_merged", detail=f"{cb} into {ca}")
    mapping = refresh_characters(store)
    if mapping[ma[0]] != mapping[mb[0]]:
        raise InputError(f"{ca} and {cb} were seen or heard at the same time, so they stay two people")
    return mapping[ma[0]]


def split(store, person: str, entities: list[str]) -> str:
    """Take faces/voices out of a person into a new person of their own; returns the new id."""
    from m3mem.errors import InputError
    from m3mem.writer import refresh_characters

    cid = resolve(store, person)
    group = members(store, cid)
    moving = [e for e in entities if e in group]
    if not moving or len(moving) == len(group):
        raise InputError(f"split needs some, not all, of {cid}'s faces and voices ({', '.join(group)})")
    staying = [e for e in group if e not in moving]
    with store.transaction() as c:
        for x in moving:
            for y in staying:
                lo, hi = sorted((x, y), key=_order)
                c.execute("DELETE FROM edges WHERE src=? AND dst=? AND kind='same_person'", (lo, hi))
                store.add_edge(lo, hi, "not_same_person")
        for i, x in enumerate(moving[1:], 1):
            store.add_edge(*sorted((moving[0], x), key=_order), "same_person")
        store.journal("person_split", detail=f"{', '.join(moving)} out of {cid}")
    mapping = refresh_characters(store)
    return mapping[moving[0]]
