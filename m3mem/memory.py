"""``Memory``: the public object. Four verbs on one store: ingest, search, ask, people."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Iterable

from m3mem.config import Config
from m3mem.control import Answer, answer_lite
from m3mem.people import Person, list_people
from m3mem.retrieval import ClipHit, search
from m3mem.store import Store

log = logging.getLogger(__name__)


class Memory:
    def __init__(self, store_dir: str | Path, config: Config | None = None, read_only: bool = False):
        self.config = config or Config()
        self.store = Store.open(store_dir, create=not read_only, read_only=read_only)
        self._embedder = None

    @property
    def embedder(self):
        if self._embedder is None:
            from models.registry import load_text_embedder

            stored = self.store.get_meta("backend.text")
            if stored and stored != self.config.text_model:
                log.warning("store was built with text model %s; using it instead of %s", stored, self.config.text_model)
            self._embedder = load_text_embedder(stored or self.config.text_model, self.config.device)
        return self._embedder

    def ingest(self, paths: Iterable[str | Path], progress: Callable[[str, int, int], None] | None = None,
               retry_failed: bool = False):
        from pipelines.ingest import Ingestor

        return Ingestor(self.store, self.config, progress).ingest(paths, retry_failed=retry_failed)

    def search(self, query: str, top_k: int | None = None, before_s: float | None = None) -> list[ClipHit]:
        self.store.refresh()
        return search(self.store, self.embedder, query, top_k=top_k or self.config.top_k, before_s=before_s)

    def ask(self, question: str, before_s: float | None = None) -> Answer:
        self.store.refresh()
        if self.config.control_model == "lite":
            return answer_lite(self.store, self.embedder, question, top_k=self.config.top_k, before_s=before_s)
        from m3mem.control import answer_with_model

        return answer_with_model(self.store, self.embedder, question, self.config, before_s=before_s)

    def people(self) -> list[Person]:
        return list_people(self.store)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
