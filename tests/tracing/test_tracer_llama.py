"""A Llama-2-7B-sized training step traces in fake mode within a small CPU footprint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_llama_7b_sized_step_traces_under_3_gb_rss():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llama_rss.py")], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["mode"] == "fake"
    # 6.74e9 fp32 parameters: ~27 GB on the (virtual) GPU
    assert 6.6e9 * 4 < res["parameter_bytes"] < 6.9e9 * 4
    assert res["peak_live_bytes"] > 4 * res["parameter_bytes"]   # + grads + 2 AdamW states
    assert res["peak_rss_bytes"] < 3 * 1024**3, res
