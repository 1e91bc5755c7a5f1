"""The calibrated range: conformal quantiles, workload kinds, the range on an estimate, --safe,
and the leave-one-model-out check (benchmarks/paper_runs.py), on synthetic runs."""

from __future__ import annotations

import json

import pytest

from xmem_engine.calibration import (MIN_RUNS, Calibration, calibrate, conformal_bounds, load_calibration,
                                     peak_range, scale_bytes, workload_kind)
from xmem_engine.tracing import trace

GiB = 1 << 30

CNN = """
import torch, torch.nn as nn
m = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10)).cuda()
m(torch.randn(8, 3, 32, 32, device="cuda")).sum().backward()
"""
LSTM = """
import torch, torch.nn as nn
m = nn.LSTM(32, 64).cuda()
m(torch.randn(5, 4, 32, device="cuda"))[0].sum().backward()
"""
ATTENTION = """
import torch
q = torch.randn(2, 4, 16, 8, device="cuda", requires_grad=True)
torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
"""
MLP = """
import torch
m = torch.nn.Linear(64, 64).cuda()
m(torch.randn(8, 64, device="cuda")).sum().backward()
"""


def test_conformal_ranks():
    scores = list(range(1, 20))  # n = 19: ranks floor(20 * .05) = 1 and ceil(20 * .95) = 19
    assert conformal_bounds(scores, 0.05) == (1, 19)
    assert conformal_bounds(list(range(1, 100)), 0.05) == (5, 95)  # n = 99: ranks 5 and 95
    assert conformal_bounds([3.0], 0.05) == (3.0, 3.0)  # too few runs: the extremes
    with pytest.raises(ValueError):
        conformal_bounds([], 0.05)


def test_kinds_with_few_runs_borrow_the_pooled_quantiles():
    samples = [("convolution", i / 100) for i in range(MIN_RUNS)] + [("recurrent", 0.5)] * (MIN_RUNS - 1)
    cal = calibrate(samples, "synthetic")
    assert "convolution" in cal.bounds and "recurrent" not in cal.bounds
    assert cal.for_kind("recurrent") == (cal.bounds["pooled"], "pooled")
    # the pool holds the kinds scored relative to the estimate only: convolutions have their own unit
    assert cal.runs == {"pooled": MIN_RUNS - 1, "convolution": MIN_RUNS}
    assert calibrate([("convolution", 1.0)] * 3, "few").for_kind("convolution") is None
    again = Calibration(**{**cal.__dict__})
    assert json.loads(json.dumps(cal.to_json()))["bounds"]["convolution"] == list(again.bounds["convolution"])


@pytest.mark.parametrize("src, kind", [(CNN, "convolution"), (LSTM, "recurrent"), (ATTENTION, "attention"),
                                       (MLP, "other")])
def test_workload_kind(src, kind):
    assert workload_kind(trace(src, {}, mode="fake")) == kind


def test_the_range_scales_with_the_largest_convolution_tensor():
    tr = trace(CNN, {}, mode="fake")
    conv = max(e.bytes for e in tr.events if e.kind == "alloc" and e.op.startswith("aten.convolution"))
    assert scale_bytes(tr, "convolution", 10 * GiB) == conv
    assert scale_bytes(trace(MLP, {}, mode="fake"), "other", 123) == 123
    cal = Calibration({"pooled": (-0.1, 0.2), "convolution": (-1.0, 2.0)}, {"pooled": 50, "convolution": 30},
                      0.05, "synthetic")
    r = peak_range(tr, point_bytes=GiB + 100 * conv, context_bytes=GiB, calibration=cal)
    assert (r.low_bytes, r.high_bytes) == (GiB + 99 * conv, GiB + 102 * conv) and r.kind == "convolution"
    mlp = peak_range(trace(MLP, {}, mode="fake"), point_bytes=GiB + 1000, context_bytes=GiB, calibration=cal)
    assert (mlp.low_bytes, mlp.high_bytes, mlp.group) == (GiB + 900, GiB + 1200, "pooled")
    assert "calibrated on 50 GPU runs of other kinds: none of other steps" in mlp.describe()


needs_calibration = pytest.mark.skipif(load_calibration() is None, reason="no xmem_engine/data/calibration.json")


@needs_calibration
def test_estimates_carry_the_range_and_safe_judges_by_its_high_end(capsys, tmp_path):
    from xmem_engine.cli import main
    from xmem_engine.estimate import estimate
    from xmem_engine.gpus import load_catalog

    est = estimate(MLP, "T4")
    assert est.peak_range.low_bytes <= est.peak_device_bytes <= est.peak_range.high_bytes == est.safe_bytes
    j = est.to_json()
    assert j["peak_device_bytes_high"] == est.safe_bytes and j["range"].startswith("range ")
    assert est.range_text in est.summary()

    # a step whose point estimate fits a T4 and whose range's high end does not
    t4 = load_catalog()["T4"]
    (_, hi), _ = load_calibration().for_kind("other")
    body = int((t4.total_memory_bytes - t4.context_bytes) / (1 + hi / 2))
    script = tmp_path / "near.py"
    script.write_text(f"import torch\nx = torch.empty({body - (64 << 20)}, dtype=torch.uint8, device='cuda')\n")
    assert main(["estimate", str(script), "--gpu", "T4"]) == 0
    capsys.readouterr()
    assert main(["estimate", str(script), "--gpu", "T4", "--safe"]) == 3
    assert "--safe: the range's high end" in capsys.readouterr().out


@needs_calibration
def test_max_batch_with_safe_is_no_larger():
    from xmem_engine.estimate import estimate, max_batch

    src = "import torch\nx = torch.empty(n, 1 << 20, device='cuda')\n"
    plain = max_batch(lambda n: estimate(src, "T4", namespace={"n": n}), start=64)
    safe = max_batch(lambda n: estimate(src, "T4", namespace={"n": n}), start=64, safe=True)
    assert 0 < safe.value < plain.value
    assert safe.estimate.fits_safely


def test_leave_one_model_out_and_near_capacity_tables():
    from benchmarks.paper_runs import leave_one_model_out, near_capacity

    rows = []
    for m, k in [("a", "convolution"), ("b", "convolution"), ("c", "attention")]:
        for i in range(30):
            x = 1000 + i
            rows.append({"model": m, "kind": k, "optimiser": "SGD", "batch_size": i, "gpu": "RTX 3060",
                         "xmem_bytes": x << 20, "ground_bytes": (x + (i % 7) - 3 + (50 if m == "b" and i < 6 else 0)) << 20,
                         "scale_bytes": 10 << 20, "real_oom": False, "error": "", "natural_bytes": x << 20})
    rows[0]["natural_bytes"] = rows[0]["xmem_bytes"] + (100 << 20)
    loo = leave_one_model_out(rows)
    line_b = next(x for x in loo.splitlines() if x.startswith("| b |"))
    assert line_b.split("|")[4].strip() == "6"  # b's six outliers lie above a range made from a alone
    assert "| **all** | | 90 |" in loo
    near = near_capacity(rows)
    assert near.count("\n") == 2 and "capacity-limited" in near.splitlines()[-1]


def test_the_frontier_trades_misses_for_width_by_kind():
    import random

    from benchmarks.paper_runs import frontier

    rnd = random.Random(0)
    rows = [{"model": m, "kind": k, "batch_size": 10 + i, "xmem_bytes": (1000 + i) << 20,
             "ground_bytes": int(((1000 + i) + rnd.gauss(0, 20)) * 2**20), "scale_bytes": 8 << 20,
             "real_oom": False, "error": ""}
            for m, k in [("a", "convolution"), ("b", "convolution"), ("c", "attention"), ("d", "attention")]
            for i in range(40)]

    def parse(table):
        out = {}
        for line in table.splitlines()[2:]:
            _, scale, alphas, above, width, _ = line.split("|")
            out[scale.strip(), alphas.strip()] = (int(above.split()[0]), float(width.strip().rstrip("%")))
        return out

    t = parse(frontier(rows, conv_alphas=(0.02, 0.3), attention_alphas=(0.02, 0.3)))
    for scale in ("largest conv tensor (committed)", "input batch", "estimate"):
        strict, loose = t[scale, "0.02 / 0.02"], t[scale, "0.3 / 0.3"]
        assert strict[0] < loose[0] and strict[1] > loose[1]  # fewer above, at a wider range
        # each kind's alpha moves only its own runs: half-way on both counts
        conv_only = t[scale, "0.02 / 0.3"]
        assert strict[0] < conv_only[0] < loose[0] and loose[1] < conv_only[1] < strict[1]
