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
