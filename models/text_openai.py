"""Text embeddings through an OpenAI-compatible ``POST {base_url}/embeddings``.

Config string (same syntax and environment as ``models.chat_openai``)::

    openai:http://127.0.0.1:8000/v1?model=BAAI/bge-m3
    openai:https://api.openai.com/v1?model=text-embedding-3-large&dim=3072

The model name comes from ``?model=`` or ``M3MEM_OPENAI_EMBEDDING_MODEL`` (else the
first model the server lists). ``dim`` may be given; otherwise it is learned from the
first reply (reading ``.dim`` before any call sends one probe text). ``batch_size``
(default 64) texts go per request. Vectors come back float32 and L2-normalised.
"""
from __future__ import annotations

import logging
import threading
from typing import Mapping, Sequence

import numpy as np

from m3mem.errors import ModelError
from m3mem.records import l2_normalize
from models.chat_openai import HttpClient, api_key, parse_endpoint

log = logging.getLogger(__name__)

ENV_EMBEDDING_MODEL = "M3MEM_OPENAI_EMBEDDING_MODEL"


class OpenAIEmbedder:
    def __init__(self, arg: str | None, device: str = "cpu", env: Mapping[str, str] | None = None):
        self.endpoint = parse_endpoint(arg, env, model_env=ENV_EMBEDDING_MODEL)
        self.client = HttpClient(self.endpoint, api_key(env))
        self._model = self.endpoint.model
        self._dim = self.endpoint.dim
        self._lock = threading.Lock()
        self.name = f"openai:{self.endpoint.base_url}" + (f"?model={self._model}" if self._model else "")

    @property
    def model(self) -> str:
        with self._lock:
            if self._model is None:
                listing = self.client.request("GET", "models")
                ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict) and m.get("id")]
                if not ids:
                    raise ModelError(f"{self.endpoint.url('models')} lists no model; name one with "
                                     f"'?model=NAME' or {ENV_EMBEDDING_MODEL}")
                self._model = ids[0]
            return self._model

    @property
    def dim(self) -> int:
        if self._dim is None:
            self.embed(["dimension probe"])
        return int(self._dim)

    def _batch(self, texts: list[str]) -> np.ndarray:
        # servers reject empty strings; a space embeds as "nothing said"
        inputs = [t if t.strip() else " " for t in texts]
        url = self.endpoint.url("embeddings")
        body = self.client.request("POST", "embeddings", {"model": self.model, "input": inputs})
        try:
            data = sorted(body["data"], key=lambda d: d.get("index", 0))
            vecs = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{url} answered without data[].embedding lists of numbers") from e
        if vecs.ndim != 2 or vecs.shape[0] != len(inputs):
            raise ModelError(f"{url} returned {vecs.shape[0] if vecs.ndim == 2 else 'no'} vectors "
                             f"for {len(inputs)} texts")
        return vecs

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        size = self.endpoint.batch_size
        out = np.concatenate([self._batch(texts[i:i + size]) for i in range(0, len(texts), size)])
        with self._lock:
            if self._dim is None:
                self._dim = int(out.shape[1])
                log.info("%s: embeddings have %d dimensions", self.name, self._dim)
        if out.shape[1] != self._dim:
            raise ModelError(f"{self.endpoint.url('embeddings')} returned {out.shape[1]}-d vectors, "
                             f"expected {self._dim} (dim={self._dim}); is it the same model the store was built with?")
        if not np.all(np.isfinite(out)):
            raise ModelError(f"{self.endpoint.url('embeddings')} returned non-finite values")
        return l2_normalize(out)
