#!/usr/bin/env bash
# The same engine from a terminal: the bundled CUDA training script on three GPUs, then the
# largest batch that fits a 4060.
set -euo pipefail
cd "$(dirname "$0")/.."
for gpu in RTX-4060-8GB T4 A100-SXM4-40GB; do
    .venv/bin/xmem estimate examples/train_cnn.py --gpu "$gpu" --iterations 2 || true
    echo
done
.venv/bin/xmem estimate examples/train_cnn.py --gpu RTX-4060-8GB --iterations 1 --max-batch batch_size || true
