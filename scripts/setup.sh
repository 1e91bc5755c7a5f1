#!/usr/bin/env bash
# Create .venv in the repository and install xmem with what its tests need.
# Idempotent: a second run installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PY=.venv/bin/python
"$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true

# torch first, from the machine's local CPU build when there is no torch yet: a plain
# "torch" requirement would pull a multi-GB CUDA build from PyPI.
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
fi

# Installing the project also builds the JupyterLab extension (labextension/) with npm.
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true

# The browser the real-browser tests drive (Debian chromium; Playwright uses it directly).
bash scripts/setup_browser.sh
"$PY" -c "import torch, xmem_engine; print(f'xmem {xmem_engine.__version__} ready (torch {torch.__version__})')"
