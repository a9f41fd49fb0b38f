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


def _label(hit: ClipHit) -> str:
    return f"{hit.video} {hit.start_s:.0f}-{hit.end_s:.0f}s"


def answer_with_model(store, embedder, question: str, config, before_s: float | None = None,
                      chat=None) -> Answer:
    """Multi-round retrieval driven by a control model: ``[Search]`` until it ``[Answer]``s.

    Each search returns only clips not returned before; a repeated or fruitless
    search gets a hint instead. A reply in neither format is asked again once;
    the last round must answer. Citations are the clips the searches returned,
    best first.
    """
    from m3mem.parse import ParseError, parse_action
    from m3mem.prompts import control
    from m3mem.retrieval import character_map, translate

    if chat is None:
        from models.registry import load_chat_model

        chat = load_chat_model(config.control_model, config.device)
    max_rounds = config.max_rounds
    searches: list[dict] = []  # what the model has seen: {"query", "results"}
    rounds: list[dict] = []
    returned: dict[int, ClipHit] = {}
    seen_queries: set[str] = set()
    answer_text = None
    for r in range(max_rounds):
        final = r == max_rounds - 1
        messages = control(question, searches, r, max_rounds, final=final)
        reply = chat.chat(messages)
        try:
            action, content = parse_action(reply)
        except ParseError as e:
            log.warning("control reply not in the [Search]/[Answer] format, asking again: %s", e)
            reply = chat.chat(messages)
            try:
                action, content = parse_action(reply)
            except ParseError:
                # keep what the model said rather than failing the question
                action, content = ("answer", reply.strip()) if final else ("search", question)
        if final and action != "answer":
            action, content = "answer", content
        if action == "answer":
            answer_text = content
            rounds.append({"round": r + 1, "action": "answer", "output": reply})
            break
        key = " ".join(content.lower().split())
        if key in seen_queries:
            hits, results = [], {"hint": ["This search was already made; search for something different."]}
        else:
            seen_queries.add(key)
            hits = search(store, embedder, content, top_k=config.top_k, exclude_clips=set(returned), before_s=before_s)
            results = {_label(h): list(h.lines) for h in hits} or {
                "hint": ["Nothing new was found; try other words, a person's <character_N> id, or answer."]
            }
        for h in hits:
            returned[h.clip_id] = h
        searches.append({"query": content, "results": results})
        rounds.append({"round": r + 1, "action": "search", "query": content,
                       "clips": [h.to_json() for h in hits], "output": reply})
    mapping = character_map(store)
    answer_text = translate(answer_text or "", mapping)
    best = sorted(returned.values(), key=lambda h: -h.score)[:config.top_k]
    return Answer(answer_text, [cite(h) for h in best], rounds)
