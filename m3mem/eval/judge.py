"""Judges: is an answer right, given the question and the ground truth?

``ChatJudge`` asks a language model, through any chat backend, whether the ground
truth can be inferred from the answer, and reads a yes or a no (the criterion of
M3-Agent's evaluation). ``StringMatchJudge`` needs no model: the normalised ground
truth must appear in the normalised answer, and a yes/no ground truth must be the
answer's first word. It is stricter than a language model and never generous, so
its accuracy is a floor.

M3-Agent counts a reply as "yes" when the substring "yes" occurs anywhere in it
("The answer is not yes" passes); here the reply must start with yes or no, after
any reasoning block, or hold exactly one of the two words.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Protocol

from m3mem.errors import ConfigError

log = logging.getLogger(__name__)

JUDGE_PROMPT = """You are grading the answer of a question-answering agent.

Question: {question}
Ground truth answer: {ground_truth}
Agent answer: {answer}

Decide whether the ground truth answer can be inferred from the agent answer, in the context of the question. \
Judge meaning, not wording: a paraphrase, a more detailed answer or a different format that implies the \
ground truth counts as "Yes". An answer that contradicts the ground truth, leaves it out, or only guesses \
at several options counts as "No".

Reply with one word: Yes or No."""


@dataclass(frozen=True)
class Verdict:
    correct: bool
    method: str  # "string" or "chat:<backend>"
    reply: str = ""  # what a chat judge said, for auditing


class Judge(Protocol):
    name: str

    def judge(self, question: str, ground_truth: str, answer: str) -> Verdict: ...


# --- string match ---------------------------------------------------------------------

_ARTICLES = {"a", "an", "the"}
_YES_NO = {"yes", "no"}
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)?")
_NUMBERS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "once": "1", "twice": "2",
}


def normalize_answer(text: str) -> list[str]:
    """Lower-case words without punctuation, articles dropped, number words as digits."""
    words = _WORD.findall(text.lower().replace("’", "'"))
    return [_NUMBERS.get(w, w) for w in words if w not in _ARTICLES]


def string_match(ground_truth: str, answer: str) -> bool:
    gt, ans = normalize_answer(ground_truth), normalize_answer(answer)
    if not gt or not ans:
        return False
    if gt[0] in _YES_NO and len(gt) <= 2:
        # "Yes." / "No, he doesn't": the answer must commit to the same word first
        return ans[0] == gt[0]
    n = len(gt)
    return any(ans[i:i + n] == gt for i in range(len(ans) - n + 1))


class StringMatchJudge:
    name = "string"

    def judge(self, question: str, ground_truth: str, answer: str) -> Verdict:
        return Verdict(string_match(ground_truth, answer), self.name)


# --- chat model -----------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FIRST = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_ANY = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_verdict(reply: str) -> bool | None:
    """True for yes, False for no, None when the reply says neither or both."""
    text = _THINK.sub(" ", reply)
    if "</think>" in text.lower():  # a reasoning block whose opening tag the template swallowed
        text = text.lower().rsplit("</think>", 1)[1]
    m = _FIRST.match(text)
    if m:
        return m.group(1).lower() == "yes"
    found = {w.lower() for w in _ANY.findall(text)}
    if len(found) == 1:
        return found.pop() == "yes"
    return None


class ChatJudge:
    """A yes/no judgement from any ``ChatModel``; an unreadable reply is asked again, then counts as no."""

    def __init__(self, chat_model, spec: str, retries: int = 1):
        self.chat = chat_model
        self.name = f"chat:{spec}"
        self.retries = retries

    def judge(self, question: str, ground_truth: str, answer: str) -> Verdict:
        if not answer.strip():
            return Verdict(False, self.name, "")
        messages = [{"role": "user", "content": JUDGE_PROMPT.format(
            question=question.strip(), ground_truth=ground_truth.strip(), answer=answer.strip())}]
        reply = ""
        for attempt in range(self.retries + 1):
            # temperature 0: the same answer must get the same grade on every run
            reply = self.chat.chat(messages, temperature=0.0)
            verdict = parse_verdict(reply)
            if verdict is not None:
                return Verdict(verdict, self.name, reply.strip())
            log.warning("judge reply is neither yes nor no (attempt %d): %.200r", attempt + 1, reply)
        return Verdict(False, self.name, reply.strip())


def load_judge(spec: str | None, device: str = "auto") -> Judge:
    """``None``, ``""`` or ``"string"``: string match; anything else is a chat backend spec
    (``"openai:http://localhost:8000/v1"``, ``"transformers:/models/Qwen3-8B"``)."""
    if spec is None or spec.strip().lower() in ("", "string", "none"):
        return StringMatchJudge()
    if spec.strip().lower() == "lite":
        raise ConfigError("the judge needs a chat model ('openai:URL' or 'transformers:FOLDER'), "
                          "or 'string' for the normalised string match; 'lite' is no language model")
    from models.registry import load_chat_model

    return ChatJudge(load_chat_model(spec, device), spec)
