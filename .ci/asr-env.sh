#!/usr/bin/env bash
# Creates the second virtualenv that runs the whisperx speech backend and tests/asr/.
#
# whisperx pins its own torch (torch~=2.8 for whisperx 3.8), so it cannot share the main
# environment, whose torch is chosen by the user. m3mem's core installs here too, so the
# backend runs through the same registry and records as everywhere else.
#
#   .ci/asr-env.sh [VENV_DIR]          # default: <repo>/.venv-asr
#   VENV_DIR/bin/python -m pytest tests/asr
#
# A plain install downloads the CUDA build of torch (about 7.6 GB on disk, minutes).
# On a machine without a GPU, set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# to take the CPU wheels of the same torch version instead.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$REPO/.venv-asr}"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

# The core first, then whisperx: whisperx's torch pin wins, and the core has no torch pin.
"${PIP[@]}" install -e "$REPO[test]"
EXTRA=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    EXTRA=(--extra-index-url "$TORCH_INDEX_URL")
fi
"${PIP[@]}" install "${EXTRA[@]}" "whisperx>=3.3"

# Fail here, not in the tests, when the core and whisperx's pins do not coexist.
"${PIP[@]}" check
"$VENV/bin/python" - <<'PY'
import faiss, decord, numpy, torch, ctranslate2, faster_whisper, whisperx
import m3mem, models.speech_whisperx
print("asr env ok: torch", torch.__version__, "numpy", numpy.__version__,
      "ctranslate2", ctranslate2.__version__, "faster_whisper", faster_whisper.__version__)
PY
