"""benchmarks/paper_runs.py: the summary figures, from synthetic rows (no torchvision, no GPU)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.paper_runs import Result, compare, repeats, table  # noqa: E402

MiB = 1 << 20


def row(opt, bs, gpu, ground_mib, oom="False", zg=""):
    return {"model": "m", "optimiser": opt, "batch_size": str(bs), "gpu_name": gpu, "real_oom": oom,
            "zero_grad_mode": zg, "ground_bytes": str(ground_mib * MiB)}


def test_repeats_counts_adam_and_adamw_as_one_workload_and_skips_oom_runs():
    rows = [row("Adam", 5, "3060", 1000), row("AdamW", 5, "4060", 1100),  # 100 MiB, 10%
            row("SGD", 5, "3060", 500), row("SGD", 5, "3060", 500),  # identical
            row("SGD", 6, "3060", 600), row("SGD", 6, "3060", 9000, oom="True"),  # OOM run: ignored
            row("SGD", 7, "3060", 700, zg="0"), row("SGD", 7, "3060", 800, zg="2")]  # other loops
    assert repeats(rows) == "workloads measured more than once: 2; 1 identical, the widest 100 MiB apart (10.0%)"
    assert repeats(rows[4:]) == "no workload was measured twice"


def result(xmem_mib, ground_mib, oom=False, fits=True):
    return Result(experiment="e", model="m", optimiser="SGD", batch_size=1, gpu="g", ground_bytes=ground_mib * MiB,
                  real_oom=oom, xmem_bytes=xmem_mib * MiB, xmem_fits=fits, seconds=1.0, mode="fake",
                  paper_bytes=None, paper_oom=None, paper_cap_failed=None, dnnmem_bytes=None,
                  schedtune_bytes=None)


def test_table_reports_median_under_share_and_oom_answers():
    out = table([result(102, 100), result(95, 100), result(110, 100), result(50, 200, oom=True, fits=False)])
    assert "| xmem (this) | 3 | 5.00% |" in out  # errors 2%, 5%, 10%
    assert "| 33.3% |" in out.splitlines()[2]  # one of three under
    assert "OOM runs predicted as not fitting: xmem 1/1" in out
    assert "runs that fit predicted as not fitting: xmem 0/3" in out


def test_compare_lists_the_runs_that_moved_closer_or_further():
    now = [result(102, 100), result(110, 100), result(100, 100)]
    for i, r in enumerate(now):
        r.experiment = f"e{i}"
    before = [{"experiment": "e0", "xmem_bytes": 105 * MiB, "error": ""},   # +5% -> +2%: closer
              {"experiment": "e1", "xmem_bytes": 104 * MiB, "error": ""},   # +4% -> +10%: further
              {"experiment": "e2", "xmem_bytes": 100 * MiB, "error": ""}]   # unchanged
    out = compare(now, before).splitlines()
    assert out[0] == "against the earlier file: 2 runs moved, 1 closer, 1 further"
    assert out[1].endswith("+5.0% -> +2.0%") and out[2].endswith("+4.0% -> +10.0%")
