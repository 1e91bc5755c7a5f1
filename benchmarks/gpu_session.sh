#!/usr/bin/env bash
# One device lease's measurements as one command (the workplace's `device run`, which sets $OUT):
#     bash benchmarks/gpu_session.sh
# Wheels placed in .whl/ (transformers 5.x, peft, trl, liger-kernel and what they need beyond the
# machine's image) are installed into /tmp/site first, for the zoo's fine-tuning scripts.  Then the
# fixed-memory stages, then every ground-truth run within BUDGET seconds; the data comes back as
# one tarball, split in 15 MiB parts (the tool returns at most 8 files of 16 MiB).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
OUT=${OUT:-/tmp/xmem-gpu-session}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
python3 -c "import transformers, peft, trl, liger_kernel; print('transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__)"
timeout 90 python3 benchmarks/gpu_groundtruth.py --fixed-memory
python3 benchmarks/gpu_groundtruth.py --budget "${BUDGET:-400}" --timeout "${RUN_TIMEOUT:-150}" ${ONLY:+--only "$ONLY"}
tar czf /tmp/groundtruth.tgz benchmarks/data/gpu_groundtruth-*.jsonl benchmarks/data/fixed_memory-*.jsonl benchmarks/data/snapshots
split -b 15M -d /tmp/groundtruth.tgz "$OUT/groundtruth.tgz.part"
ls -la "$OUT"
