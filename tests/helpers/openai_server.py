"""A real OpenAI-compatible HTTP server on loopback, scripted with a queue of replies.

    with OpenAIServer() as server:
        server.script(Reply.chat("hello"), Reply.error(500), Reply.chat("ok"))
        model = OpenAIChatModel(server.url + "?model=m", device="cpu")
        ...
        server.requests        # what it received, in order
        server.peak_in_flight  # the most requests it was handling at once

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``.
A request takes the next scripted reply of its kind; with none left it gets the
default (a chat reply echoing the request's last text, or embeddings derived from a
hash of each input text, so embedding tests need no script).
"""
from __future__ import annotations

import collections
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


@dataclass
class Reply:
    status: int = 200
    body: dict | str | bytes | None = None  # dict -> JSON; str/bytes sent as they are
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0  # wait before replying (beyond a client's timeout: a slow server)

    @staticmethod
    def chat(text: str | None, finish_reason: str = "stop", **kw) -> "Reply":
        return Reply(body={
            "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test",
            "choices": [{"index": 0, "finish_reason": finish_reason,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }, **kw)

    @staticmethod
    def error(status: int, message: str = "scripted error", **kw) -> "Reply":
        return Reply(status=status, body={"error": {"message": message, "type": "server_error"}}, **kw)

    @staticmethod
    def embeddings(vectors, **kw) -> "Reply":
        return Reply(body={"object": "list", "model": "test", "data": [
            {"object": "embedding", "index": i, "embedding": [float(x) for x in v]} for i, v in enumerate(vectors)]}, **kw)


@dataclass
class Request:
    method: str
    path: str
    headers: dict
    body: dict | None


def hash_vector(text: str, dim: int) -> np.ndarray:
    """A deterministic, unnormalised vector for ``text``: equal texts, equal vectors."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=dim).astype(np.float32) * 3.0


class OpenAIServer:
    def __init__(self, embedding_dim: int = 16, model_id: str = "test-model"):
        self.embedding_dim = embedding_dim
        self.model_id = model_id
        self.requests: list[Request] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._queues: dict[str, collections.deque] = {"chat": collections.deque(), "embeddings": collections.deque()}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="openai-test-server", daemon=True)

    # -- lifecycle
    def start(self) -> "OpenAIServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes handlers that are sleeping through a delay
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- scripting
    def script(self, *replies: Reply, kind: str = "chat") -> None:
        with self._lock:
            self._queues[kind].extend(replies)

    def chat_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _next(self, kind: str) -> Reply | None:
        with self._lock:
            q = self._queues[kind]
            return q.popleft() if q else None

    def _default(self, kind: str, body: dict | None) -> Reply:
        if kind == "embeddings":
            inputs = (body or {}).get("input", [])
            inputs = [inputs] if isinstance(inputs, str) else inputs
            return Reply.embeddings([hash_vector(t, self.embedding_dim) for t in inputs])
        last = ""
        for m in (body or {}).get("messages", []):
            c = m.get("content")
            if isinstance(c, str):
                last = c
            elif isinstance(c, list):
                texts = [p.get("text", "") for p in c if p.get("type") == "text"]
                last = texts[-1] if texts else last
        return Reply.chat(f"echo: {last}")

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = None
                with server._lock:
                    server.requests.append(Request(method, self.path, dict(self.headers.items()), body))
                    server.in_flight += 1
                    server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
                try:
                    self._reply(method, body)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _reply(self, method: str, body: dict | None) -> None:
                path = self.path.split("?")[0].rstrip("/")
                if method == "GET" and path.endswith("/models"):
                    reply = Reply(body={"object": "list", "data": [{"id": server.model_id, "object": "model"}]})
                elif method == "POST" and path.endswith("/chat/completions"):
                    reply = server._next("chat") or server._default("chat", body)
                elif method == "POST" and path.endswith("/embeddings"):
                    reply = server._next("embeddings") or server._default("embeddings", body)
                else:
                    reply = Reply.error(404, f"no route {method} {path}")
                if reply.delay_s and server._closing.wait(reply.delay_s):
                    return
                payload = reply.body
                if isinstance(payload, dict):
                    data = json.dumps(payload).encode()
                elif isinstance(payload, str):
                    data = payload.encode()
                else:
                    data = payload or b""
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, str(v))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def do_POST(self) -> None:
                self._serve("POST")

            def do_GET(self) -> None:
                self._serve("GET")

        return Handler
