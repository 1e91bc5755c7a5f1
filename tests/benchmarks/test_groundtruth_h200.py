"""The estimate against the committed H200 recordings (benchmarks/data/gpu_groundtruth-nvidia-h200-*.jsonl).

Measured on a real NVIDIA H200 (torch 2.11.0+cu130, cuDNN 9.19) by benchmarks/gpu_groundtruth.py; the
targets are those of the ground-truth issue: peak allocated within 1%, peak reserved within 3%.
A few quick runs only (a second or two each); `benchmarks/compare_groundtruth.py` checks them all.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.compare_groundtruth import DATA_DIR, compare_record, load_records

RECORDINGS = sorted(DATA_DIR.glob("gpu_groundtruth-nvidia-h200-*.jsonl"))
pytestmark = pytest.mark.skipif(not RECORDINGS, reason="no H200 recordings committed")


def _recorded(run: str) -> tuple[dict, Path]:
    ok = [(r, b) for r, b in load_records([str(p) for p in RECORDINGS]) if r["run"] == run and not r.get("error")]
    assert ok, f"no successful recording of {run}"
    return ok[-1]


# ResNet-50 and MobileNetV2 run cuDNN convolutions whose workspaces come from the sm_90 table;
# ResNet-50 with AdamW is not among the runs the table was read from.
@pytest.mark.parametrize("run", ["resnet50-bs64-adamw", "mobilenetv2-86px-bs251-adamw", "gpt2-small-bs8x1024-fp32",
                                 "bert-base-bs16x512-adamw", "gpt2-small-bs8x1024-bf16-ckpt"])
def test_peaks_match_the_h200(run: str) -> None:
    rec, base = _recorded(run)
    row = compare_record(rec, base)
    assert not row.error, row.error
    assert abs(row.pred_allocated - row.meas_allocated) <= 0.01 * row.meas_allocated, row
    assert abs(row.pred_reserved - row.meas_reserved) <= 0.03 * row.meas_reserved, row
    # The device as nvidia-smi sees it: reserved plus the H200's measured context and kernels.
    assert abs(row.pred_device - row.meas_device) <= 0.03 * row.meas_device, row


def test_the_catalogued_h200_is_the_measured_one() -> None:
    """The catalog's fixed memory is what --fixed-memory measured (same file, no copy by hand)."""
    from xmem_engine.estimate import resolve_gpu

    fixed = sorted(DATA_DIR.glob("fixed_memory-nvidia-h200-*.jsonl"))
    assert fixed
    measured = json.loads(fixed[-1].read_text().splitlines()[-1])["fixed_memory"]
    gpu = resolve_gpu("H200")
    assert gpu.context_bytes == measured["context_bytes"]
    assert gpu.kernel_bytes == measured["kernel_bytes"]
    assert gpu.cudnn_bytes == measured["cudnn_bytes"]
    assert gpu.total_memory_bytes == _recorded("gpt2-small-bs8x1024-fp32")[0]["env"]["gpu_total_memory"]


def test_workspaces_read_off_a_recording_are_the_gpus_own_requests() -> None:
    """from-recordings takes, inside each convolution call, the requests the GPU made and xmem did not."""
    from benchmarks.compare_groundtruth import recorded_allocs
    from benchmarks.cudnn_workspaces import workspaces_in_recording

    rec, base = _recorded("resnet50-bs64-sgd")
    found, read, skipped = workspaces_in_recording(rec, base)
    assert read >= 300 and skipped <= 2  # 53 convolutions, forward and backward, 3 steps
    assert all(len(set(v)) == 1 for v in found.values())  # cuDNN's heuristics choose the same each step
    stem = "forward|float32|64x3x224x224|64x3x7x7|2x2|3x3|1x1|N|0x0|1|c|any|tf32"
    assert found[stem][0] in [e["size"] for e in recorded_allocs(rec, base)]  # conv1's workspace: a GPU request
    assert found[stem][0] > 0


@pytest.mark.parametrize("run,q_shape,kv_heads", [("zoo-user-triton-kernel", (8, 16, 1024, 64), 16),
                                                   ("zoo-hf-llama-bf16", (2, 32, 1024, 64), 4)])
def test_cudnn_attention_backward_workspace_is_a_request_the_h200_made(run: str, q_shape: tuple, kv_heads: int) -> None:
    """The workspace cuDNN's SDPA backward asks for (sdpa.cudnn_backward_workspace), as the recordings show it."""
    import torch

    from benchmarks.compare_groundtruth import recorded_allocs
    from xmem_engine.tracing.kernels.sdpa import cudnn_backward_workspace

    b, h, s, d = q_shape
    q = torch.empty(q_shape, dtype=torch.bfloat16, device="meta")
    kv = torch.empty((b, kv_heads, s, d), dtype=torch.bfloat16, device="meta")
    size = cudnn_backward_workspace(q, kv, kv)
    rec, base = _recorded(run)
    recorded = [e["size"] for e in recorded_allocs(rec, base)]
    assert recorded.count(size) >= 2 * 12  # each layer's backward, in both steps (zoo scripts: 12+ layers)
