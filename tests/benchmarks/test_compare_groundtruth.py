"""benchmarks/compare_groundtruth.py: predicted vs recorded, from committed data, no GPU."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from benchmarks.compare_groundtruth import compare_record, first_divergence, table


def test_first_divergence_names_the_request():
    pred = [(100, "aten.mm.default", "fc"), (200, "aten.relu.default", "act")]
    assert first_divergence(pred, [(100, "a.py:1:f"), (200, "a.py:2:f")]) == "none: identical request sequence"
    msg = first_divergence(pred, [(100, "a.py:1:f"), (300, "a.py:2:f")])
    assert msg.startswith("request 1:") and "aten.relu.default" in msg and "a.py:2:f" in msg
    assert "xmem made 2, the GPU 1" in first_divergence(pred, [(100, "a.py:1:f")])


def test_compare_a_record_without_a_gpu(tmp_path):
    small = {"batch_size": 2, "seq_len": 16, "max_positions": 16, "vocab_size": 1000, "dim": 64,
             "n_layers": 1, "n_heads": 4, "iterations": 1}
    record = {
        "run": "gpt2-tiny", "script": "benchmarks/workloads/gpt2.py", "overrides": small,
        "env": {"gpu_name": "NVIDIA H200", "torch_version": "2.11.0+cu130"},
        "allocator": {"max_memory_allocated": 10_000_000, "max_memory_reserved": 20_971_520},
        "device_memory": {"used_before_init": 1_000, "peak_used": 600_000_000},
        "snapshot": {"device_traces": [[{"action": "alloc", "size": 4096000, "where": "models.py:1:f"}]],
                     "segments": []},
    }
    row = compare_record(record, tmp_path)
    assert not row.error, row.error
    assert row.gpu == "H200" and row.pred_allocated > 0 and row.meas_reserved == 20_971_520
    assert row.meas_device == 600_000_000 - 1_000
    assert "request 0" in row.first_divergence or "same first" in row.first_divergence
    text = table([row])
    assert "gpt2-tiny" in text and "%" in text
