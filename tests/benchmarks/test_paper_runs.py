"""benchmarks/paper_runs.py: the summary figures, from synthetic rows (no torchvision, no GPU)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from benchmarks.paper_runs import Result, compare, repeats, table

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


def capped(xmem_mib, ground_mib, paper_mib, failed, least_mib=None):
    r = result(xmem_mib, ground_mib)
    r.paper_bytes, r.paper_cap_failed = paper_mib * MiB, failed
    r.total_bytes, r.context_bytes, r.allocator_limit_bytes = 10_000 * MiB, 300 * MiB, 9_600 * MiB
    r.xmem_min_alloc_bytes = None if least_mib is None else least_mib * MiB
    return r


def test_paper_cap_is_the_rounded_memory_fraction():
    from benchmarks.paper_runs import paper_cap

    assert paper_cap(4_049 * MiB, 10_000 * MiB) == 0.40 * 10_000 * MiB
    assert paper_cap(4_051 * MiB, 10_000 * MiB) == 0.41 * 10_000 * MiB


def test_cap_checks_decide_xmems_caps_from_the_papers_capped_runs():
    from benchmarks.paper_runs import cap_checks

    runs = [capped(4_000, 4_100, 4_200, False, least_mib=3_900),  # ours 43% >= theirs 42%, which ran: fine
            capped(3_000, 3_500, 3_600, True, least_mib=3_700),   # ours 33% <= theirs 36%, which failed: fails
            capped(3_000, 3_500, 4_000, False, least_mib=4_100),  # ours 33% below a 40% that ran: undecided
            capped(6_000, 5_000, 5_000, True, least_mib=5_200)]   # ours 63% above a 50% that failed: undecided
    first, second = cap_checks(runs)
    assert "paper tool failed 2 (50.0%)" in first
    assert "xmem fails 1 for certain, is fine on 1 for certain, 2 undecided" in first
    assert "(1 of them capped above the run's measured peak)" in first
    # least memory within the paper's cap <=> predicted to run: 3900<=4200 ran, 3700>3600 failed,
    # 4100>4000 but ran, 5200>5000 failed
    assert "agrees on 3/4" in second and "predicted to fail but ran 1" in second
    assert cap_checks([result(1, 1)]) == ["no runs with the paper's capped re-run to check caps against"]
