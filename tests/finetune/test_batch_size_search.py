"""accelerate's ``find_executable_batch_size`` (``Trainer(auto_find_batch_size=True)``) on the
virtual GPU (``shims/batch_size_search.py``): it runs out of memory where the target GPU would
and settles on the size the GPU would, where before the first size always "fitted" and the
estimate was of it (85 GiB on a 15 GiB T4 for a Trainer asked to find its batch size)."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")

import torch  # noqa: E402

from xmem_engine.simulation import simulate  # noqa: E402
from xmem_engine.simulation.allocator import CachingAllocator  # noqa: E402
from xmem_engine.tracing import trace  # noqa: E402
from xmem_engine.tracing.shims.batch_size_search import search_limit  # noqa: E402

from tests.tracing.test_oom_tries import SETUP, SMALL  # noqa: E402 (a 3 GiB GPU, a 4-layer MLP step)

SEARCH = SETUP + """
from accelerate.utils import find_executable_batch_size
sizes = []

@find_executable_batch_size(starting_batch_size=1024)
def train(batch_size):
    sizes.append(batch_size)
    step(batch_size)
    return batch_size

found = train()
"""


def test_the_search_runs_out_of_memory_where_the_gpu_would_and_settles_below():
    ns: dict = {}
    tr = trace(SEARCH, ns, mode="fake", device=SMALL)
    sizes, found = ns["sizes"], ns["found"]
    assert found == sizes[-1] < 1024 and len(sizes) >= 3
    assert all(b == int(a * 0.9) for a, b in zip(sizes, sizes[1:]))  # accelerate's own steps
    limit = search_limit(SMALL)
    # the size found fits the GPU's share, the size tried before it does not, each traced alone
    for size, fits in ((found, True), (sizes[-2], False)):
        alone = SETUP + f"step({size})"
        if fits:
            trace(alone, {}, mode="fake", device=SMALL, allocator=CachingAllocator(capacity=limit))
        else:
            with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory."):
                trace(alone, {}, mode="fake", device=SMALL, allocator=CachingAllocator(capacity=limit))
    # the estimate is of the run at the size found: the failed tries' transients are left out
    sim = simulate(tr.events, allocator=CachingAllocator(capacity=limit))
    assert not sim.oom
    note = next(n for n in tr.meta["notes"] if n.startswith("find_executable_batch_size at <cell>:"))
    assert f"{sizes[0]} (out of memory)" in note and f"{found} (ran)" in note


def test_the_estimate_is_of_the_size_found_here_and_on_another_gpu():
    """The failed tries' transients are left out as phase markers: what points at events by
    index (the reductions' buffers re-sized per GPU, cuBLAS's workspaces) still points right, and
    the estimate for the GPU searched on fits; for another GPU it is re-simulated as any trace."""
    from xmem_engine.estimate import estimate_trace, resolve_gpu

    t4 = resolve_gpu("T4")
    ns: dict = {}
    tr = trace(SEARCH.replace("starting_batch_size=1024", "starting_batch_size=4096"), ns, mode="fake",
               device=t4.properties())
    assert ns["found"] < 4096 and tr.meta.get("by_sm", {}).get("groups")
    for group in tr.meta.get("by_sm", {}).get("groups", []):
        assert tr.events[group[0]].kind == "alloc"  # a reduction's buffers, still where they were
    here = estimate_trace(tr, t4)
    assert here.fits and not here.oom
    assert not estimate_trace(tr, "H100-SXM-80GB").oom
    # the search as data, for a scheduler to launch the run at the size found
    search, = here.to_json()["batch_size_search"]
    assert search["found"] == ns["found"] and search["where"] == f"<cell>:{SEARCH.splitlines().index('found = train()') + 1}"
    assert [t["batch_size"] for t in search["tries"]] == ns["sizes"]
    assert [t["outcome"] for t in search["tries"]] == ["out of memory"] * (len(ns["sizes"]) - 1) + ["ran"]
    assert search["limit_bytes"] == search_limit(t4.properties())
    jsonschema = pytest.importorskip("jsonschema")
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "xmem_engine/data/report.schema.json").read_text())
    jsonschema.validate(here.to_report(), schema)


LIGHTNING = """
import torch
import torch.nn as nn
import lightning as L
from lightning.pytorch.tuner import Tuner
from torch.utils.data import DataLoader, TensorDataset

class Net(L.LightningModule):
    def __init__(self, batch_size=2):
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        n = 4096
        return DataLoader(TensorDataset(torch.zeros(n, 3, 64, 64), torch.zeros(n, dtype=torch.long)),
                          batch_size=self.batch_size)

model = Net(BATCH)
trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
SEARCH_LINE
trainer.fit(model)
"""
TUNE = "found = Tuner(trainer).scale_batch_size(model, mode='MODE', steps_per_trial=1); after = model.batch_size"


@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_lightnings_batch_size_finder_searches_on_the_gpu_and_the_estimate_is_of_the_size_it_found(mode):
    """Lightning's finder doubles the size until a trial runs out of memory (to 8,192 by
    default): it had doubled to 8,192 and the estimate was of that. Binary search then narrows
    down, and takes a margin of 5 % off the largest size that ran."""
    pytest.importorskip("lightning")
    ns: dict = {}
    tr = trace(LIGHTNING.replace("BATCH", "2").replace("SEARCH_LINE", TUNE.replace("MODE", mode)), ns, mode="fake",
               device=SMALL)
    found = ns["found"]
    search, = tr.meta["batch_size_search"]
    assert search["by"] == "scale_batch_size" and search["found"] == found == ns["after"]
    sizes = [t["batch_size"] for t in search["tries"]]
    doubled = sizes[:next(i for i, t in enumerate(search["tries"]) if t["outcome"] == "out of memory") + 1]
    assert doubled == [2 << i for i in range(len(doubled))] and doubled[-1] < 8192
    largest = max(t["batch_size"] for t in search["tries"] if t["outcome"] == "ran")
    if mode == "power":
        assert sizes == doubled and found == largest == doubled[-2]
        assert [t["outcome"] for t in search["tries"]] == ["ran"] * (len(sizes) - 1) + ["out of memory"]
    else:
        assert len(sizes) > len(doubled) and found == int(largest * 0.95) < largest
    # the estimate is that of the run at the size found, traced alone (allocated bytes: the
    # finder's trials leave the allocator's cache as a first step does not); after a binary
    # search, the trials at the largest size that ran held more than the run at the size found
    def alone(size: int) -> int:
        tr = trace(LIGHTNING.replace("BATCH", str(size)).replace("SEARCH_LINE", ""), {}, mode="fake", device=SMALL)
        return simulate(tr.events).peak_allocated_bytes

    peak = simulate(tr.events).peak_allocated_bytes
    assert peak == alone(found) if mode == "power" else alone(found) < peak <= alone(largest)
    assert any(n.startswith("Lightning's batch size finder at <cell>:") for n in tr.meta["notes"])


def test_a_search_bound_while_a_trace_ran_searches_in_the_next_trace_and_not_outside_one():
    """``accelerate.utils`` binds the decorator as it loads, inside the trace that imports it: a
    second trace in the same process (a notebook's next cell) searches with its own GPU, and
    the decorator outside a trace is accelerate's own."""
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
from xmem_engine.tracing import trace
from tests.tracing.test_oom_tries import SETUP, SMALL
SEARCH = {SEARCH!r}
for gpu in (SMALL, dict(SMALL, total_memory=2 * SMALL["total_memory"])):
    ns = {{}}
    tr = trace(SEARCH, ns, mode="fake", device=gpu)
    print(ns["found"], tr.meta["batch_size_search"][0]["limit_bytes"])
import accelerate.utils
calls = []
@accelerate.utils.find_executable_batch_size(starting_batch_size=64)
def f(batch_size):
    calls.append(batch_size)
f()
print(calls)
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    (small, small_limit), (big, big_limit), calls = [line.split() for line in out.stdout.splitlines()[-3:]]
    assert int(big) > int(small) and int(big_limit) > int(small_limit) == search_limit(SMALL)
    assert calls == ["[64]"]
