"""Reading what the models write: memory JSON, control actions, entity ids.

``parse_memory`` accepts the key names of m3mem's prompt (``episodic``/``semantic``)
and of M3-Agent's (``video_descriptions``, the singular ``video_description``,
``high_level_conclusions``, ``episodic_memory``/``semantic_memory``); the reference
asks for one set of keys and parses another, which silently empties a clip's memory.
``translate_ids`` rewrites ids token by token; the reference's plain ``str.replace``
turns ``face_10`` into ``character_30`` when it maps ``face_1``.
"""
from __future__ import annotations

import ast
import json
import logging
import re
from typing import Iterable

from m3mem.errors import ModelError
from m3mem.records import ClipMemory

log = logging.getLogger(__name__)

ID_KINDS = ("face", "voice", "character")
EXCERPT_CHARS = 300


class ParseError(ModelError):
    """A model reply that does not have the expected shape; ``excerpt`` is the start of the reply."""

    def __init__(self, message: str, excerpt: str = "", bad_ids: Iterable[str] = ()):
        self.excerpt = excerpt
        self.bad_ids = tuple(sorted(set(bad_ids)))
        super().__init__(f"{message}; reply began: {excerpt!r}" if excerpt else message)


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


# ---------------------------------------------------------------- entity ids

# A tag is <kind_N> or a bare kind_N token; the look-arounds keep face_1 from matching
# inside face_10, my_face_1 or face_1b.
_ID = re.compile(r"<\s*(face|voice|character)_(\d+)\s*>|(?<![\w])(face|voice|character)_(\d+)(?![\w])")


def find_ids(text: str) -> list[str]:
    """Every entity id in ``text`` as ``kind_N``, in order of appearance, repeats kept."""
    return [f"{m.group(1) or m.group(3)}_{m.group(2) or m.group(4)}" for m in _ID.finditer(text)]


def _normalize_id(key: str) -> str:
    return key.strip().strip("<>").strip()


def translate_ids(text: str, mapping: dict[str, str]) -> str:
    """Rewrite entity ids token by token: ``{"face_1": "character_3"}`` turns ``<face_1>``
    into ``<character_3>`` and a bare ``face_1`` into ``character_3``, and leaves
    ``face_10`` alone. Keys and values may be given with or without angle brackets."""
    table = {_normalize_id(k): _normalize_id(v) for k, v in mapping.items()}

    def sub(m: re.Match) -> str:
        bracketed = m.group(1) is not None
        key = f"{m.group(1) or m.group(3)}_{m.group(2) or m.group(4)}"
        new = table.get(key)
        if new is None:
            return m.group(0)
        return f"<{new}>" if bracketed else new

    return _ID.sub(sub, text)


def bracket_ids(text: str) -> str:
    """Write every id as ``<kind_N>`` (models sometimes drop the brackets)."""
    return _ID.sub(lambda m: f"<{m.group(1) or m.group(3)}_{m.group(2) or m.group(4)}>", text)


# ---------------------------------------------------------------- JSON in replies

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```[ \t]*(?:json|python|javascript|js)?[ \t]*\n?(.*?)```", re.S | re.I)


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` blocks (Qwen3 and M3-Agent-Control reason in them)."""
    text = _THINK.sub("", text)
    # a reply cut off inside its reasoning has no answer after it
    if re.search(r"<think>", text, re.I):
        text = re.split(r"<think>", text, flags=re.I)[0]
    return re.sub(r"</think>", "", text, flags=re.I)


def _literal(s: str):
    """JSON, or failing that a Python literal (M3-Agent's prompts ask for a "Python dict")."""
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        pass
    try:
        # literal_eval evaluates literals only: no names, calls or attribute access
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None


def _balanced_spans(text: str, max_starts: int) -> Iterable[tuple[int, int]]:
    """(start, end) of each substring from a '{' or '[' to its matching bracket, string-aware,
    trying at most ``max_starts`` opening brackets (each try may scan the rest of the text)."""
    starts = 0
    for start, ch in enumerate(text):
        if ch not in "{[":
            continue
        starts += 1
        if starts > max_starts:
            return
        stack, quote, escaped = [], None, False
        for i in range(start, len(text)):
            c = text[i]
            if quote:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == quote:
                    quote = None
                continue
            if c in "\"'":
                # an apostrophe inside a word ("Let's") is no string delimiter
                if c == "'" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
                    continue
                quote = c
            elif c in "{[":
                stack.append("}" if c == "{" else "]")
            elif c in "}]":
                if not stack or c != stack.pop():
                    break
                if not stack:
                    yield start, i + 1
                    break


_DECODER = json.JSONDecoder()
_MAX_LITERAL_STARTS = 64  # the Python-literal fallback scans from at most this many brackets


def _json_values(text: str) -> Iterable[tuple[int, object]]:
    """(end, value) of each JSON object or list in ``text``, outermost only, left to right.

    ``raw_decode`` fails within a few characters on prose such as "[x", so this stays
    linear in practice; brackets inside a parsed value are not looked at again.
    """
    i, n = 0, len(text)
    while i < n:
        if text[i] in "{[":
            try:
                value, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            yield end, value
            i = end
        else:
            i += 1


def extract_json(text: str):
    """The JSON (or Python literal) object in a reply, fenced or bare; a list if there is no object.

    Objects win over lists so that prose such as "[2] lists:" before the real answer is
    not taken for it.
    """
    body = strip_thinking(text)
    candidates = [m.group(1).strip() for m in _FENCE.finditer(body)] + [body.strip()]
    lists = []
    for cand in candidates:
        value = _literal(cand)
        if isinstance(value, dict):
            return value
        if isinstance(value, list):
            lists.append(value)
            continue
        for _, value in _json_values(cand):
            if isinstance(value, dict):
                return value
            if isinstance(value, list):
                lists.append(value)
    # single-quoted Python literals (M3-Agent asks for "a Python dict") are not JSON
    for cand in candidates:
        covered = 0
        for start, end in _balanced_spans(cand, _MAX_LITERAL_STARTS):
            if start < covered:
                continue
            value = _literal(cand[start:end])
            if isinstance(value, dict):
                return value
            if isinstance(value, list):
                lists.append(value)
                covered = end
    if lists:
        return lists[0]
    raise ParseError("the reply holds no JSON object or list", _excerpt(text))


# ---------------------------------------------------------------- memory

EPISODIC_KEYS = ("episodic", "episodic_memory", "episodic_memories", "video_descriptions", "video_description",
                 "descriptions", "captions")
SEMANTIC_KEYS = ("semantic", "semantic_memory", "semantic_memories", "high_level_conclusions",
                 "high_level_conclusion", "conclusions", "thinkings")
_TEXT_FIELDS = ("text", "content", "description", "memory", "fact")

_EQUIV = re.compile(r"^\s*equivalence\s*:\s*(.+)$", re.I)


def _lines(value, key: str, reply: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ParseError(f"{key!r} must be a list of strings, got {type(value).__name__}", _excerpt(reply))
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            text = next((item[f] for f in _TEXT_FIELDS if isinstance(item.get(f), str)), None)
            if text is None:
                raise ParseError(f"an item of {key!r} has no text field ({', '.join(_TEXT_FIELDS)}): {item!r}",
                                 _excerpt(reply))
            out.append(text)
        elif isinstance(item, (int, float)):
            out.append(str(item))
        else:
            raise ParseError(f"an item of {key!r} is a {type(item).__name__}, not a string", _excerpt(reply))
    return out


_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "no", "approx",
                  "inc", "ltd", "co", "mt", "ft", "u.s", "a.m", "p.m"}
# a following sentence that starts like this leans on the one before it for its subject
_ANAPHORA = {"he", "she", "they", "it", "his", "her", "hers", "their", "theirs", "its", "him", "them",
             "this", "that", "these", "those", "then", "also", "there", "both", "each", "afterwards",
             "later", "meanwhile", "here", "such", "which", "who", "and", "but", "or", "so", "while"}


def _sentences(line: str) -> list[str]:
    """Split at sentence ends outside quotes; conservative about abbreviations and decimals.

    A sentence may end inside a closing quote (``... 'Let's begin.' The room quiets.``).
    """
    out, start, quote = [], 0, None
    n = len(line)

    def next_start(j: int) -> int | None:
        """Where the next sentence starts if the text at ``j`` is a gap before one."""
        if j >= n or not line[j].isspace():
            return None
        k = j
        while k < n and line[k].isspace():
            k += 1
        if k < n and (line[k].isupper() or line[k].isdigit() or line[k] in "<\"“'‘"):
            return k
        return None

    i = 0
    while i < n:
        c = line[i]
        prev = line[i - 1] if i else " "
        nxt = line[i + 1] if i + 1 < n else " "
        end = None
        if c in "\"“”":
            if quote is None:
                quote = "”" if c == "“" else '"'
            elif c == quote or (quote == '"' and c == "”"):
                quote = None
                end = i + 1 if prev in ".!?" else None
        elif c in "'‘’":
            # an apostrophe inside a word or after an id (<voice_1>'s) opens nothing
            if quote is None and not (prev.isalnum() or prev == ">") and nxt.isalnum():
                quote = "'"
            elif quote == "'" and not nxt.isalnum() and not prev.isspace():
                quote = None
                end = i + 1 if prev in ".!?" else None
        elif c in ".!?" and quote is None:
            j = i + 1
            while j < n and line[j] in ".!?)":
                j += 1
            word = re.findall(r"[\w.]+$", line[start:i])
            abbreviation = c == "." and word and word[0].lower().rstrip(".") in _ABBREVIATIONS
            end = None if abbreviation else j
        if end is not None:
            k = next_start(end)
            if k is not None:
                out.append(line[start:end].strip())
                start = i = k
                continue
        i += 1
    out.append(line[start:].strip())
    return [s for s in out if s]


def split_atomic(line: str) -> list[str]:
    """A multi-sentence line as separate facts, where each sentence stands on its own.

    A sentence that opens with a pronoun or connective ("He has short hair.") stays
    joined to the sentence before it, so no fact loses its subject.
    """
    pieces = _sentences(line)
    merged: list[str] = []
    for p in pieces:
        first = re.match(r"[\"“'‘(]*([A-Za-z]+)", p)
        word = first.group(1).lower() if first else ""
        if merged and (word in _ANAPHORA or not re.search(r"\w", p)):
            merged[-1] = f"{merged[-1]} {p}"
        else:
            merged.append(p)
    return merged


def _clean(line: str) -> str:
    line = re.sub(r"\s+", " ", line).strip()
    line = re.sub(r"^(?:[-*•]\s+|\d+[.)]\s+)", "", line)  # list markers the model added
    return line.strip()


def _normalize_equivalence(line: str, reply: str) -> str | None:
    m = _EQUIV.match(line)
    if not m:
        return None
    ids = find_ids(m.group(1))
    faces = [i for i in ids if i.startswith("face_")]
    voices = [i for i in ids if i.startswith("voice_")]
    if len(faces) != 1 or len(voices) != 1:
        raise ParseError(f"an equivalence must name one face and one voice: {line!r}", _excerpt(reply))
    return f"Equivalence: <{faces[0]}>, <{voices[0]}>"


def parse_memory(text: str, known_ids: set[str], split: bool = True) -> ClipMemory:
    """Episodic and semantic lines from a memorization reply.

    ``known_ids`` are the ids the prompt introduced (``face_3``, ``voice_7``; brackets
    optional). A line naming any other id raises ``ParseError`` (with the bad ids)
    rather than linking a memory to a person who was never in the clip.
    A bare list is read as episodic lines, with its ``Equivalence:`` lines moved to semantic.
    """
    data = extract_json(text)
    known = {_normalize_id(k) for k in known_ids}
    episodic_raw: list[str] = []
    semantic_raw: list[str] = []
    if (isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict)
            and any(str(k).strip().lower() in EPISODIC_KEYS + SEMANTIC_KEYS for k in data[0])):
        data = data[0]  # the object wrapped in a list
    if isinstance(data, list):
        episodic_raw = _lines(data, "list", text)
    else:
        lowered = {str(k).strip().lower().replace(" ", "_"): v for k, v in data.items()}
        epi_keys = [k for k in EPISODIC_KEYS if k in lowered]
        sem_keys = [k for k in SEMANTIC_KEYS if k in lowered]
        if not epi_keys and not sem_keys:
            raise ParseError(
                f"the reply's JSON has none of the keys {EPISODIC_KEYS[0]!r}/{SEMANTIC_KEYS[0]!r} "
                f"(or M3-Agent's 'video_descriptions'/'high_level_conclusions'); it has {sorted(data)}",
                _excerpt(text))
        for k in epi_keys:
            episodic_raw += _lines(lowered[k], k, text)
        for k in sem_keys:
            semantic_raw += _lines(lowered[k], k, text)

    episodic: list[str] = []
    semantic: list[str] = []
    for raw, is_semantic in [(r, False) for r in episodic_raw] + [(r, True) for r in semantic_raw]:
        line = _clean(bracket_ids(raw))
        if not line:
            continue
        equivalence = _normalize_equivalence(line, text)
        if equivalence:
            semantic.append(equivalence)
            continue
        target = semantic if is_semantic else episodic
        target.extend(split_atomic(line) if split else [line])

    bad = sorted({i for line in episodic + semantic for i in find_ids(line)} - known)
    if bad:
        raise ParseError(
            f"the reply names ids that were not in the clip: {', '.join(bad)} "
            f"(known: {', '.join(sorted(known)) or 'none'})", _excerpt(text), bad_ids=bad)
    return ClipMemory(episodic=tuple(dict.fromkeys(episodic)), semantic=tuple(dict.fromkeys(semantic)))


# ---------------------------------------------------------------- control actions

_ACTION = re.compile(
    r"\baction\s*[*_`]*\s*[:：]\s*[*_`]*\s*\[?\s*(search|answer)\s*\]?", re.I)
_BARE_ACTION = re.compile(r"\[\s*(search|answer)\s*\]", re.I)
_CONTENT = re.compile(r"content\s*[*_`]*\s*[:：]\s*", re.I)


def _clean_content(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^```\w*\s*|\s*```$", "", s).strip()
    s = s.strip("*_` \n")
    return s.strip()


def parse_action(text: str) -> tuple[str, str]:
    """``("search", query)`` or ``("answer", answer)`` from a control reply in the format
    ``Action: [Search]`` / ``Content: ...``; tolerant of case, markdown and a leading
    ``<think>`` block. The last action in the reply wins (models restate the format first)."""
    body = strip_thinking(text)
    matches = list(_ACTION.finditer(body)) or list(_BARE_ACTION.finditer(body))
    if not matches:
        raise ParseError("the reply has neither 'Action: [Search]' nor 'Action: [Answer]'", _excerpt(text))
    m = matches[-1]
    action = m.group(1).lower()
    rest = body[m.end():]
    c = _CONTENT.search(rest)
    content = _clean_content(rest[c.end():] if c else rest)
    if not content:
        raise ParseError(f"the [{action.capitalize()}] action has no content", _excerpt(text))
    return action, content
