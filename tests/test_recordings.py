"""End to end against a real GPU recording (benchmarks/recordings.py): the smallest rebuilt
workload, traced on the CPU, requests what the GPU requested, in the same order, and peaks
where it peaked. Skips without ../shared/allocator-traces."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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
