"""Chat through any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, hosted APIs),
with the Python standard library only.

Config string::

    openai:http://127.0.0.1:8000/v1
    openai:http://gpu-host:8000/v1?model=M3-Agent-Control&concurrency=16&timeout_s=600
    openai:https://api.openai.com/v1?model=gpt-4o&audio=0

Query parameters (each also settable by environment, the query wins):

=================  ===============================  ===========================================
``model``          ``M3MEM_OPENAI_MODEL``           model name; without one, the first id that
                                                    ``GET /models`` lists (vLLM serves one)
``timeout_s``      ``M3MEM_OPENAI_TIMEOUT_S``       seconds per request (default 300)
``retries``        ``M3MEM_OPENAI_RETRIES``         retries after the first try (default 4)
``concurrency``    ``M3MEM_OPENAI_CONCURRENCY``     requests in flight per endpoint, process-wide
                                                    (default 8; the first limit set for an
                                                    endpoint in a process holds)
``audio``          ``M3MEM_OPENAI_AUDIO``           1: send audio parts as ``input_audio`` WAV;
                                                    0: drop them (default 1)
``max_frames``     ``M3MEM_OPENAI_MAX_FRAMES``      frames sent per video part (default 16)
``image_max_px``   ``M3MEM_OPENAI_IMAGE_MAX_PX``    longest image side sent (default 1024)
=================  ===============================  ===========================================

Other query parameters stay in the URL (``api-version=...`` for Azure).
The API key comes from ``M3MEM_OPENAI_API_KEY``, else ``OPENAI_API_KEY``; none is
needed for a local server.

Images go as JPEG data URLs in the OpenAI vision format; a ``video`` part goes as up
to ``max_frames`` evenly sampled frames, each labelled with its time. Audio parts go as
``input_audio`` (16 kHz WAV, base64): OpenAI's audio models and vLLM serving audio
models (Qwen2.5-Omni) accept them; text-only or vision-only servers reject the
request, so set ``audio=0`` for those.

Connection errors, 5xx and 429 are retried with exponential backoff and jitter,
waiting at least what ``Retry-After`` asks. A timeout is not retried: the server may
still be generating, and a retry would queue the same work twice.
"""
from __future__ import annotations

import base64
import email.utils
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable, Mapping

from m3mem.errors import ConfigError, InputError, ModelError
from models.media import jpeg_data_url, parts_of, resample, sample_frames, wav_bytes

log = logging.getLogger(__name__)

ENV_MODEL = "M3MEM_OPENAI_MODEL"
ENV_API_KEYS = ("M3MEM_OPENAI_API_KEY", "OPENAI_API_KEY")
AUDIO_SR = 16000
_BODY_EXCERPT = 300


@dataclass(frozen=True)
class Endpoint:
    """A parsed ``openai:`` config string."""

    base_url: str  # no trailing slash, our own query parameters removed
    query: str  # the query parameters that stay on every request URL
    model: str | None
    timeout_s: float = 300.0
    retries: int = 4
    concurrency: int = 8
    audio: bool = True
    max_frames: int = 16
    image_max_px: int = 1024
    dim: int | None = None  # embeddings only
    batch_size: int = 64  # embeddings only

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}" + (f"?{self.query}" if self.query else "")


_PARAMS: dict[str, tuple[type, str | None]] = {
    "timeout_s": (float, "M3MEM_OPENAI_TIMEOUT_S"),
    "retries": (int, "M3MEM_OPENAI_RETRIES"),
    "concurrency": (int, "M3MEM_OPENAI_CONCURRENCY"),
    "audio": (bool, "M3MEM_OPENAI_AUDIO"),
    "max_frames": (int, "M3MEM_OPENAI_MAX_FRAMES"),
    "image_max_px": (int, "M3MEM_OPENAI_IMAGE_MAX_PX"),
    "dim": (int, None),
    "batch_size": (int, "M3MEM_OPENAI_BATCH_SIZE"),
}


def _coerce(name: str, typ: type, value: str, spec: str):
    try:
        if typ is bool:
            v = value.strip().lower()
            if v not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(value)
            return v in ("1", "true", "yes", "on")
        out = typ(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} in {spec!r} is not a valid {typ.__name__}") from None
    if name in ("timeout_s", "concurrency", "max_frames", "image_max_px", "dim", "batch_size") and out <= 0:
        raise ConfigError(f"{name} must be positive in {spec!r}, got {value}")
    if name == "retries" and out < 0:
        raise ConfigError(f"retries must be 0 or more in {spec!r}, got {value}")
    return out


def parse_endpoint(arg: str | None, env: Mapping[str, str] | None = None, model_env: str = ENV_MODEL) -> Endpoint:
    """``http://host:8000/v1?model=X&timeout_s=60`` -> ``Endpoint``; see the module doc."""
    env = os.environ if env is None else env
    if not arg:
        raise ConfigError("the openai backend needs a base URL: 'openai:http://host:8000/v1'")
    parts = urllib.parse.urlsplit(arg)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"'openai:{arg}' is not an http(s) URL; write for example 'openai:http://127.0.0.1:8000/v1'")
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _PARAMS or k == "model"}
    kept = urllib.parse.urlencode([(k, v) for k, v in query if k not in ours])
    values: dict = {}
    for name, (typ, env_name) in _PARAMS.items():
        raw = ours.get(name, env.get(env_name) if env_name else None)
        if raw not in (None, ""):
            values[name] = _coerce(name, typ, raw, arg)
    model = ours.get("model") or env.get(model_env) or None
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return Endpoint(base_url=base, query=kept, model=model, **values)


def api_key(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    for name in ENV_API_KEYS:
        if env.get(name):
            return env[name]
    return None


# One semaphore per endpoint for the whole process, so that every model object,
# thread and pipeline stage talking to one server shares its limit.
_SEMAPHORES: dict[str, tuple[int, threading.BoundedSemaphore]] = {}
_SEMAPHORES_LOCK = threading.Lock()


def endpoint_semaphore(base_url: str, limit: int) -> threading.BoundedSemaphore:
    with _SEMAPHORES_LOCK:
        if base_url in _SEMAPHORES:
            have, sem = _SEMAPHORES[base_url]
            if have != limit:
                log.warning("concurrency for %s is already %d in this process; ignoring %d", base_url, have, limit)
            return sem
        sem = threading.BoundedSemaphore(limit)
        _SEMAPHORES[base_url] = (limit, sem)
        return sem


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _excerpt(data: bytes | str) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return text if len(text) <= _BODY_EXCERPT else text[:_BODY_EXCERPT] + "..."


class HttpClient:
    """JSON over HTTP with retries, backoff, a timeout and the endpoint's concurrency limit."""

    retry_statuses = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

    def __init__(self, endpoint: Endpoint, key: str | None = None, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, max_retry_after_s: float = 120.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.endpoint = endpoint
        self.key = key
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.sleep = sleep  # injectable, so tests can see the waits without timing them
        self.semaphore = endpoint_semaphore(endpoint.base_url, endpoint.concurrency)
        self.attempts = 0  # total HTTP attempts made, for logs and tests

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "m3mem"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with equal jitter: in [d/2, d] for d = backoff_s * 2**attempt."""
        d = min(self.max_backoff_s, self.backoff_s * (2 ** attempt))
        return d / 2 + random.uniform(0, d / 2)

    def _once(self, method: str, url: str, data: bytes | None) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(url, data=data, method=method, headers=self._headers())
        with self.semaphore:
            self.attempts += 1
            try:
                with urllib.request.urlopen(req, timeout=self.endpoint.timeout_s) as resp:
                    return resp.status, dict(resp.headers.items()), resp.read()
            except urllib.error.HTTPError as e:
                try:
                    body = e.read()
                except (OSError, http.client.HTTPException):
                    body = b""
                return e.code, dict(e.headers.items()) if e.headers else {}, body

    def request(self, method: str, path: str, payload: dict | None = None) -> dict:
        url = self.endpoint.url(path)
        data = json.dumps(payload).encode("utf-8") if payload is not None else None
        tries = self.endpoint.retries + 1
        last = ""
        for attempt in range(tries):
            retry_after = None
            try:
                status, headers, body = self._once(method, url, data)
            except (TimeoutError, socket.timeout) as e:
                raise ModelError(
                    f"{method} {url} timed out after {self.endpoint.timeout_s:g} s ({e}); raise timeout_s "
                    f"(?timeout_s=... or M3MEM_OPENAI_TIMEOUT_S) or lower max_tokens") from e
            except urllib.error.URLError as e:
                if isinstance(e.reason, (TimeoutError, socket.timeout)):
                    raise ModelError(f"{method} {url} timed out after {self.endpoint.timeout_s:g} s while connecting; "
                                     f"is the server up and reachable?") from e
                last = f"cannot connect ({e.reason})"
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                last = f"connection failed ({type(e).__name__}: {e})"
            else:
                if 200 <= status < 300:
                    try:
                        return json.loads(body)
                    except (json.JSONDecodeError, UnicodeDecodeError) as e:
                        raise ModelError(f"{method} {url} returned HTTP {status} with a body that is not JSON: "
                                         f"{_excerpt(body)!r}") from e
                last = f"HTTP {status}: {_excerpt(body)}"
                if status not in self.retry_statuses:
                    raise ModelError(f"{method} {url} failed with {last}{_hint(status)}")
                retry_after = _retry_after_s(headers.get("Retry-After") or headers.get("retry-after"))
                if retry_after is not None and retry_after > self.max_retry_after_s:
                    raise ModelError(f"{method} {url} failed with {last}; the server asks to retry after "
                                     f"{retry_after:.0f} s, longer than m3mem waits ({self.max_retry_after_s:.0f} s)")
            if attempt == tries - 1:
                break
            delay = self.backoff(attempt)
            if retry_after is not None:
                delay = max(delay, retry_after)
            log.warning("%s %s: %s; retry %d of %d in %.2f s", method, url, last, attempt + 1, tries - 1, delay)
            self.sleep(delay)
        raise ModelError(f"{method} {url} failed after {tries} attempt(s); last: {last}")


def _hint(status: int) -> str:
    if status in (401, 403):
        return f"; set {ENV_API_KEYS[0]} (or {ENV_API_KEYS[1]}) to a key this server accepts"
    if status == 404:
        return "; check the base URL (it usually ends in /v1) and the model name"
    if status in (400, 413, 422):
        return "; the server rejected the request (a model without vision or audio input? try audio=0)"
    return ""


def _text_of_content(content) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers answer with a list of parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


class OpenAIChatModel:
    """``ChatModel`` over ``POST {base_url}/chat/completions``."""

    def __init__(self, arg: str | None, device: str = "cpu", env: Mapping[str, str] | None = None):
        self.endpoint = parse_endpoint(arg, env)
        self.client = HttpClient(self.endpoint, api_key(env))
        self._model = self.endpoint.model
        self._model_lock = threading.Lock()
        self.name = f"openai:{self.endpoint.base_url}"

    @property
    def model(self) -> str:
        """The model name; asked of the server (``GET /models``) when none was configured."""
        with self._model_lock:
            if self._model is None:
                listing = self.client.request("GET", "models")
                ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict) and m.get("id")]
                if not ids:
                    raise ModelError(f"{self.endpoint.url('models')} lists no model; name one with "
                                     f"'?model=NAME' or {ENV_MODEL}")
                if len(ids) > 1:
                    log.warning("%s serves %d models; using %s (choose with ?model=NAME)", self.name, len(ids), ids[0])
                self._model = ids[0]
            return self._model

    # -- message conversion
    def _part(self, part: dict) -> list[dict]:
        kind = part["type"]
        if kind == "text":
            return [{"type": "text", "text": str(part.get("text", ""))}]
        if kind == "image":
            return [{"type": "image_url",
                     "image_url": {"url": jpeg_data_url(part["image"], max_side_px=self.endpoint.image_max_px)}}]
        if kind == "video":
            out = []
            for t_s, frame in sample_frames(part.get("frames", []), float(part.get("fps", 1.0)), self.endpoint.max_frames):
                out.append({"type": "text", "text": f"[frame at {t_s:.1f} s]"})
                out.append({"type": "image_url",
                            "image_url": {"url": jpeg_data_url(frame, max_side_px=self.endpoint.image_max_px)}})
            return out
        if kind == "audio":
            if not self.endpoint.audio:
                log.debug("%s: audio part dropped (audio=0)", self.name)
                return []
            sr = int(part.get("sr", AUDIO_SR))
            wav = wav_bytes(resample(part["audio"], sr, AUDIO_SR), AUDIO_SR)
            return [{"type": "input_audio",
                     "input_audio": {"data": base64.b64encode(wav).decode("ascii"), "format": "wav"}}]
        raise InputError(f"unknown chat message part {kind!r}")

    def convert(self, messages: list[dict]) -> list[dict]:
        """m3mem messages -> OpenAI chat messages (media inlined as base64)."""
        out = []
        for m in messages:
            role = m.get("role")
            if role not in ("system", "user", "assistant", "tool", "developer"):
                raise InputError(f"unknown chat role {role!r}")
            parts = [p for part in parts_of(m) for p in self._part(part)]
            if all(p["type"] == "text" for p in parts):
                # plain strings where possible: every server takes them, not every one takes part lists
                out.append({"role": role, "content": "\n".join(p["text"] for p in parts)})
            else:
                out.append({"role": role, "content": parts})
        return out

    def chat(self, messages: list[dict], temperature: float = 0.0, max_new_tokens: int | None = None,
             max_tokens: int | None = None, top_p: float | None = None, stop: list[str] | None = None,
             seed: int | None = None, response_format: dict | None = None) -> str:
        """The reply's text. ``max_new_tokens`` and ``max_tokens`` are the same limit."""
        payload: dict = {"model": self.model, "messages": self.convert(messages), "temperature": float(temperature)}
        limit = max_tokens if max_tokens is not None else max_new_tokens
        if limit is not None:
            payload["max_tokens"] = int(limit)
        for k, v in (("top_p", top_p), ("stop", stop), ("seed", seed), ("response_format", response_format)):
            if v is not None:
                payload[k] = v
        body = self.client.request("POST", "chat/completions", payload)
        try:
            choice = body["choices"][0]
            text = _text_of_content(choice["message"].get("content"))
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise ModelError(f"{self.endpoint.url('chat/completions')} answered without choices[0].message: "
                             f"{_excerpt(json.dumps(body))!r}") from e
        if choice.get("finish_reason") == "length":
            log.warning("%s: reply cut at max_tokens=%s", self.name, limit)
        if text is None:
            raise ModelError(f"{self.endpoint.url('chat/completions')} answered with no text "
                             f"(finish_reason={choice.get('finish_reason')!r})")
        return text

    def chat_batch(self, conversations: list[list[dict]], **kwargs) -> list[str]:
        """Replies to several chats, sent in parallel up to the endpoint's concurrency limit."""
        from concurrent.futures import ThreadPoolExecutor

        if not conversations:
            return []
        with ThreadPoolExecutor(max_workers=min(len(conversations), self.endpoint.concurrency)) as pool:
            return list(pool.map(lambda msgs: self.chat(msgs, **kwargs), conversations))
