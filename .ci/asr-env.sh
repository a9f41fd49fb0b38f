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
# to take the CPU wheels of the same torch version instead. EXTRAS (default "test") picks
# m3mem's extras for this environment, e.g. EXTRAS=face,test to add insightface.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$REPO/.venv-asr}"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

# The core first, then whisperx: whisperx's torch pin wins, and the core has no torch pin.
"${PIP[@]}" install -e "$REPO[${EXTRAS:-test}]"
EXTRA=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    EXTRA=(--extra-index-url "$TORCH_INDEX_URL")
fi
"${PIP[@]}" install "${EXTRA[@]}" "whisperx>=3.3"

# Fail here, not in the tests, when the core and whisperx's pins do not coexist.
# decord's only wheel is tagged cp36-cp36m yet loads on any CPython 3, and pip check
# calls it "not supported on this platform"; the import below is the real test.
if ! problems="$("${PIP[@]}" check 2>&1)"; then
    problems="$(grep -v 'is not supported on this platform' <<<"$problems" || true)"
    if [ -n "$problems" ]; then
        echo "$problems" >&2
        exit 1
    fi
fi
# whisperX's word alignment splits sentences with NLTK's punkt_tab data and would download
# it mid-run; fetch it now into the venv (on NLTK's search path). The tests bring their own.
if ! "$VENV/bin/python" -c "import nltk, sys; sys.exit(0 if nltk.download('punkt_tab', download_dir=sys.prefix + '/nltk_data', quiet=True, raise_on_error=True) else 1)"; then
    echo "warning: could not download NLTK punkt_tab; word alignment will need NLTK_DATA" >&2
fi

"$VENV/bin/python" - <<'PY'
import faiss, decord, numpy, torch, ctranslate2, faster_whisper, whisperx
import m3mem, models.speech_whisperx
print("asr env ok: torch", torch.__version__, "numpy", numpy.__version__,
      "ctranslate2", ctranslate2.__version__, "faster_whisper", faster_whisper.__version__)
PY
