#!/usr/bin/env bash
# The engine's tests on one PyTorch release, in .venv-torch-VERSION: CI runs them on both ends
# of the supported range (README, "Install"). The torch is PyPI's default Linux wheel, a
# CUDA build, which also checks xmem on the torch most Linux users have, with no GPU driver.
# The notebook front's tests need the full environment: `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${1:?usage: scripts/test_torch.sh TORCH_VERSION}
VENV=.venv-torch-$VERSION
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$VERSION" "numpy>=1.24" \
    "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" "jsonschema>=4.0" 2>&1 | grep -v "^WARNING: Location" || true
echo "engine tests on torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
# The package from this checkout (no install: that would build the JupyterLab extension).
PYTHONPATH="$PWD" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile \
    --ignore=tests/browser/test_browser_lab.py --ignore=tests/browser/test_browser_labext.py \
    --ignore=tests/jupyter
