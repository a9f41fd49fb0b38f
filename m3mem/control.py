"""Control: answer a question through rounds of retrieval.

Every round either searches memory or answers; the last round must answer.
``lite`` (no language model) searches once with the question and answers with
the best supporting memory lines. A chat model drives the same loop through the
control prompt (``m3mem.prompts``), issuing ``[Search]`` and ``[Answer]`` actions.
Answers cite clips as (video, start, end) so a person can watch them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from m3mem.retrieval import ClipHit, search

log = logging.getLogger(__name__)

NOTHING_FOUND = "Nothing in memory answers this."


@dataclass
class Answer:
    answer: str
    citations: list[dict]
    rounds: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"answer": self.answer, "citations": self.citations, "rounds": self.rounds}


def _seq(item) -> int:
    _, line, hit = item
    node_id = hit.node_ids[hit.lines.index(line)]
    return int(node_id.rpartition("_")[2])


def cite(hit: ClipHit) -> dict:
    return {"video": hit.video, "path": hit.video_path, "start": round(hit.start_s, 3), "end": round(hit.end_s, 3)}


def answer_lite(store, embedder, question: str, top_k: int = 5, before_s: float | None = None,
                max_lines: int = 3, margin: float = 0.1) -> Answer:
    """The best supporting lines across the retrieved clips, each citing its clip."""
    hits = search(store, embedder, question, top_k=top_k, before_s=before_s)
    rounds = [{
        "round": 1, "action": "search", "query": question,
        "clips": [h.to_json() for h in hits], "output": f"{len(hits)} clips",
    }]
    scored = [
        (s, line, hit) for hit in hits
        for line, s in zip(hit.lines, hit.line_scores) if s == s  # NaN: a line the query did not reach
    ]
    scored.sort(key=lambda x: -x[0])
    if not scored:
        rounds.append({"round": 2, "action": "answer", "output": NOTHING_FOUND})
        return Answer(NOTHING_FOUND, [], rounds)
    best = scored[0][0]
    chosen = [x for x in scored if x[0] >= best - margin][:max_lines]
    # read in the order things happened: clip by clip, then line by line
    order = {h.clip_id: (h.video, h.start_s) for h in hits}
    chosen.sort(key=lambda x: (order[x[2].clip_id], _seq(x)))
    text = " ".join(line for _, line, _ in chosen)
    citations, seen = [], set()
    for _, _, hit in chosen:
        if hit.clip_id not in seen:
            seen.add(hit.clip_id)
            citations.append(cite(hit))
    rounds.append({"round": 2, "action": "answer", "output": text})
    return Answer(text, citations, rounds)
