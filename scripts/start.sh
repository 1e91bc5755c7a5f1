#!/usr/bin/env bash
# The main job: JupyterLab on the quickstart notebook (the %%xmem magic and its widget).
# Extra arguments go to `jupyter lab` (e.g. --no-browser --ip=0.0.0.0 --port 8888).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/jupyter lab demo_notebooks/01_quickstart.ipynb "$@"
