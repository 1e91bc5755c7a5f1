"""End to end against a real GPU recording (benchmarks/recordings.py): the smallest rebuilt
workload, traced on the CPU, requests what the GPU requested, in the same order, and peaks
where it peaked. Skips without ../shared/allocator-traces."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO.parent / "shared" / "allocator-traces" / "wed_medium_128_inference.pickle"


def _recordings_module():
    spec = importlib.util.spec_from_file_location("recordings", REPO / "benchmarks" / "recordings.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("recordings", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not RECORDING.exists(), reason="../shared/allocator-traces not present")
def test_the_smallest_rebuilt_workload_matches_its_recording():
    pytest.importorskip("einx")
    rec = _recordings_module()
    (rb,) = [r for r in rec.REBUILT if r.recording == RECORDING.name]
    c = rec.compare(rb)
    assert c.real_allocs == 1256 and c.matched == c.real_allocs == c.traced_allocs, c.first_divergence
    assert c.traced_peak_allocated == c.real_peak_allocated


def test_matches_are_counted_as_the_longest_common_subsequence():
    """Not difflib's matching blocks, which are greedy: a block matched early can cost more
    later (on the compiled kk recording it paired traced layer 0 with recorded layer 1)."""
    import difflib
    import random

    rec = _recordings_module()

    def dp(a, b):
        prev = [0] * (len(b) + 1)
        for x in a:
            cur = [0]
            for j, y in enumerate(b):
                cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
            prev = cur
        return prev[-1]

    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randint(0, 5) for _ in range(rng.randint(0, 30))]
        b = [rng.randint(0, 5) for _ in range(rng.randint(0, 30))]
        assert rec.lcs_length(a, b) == dp(a, b), (a, b)
    a, b = [1, 2, 3, 4, 5, 9, 9, 9, 9, 1, 2, 3, 4, 5], [9, 9, 9, 9, 1, 2, 3, 4, 5]
    greedy = sum(m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    assert rec.lcs_length(a, b) == 9 >= greedy


def test_triton_autotuning_allocations_are_told_apart():
    rec = _recordings_module()
    tuned = {"frames": [{"name": "clone_preserve_strides"}, {"name": "benchmark_all_configs"}]}
    assert rec.autotuning(tuned) and not rec.autotuning({"frames": [{"name": "forward"}]}) and not rec.autotuning({})
