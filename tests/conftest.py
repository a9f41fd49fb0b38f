"""Fixtures shared by every test folder: where the repository and the real test media are."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# real media with ground truth live beside the repository, never inside it (see the README)
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``<repo>/../shared/data``; tests that need it are skipped when it is absent."""
    if not (SHARED_DATA / "MANIFEST.md").is_file():
        pytest.skip(f"real test media not found at {SHARED_DATA.resolve()} "
                    f"(a folder 'shared/data' beside the repository, with MANIFEST.md)")
    return SHARED_DATA.resolve()
