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
