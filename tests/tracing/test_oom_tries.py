"""A batch-size search the code writes itself (``try: ... except torch.cuda.OutOfMemoryError``)
on the virtual GPU (``tracing/oom_tries.py``): its tries run out of memory where the target GPU's
would, and the estimate is of the size the loop settles on. Before, the virtual GPU never ran
out of memory, so the loop's first size "fitted" and the estimate was of it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from xmem_engine.simulation import simulate
from xmem_engine.simulation.allocator import CachingAllocator
from xmem_engine.tracing import trace
from xmem_engine.tracing.oom_tries import catches_oom, mark
from xmem_engine.tracing.shims.batch_size_search import search_limit

GIB = 1 << 30
SMALL = {"name": "Small GPU", "total_memory": 3 * GIB, "major": 8, "minor": 0, "multi_processor_count": 40,
         "context_bytes": 300 << 20, "kernel_bytes": 50 << 20, "cudnn_bytes": 0}

SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters())

def step(batch_size):
    for _ in range(2):
        x = torch.randn(batch_size, 64, 2048, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""

HALVING = SETUP + """
sizes = []
batch_size = 4096
while batch_size >= 1:
    try:
        sizes.append(batch_size)
        step(batch_size)
        break
    except torch.cuda.OutOfMemoryError:
        batch_size //= 2
        torch.cuda.empty_cache()
"""


def _peak(tr) -> int:
    return simulate(tr.events).peak_reserved_bytes


def test_a_halving_loop_runs_out_of_memory_where_the_gpu_would_and_the_estimate_is_of_the_size_it_settles_on():
    ns: dict = {}
    tr = trace(HALVING, ns, mode="fake", device=SMALL)
    sizes, found = ns["sizes"], ns["batch_size"]
    assert sizes == [4096 >> i for i in range(len(sizes))] and found == sizes[-1] < 4096 and len(sizes) >= 3
    limit = search_limit(SMALL)
    # the size found fits the GPU's share and the size before it does not, each traced alone
    tr_found = trace(SETUP + f"step({found})", {}, mode="fake", device=SMALL,
                     allocator=CachingAllocator(capacity=limit))
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory."):
        trace(SETUP + f"step({sizes[-2]})", {}, mode="fake", device=SMALL, allocator=CachingAllocator(capacity=limit))
    # the estimate is that of the size found run alone: the failed tries' transients are left out
    assert _peak(tr) == _peak(tr_found)
    search, = tr.meta["batch_size_search"]
    assert search["by"] == "try/except" and search["where"] == f"<cell>:{HALVING.splitlines().index('    try:') + 1}"
    assert [t["outcome"] for t in search["tries"]] == ["out of memory"] * (len(sizes) - 1) + ["ran"]
    assert search["limit_bytes"] == limit and search["found"] is None
    assert any(n.startswith(f"The try at {search['where']}") and f"ran out of memory {len(sizes) - 1} times" in n
               for n in tr.meta["notes"])


def test_a_script_searches_as_a_cell_does(tmp_path: Path):
    """``xmem estimate SCRIPT`` (``trace_script``): the try named by the script's file and line."""
    from xmem_engine.tracing.script import trace_script

    script = tmp_path / "train.py"
    script.write_text(HALVING)
    tr = trace_script(script, mode="fake", device=SMALL)
    search, = tr.meta["batch_size_search"]
    assert search["where"] == f"{script}:{HALVING.splitlines().index('    try:') + 1}"
    assert search["tries"][-1]["outcome"] == "ran" and len(search["tries"]) >= 3


def test_a_search_in_a_module_of_the_users_searches_too(tmp_path: Path):
    """``from searchlib import find_batch_size``, a file beside the script: marked as it loads
    in the trace, and nothing written to its ``__pycache__``."""
    import sys

    from xmem_engine.tracing.oom_tries import UserModules
    from xmem_engine.tracing.script import trace_script

    (tmp_path / "searchlib_xmem_test.py").write_text(
        "import torch\n\ndef find(step, bs):\n    while bs:\n        try:\n            step(bs)\n            return bs\n"
        "        except torch.cuda.OutOfMemoryError:\n            bs //= 2\n")
    script = tmp_path / "train.py"
    script.write_text(SETUP + "from searchlib_xmem_test import find\nfound = find(step, 4096)\n")
    try:
        tr = trace_script(script, mode="fake", device=SMALL)
    finally:
        sys.modules.pop("searchlib_xmem_test", None)
    search, = tr.meta["batch_size_search"]
    assert search["where"] == f"{tmp_path / 'searchlib_xmem_test.py'}:5" and search["tries"][-1]["outcome"] == "ran"
    assert not (tmp_path / "__pycache__").exists()
    assert not [f for f in sys.meta_path if isinstance(f, UserModules)]


def test_a_search_an_earlier_cell_defined_searches_and_keeps_its_code():
    """A notebook: ``def find(...)`` with the try in one cell, the ``%%xmem`` cell calls it. The
    function runs marked code while the trace lasts and its own after."""
    import linecache

    source = ("import torch\n\ndef find(step, bs):\n    while bs:\n        try:\n            step(bs)\n"
              "            return bs\n        except torch.cuda.OutOfMemoryError:\n            bs //= 2\n")
    linecache.cache["<earlier cell>"] = (len(source), None, source.splitlines(True), "<earlier cell>")
    ns: dict = {}
    exec(compile(source, "<earlier cell>", "exec"), ns)
    own = ns["find"].__code__
    tr = trace(SETUP + "found = find(step, 4096)\n", ns, mode="fake", device=SMALL)
    search, = tr.meta["batch_size_search"]
    assert search["where"] == "<earlier cell>:5" and ns["found"] < 4096
    assert ns["find"].__code__ is own


def test_a_search_in_a_module_imported_before_the_trace(tmp_path: Path, monkeypatch):
    """A notebook's ``import train_utils`` in an earlier cell, then ``%%xmem`` calls
    ``train_utils.find(...)``: the module was loaded unmarked, before any trace; its functions
    and its classes' methods run marked code while the trace lasts, their own after. A method's
    broad handler is not a search (as in a class body of traced code)."""
    import importlib
    import sys

    (tmp_path / "train_utils_oom.py").write_text(
        "import torch\n\ndef find(step, bs):\n    while bs:\n        try:\n            step(bs)\n"
        "            return bs\n        except torch.cuda.OutOfMemoryError:\n            bs //= 2\n\n"
        "class Finder:\n    @staticmethod\n    def find(step, bs):\n        while bs:\n            try:\n"
        "                step(bs)\n                return bs\n            except torch.cuda.OutOfMemoryError:\n"
        "                bs //= 2\n\n    def logged(self, step, bs):\n        try:\n            step(bs)\n"
        "        except Exception:\n            pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("train_utils_oom")
    try:
        own = mod.find.__code__, mod.Finder.find.__code__, mod.Finder.logged.__code__
        ns: dict = {"train_utils_oom": mod}
        tr = trace(SETUP + "found = train_utils_oom.find(step, 4096)\n"
                   "again = train_utils_oom.Finder.find(step, 4096)\n", ns, mode="fake", device=SMALL)
        where = [s["where"] for s in tr.meta["batch_size_search"]]
        assert [w.rsplit("/", 1)[-1] for w in where] == ["train_utils_oom.py:5", "train_utils_oom.py:15"]
        assert ns["found"] == ns["again"] < 4096
        assert (mod.find.__code__, mod.Finder.find.__code__, mod.Finder.logged.__code__) == own
        logged = trace(SETUP + "train_utils_oom.Finder().logged(step, 4096)\n", ns, mode="fake", device=SMALL)
        assert "batch_size_search" not in logged.meta and _peak(logged) > 3 * GIB  # the step whole
    finally:
        sys.modules.pop("train_utils_oom", None)


def test_another_threads_try_holds_nothing_to_the_gpus_memory():
    """A thread's own ``try ... except Exception`` (a logger) while the code trains past the
    GPU's memory: the estimate stays that of the step run whole, and no search is said."""
    code = SETUP + """
import threading
go, done = threading.Event(), threading.Event()
def logger():
    try:
        go.set()
        done.wait(30)
    except Exception:
        pass
t = threading.Thread(target=logger)
t.start()
go.wait(30)
step(4096)
done.set()
t.join()
"""
    tr = trace(code, {}, mode="fake", device=SMALL)
    assert "batch_size_search" not in tr.meta
    assert _peak(tr) == _peak(trace(SETUP + "step(4096)", {}, mode="fake", device=SMALL)) > 3 * GIB


def test_without_a_search_the_step_is_traced_whole_as_before():
    """A step that fits never meets the limit, and a handler that re-raises is no search: the
    estimate is of the step run whole (128 GiB asked for, where a GPU run would stop)."""
    fits = SETUP + "try:\n    step(4)\nexcept torch.cuda.OutOfMemoryError:\n    pass\n"
    tr = trace(fits, {}, mode="fake", device=SMALL)
    assert "batch_size_search" not in tr.meta and _peak(tr) == _peak(trace(SETUP + "step(4)", {}, mode="fake", device=SMALL))
    reraise = SETUP + "try:\n    step(4096)\nexcept torch.cuda.OutOfMemoryError:\n    print('too big')\n    raise\n"
    tr = trace(reraise, {}, mode="fake", device=SMALL)
    assert "batch_size_search" not in tr.meta and _peak(tr) > 8 * GIB


def test_a_search_none_of_whose_tries_ran_is_traced_again_without_the_limit(capsys):
    """Every size runs out of memory: the estimate says what the first try needs (and does not
    fit), not what the GPU held when it gave up. The code's output is the GPU run's, once."""
    code = SETUP + """
batch_size = 4096
while batch_size >= 1024:
    try:
        step(batch_size)
        break
    except RuntimeError as e:  # the spelling of code older than torch.cuda.OutOfMemoryError
        if "out of memory" not in str(e):
            raise
        batch_size //= 2
print("settled on", batch_size)
"""
    ns: dict = {}
    tr = trace(code, ns, mode="fake", device=SMALL)
    # what the user sees is the GPU run's: its output and the values it left (the rerun ran the
    # first try whole, from the namespace the code started with)
    assert capsys.readouterr().out.splitlines() == ["settled on 512"] and ns["batch_size"] == 512
    assert _peak(tr) == _peak(trace(SETUP + "step(4096)", {}, mode="fake", device=SMALL)) > 3 * GIB
    search, = tr.meta["batch_size_search"]
    assert [t["outcome"] for t in search["tries"]] == ["out of memory"] * 3
    assert any("No pass ran to its end" in n for n in tr.meta["notes"])


def test_a_broad_handler_around_a_step_that_does_not_fit_is_estimated_whole():
    """``try: train() except Exception: traceback.print_exc()``: on the GPU the handler catches
    the out-of-memory error; the estimate is still of the step run whole, not of what was left."""
    code = SETUP + "try:\n    step(4096)\nexcept Exception:\n    import traceback\n    traceback.print_exc()\n"
    tr = trace(code, {}, mode="fake", device=SMALL)
    assert _peak(tr) == _peak(trace(SETUP + "step(4096)", {}, mode="fake", device=SMALL)) > 3 * GIB
    assert [t["outcome"] for t in tr.meta["batch_size_search"][0]["tries"]] == ["out of memory"]


def test_a_loop_that_skips_a_batch_too_large_keeps_the_batches_that_fit():
    code = SETUP + """
skipped = []
for size in (8, 4096, 16):
    try:
        step(size)
    except torch.OutOfMemoryError:
        skipped.append(size)
        opt.zero_grad(set_to_none=True)
"""
    ns: dict = {}
    tr = trace(code, ns, mode="fake", device=SMALL)
    assert ns["skipped"] == [4096]
    search, = tr.meta["batch_size_search"]
    assert [t["outcome"] for t in search["tries"]] == ["ran", "out of memory", "ran"]
    assert _peak(tr) < search_limit(SMALL)


@pytest.mark.parametrize("handler, searches", [
    ("except torch.cuda.OutOfMemoryError:\n    n //= 2", True),
    ("except torch.OutOfMemoryError as e:\n    n //= 2", True),
    ("except (ValueError, OutOfMemoryError):\n    n //= 2", True),
    ("except RuntimeError as e:\n    if 'CUDA out of memory' in str(e):\n        n //= 2\n    else:\n        raise", True),
    ("except Exception as e:\n    if isinstance(e, torch.cuda.OutOfMemoryError):\n        n //= 2", True),
    ("except:\n    print('Out of memory, halving')\n    n //= 2", True),
    ("except Exception:\n    traceback.print_exc()", True),  # it catches the error on the GPU too
    ("except RuntimeError:  # Out of memory\n    oom = True", True),  # PyTorch's FAQ
    ("except MemoryError:\n    pass", False),  # the host's
    ("except torch.cuda.OutOfMemoryError:\n    print('too big')\n    raise", False),  # stops, as on the GPU
    ("except torch.cuda.OutOfMemoryError:\n    sys.exit(1)", False),
    ("except ValueError:\n    pass", False),
])
def test_which_handlers_are_searches(handler, searches):
    tree = ast.parse(f"try:\n    step(n)\n{handler}\n")
    assert catches_oom(tree.body[0].handlers[0]) is searches
    marked = ast.unparse(mark(tree))
    assert ("oom_tries" in marked) is searches


def test_in_a_class_only_a_handler_that_names_the_error_is_marked():
    """A module's method may be compiled by Dynamo: a broad handler there is left as written."""
    source = ("class M(torch.nn.Module):\n    def forward(self, x):\n        try:\n            return self.a(x)\n"
              "        except Exception:\n            return self.b(x)\n")
    assert "oom_tries" not in ast.unparse(mark(ast.parse(source)))
    assert "oom_tries" in ast.unparse(mark(ast.parse(source.replace("Exception", "torch.OutOfMemoryError"))))


@pytest.mark.parametrize("source", [
    "@torch.compile\ndef step(x):\n    try:\n        return f(x)\n    except Exception:\n        return g(x)\n",
    "@torch.compile(mode='max-autotune')\ndef step(x):\n    try:\n        return f(x)\n    except torch.OutOfMemoryError:\n        return g(x)\n",
    "def step(x):\n    try:\n        return f(x)\n    except Exception:\n        return g(x)\nfast = torch.compile(step)\n",
])
def test_a_function_dynamo_compiles_is_left_as_written(source):
    """The marks' calls would break Dynamo's graph, and it ran the whole frame eagerly."""
    assert "oom_tries" not in ast.unparse(mark(ast.parse(source)))
    assert "oom_tries" in ast.unparse(mark(ast.parse(source.replace("step", "other", 1).replace("@torch.compile(mode='max-autotune')\n", "").replace("@torch.compile\n", ""))))


def test_marking_keeps_the_lines_and_the_namespace():
    """Tracebacks and notes show the user's lines; the calls name no variable in the user's
    namespace, and a marked function called after the trace runs as written."""
    source = "def f(n):\n    try:\n        return 1 // n\n    except torch.cuda.OutOfMemoryError:\n        return -1\n"
    def lines(tree: ast.AST) -> set[int]:
        return {n.lineno for n in ast.walk(tree) if hasattr(n, "lineno")}

    tree = mark(ast.parse(source))
    assert "enter(2)" in ast.unparse(tree) and lines(tree) == lines(ast.parse(source)) == {1, 2, 3, 4, 5}
    ns: dict = {}
    trace("import torch\n" + source + "f(1)\n", ns, mode="fake", device=SMALL)
    assert not [k for k in ns if "xmem" in k]
    from xmem_engine.tracing.steady import steady_code

    outside: dict = {"torch": torch}
    exec(steady_code(source, "<marked>", 1), outside)
    assert outside["f"](2) == 0  # outside any trace: the marks do nothing
    with pytest.raises(ZeroDivisionError) as info:
        outside["f"](0)
    assert info.traceback[-1].lineno + 1 == 3  # the user's line


def test_the_search_as_data_validates_against_the_report_schema():
    from xmem_engine.estimate import estimate_trace

    jsonschema = pytest.importorskip("jsonschema")
    tr = trace(HALVING, {}, mode="fake", device=SMALL)
    report = estimate_trace(tr, "T4").to_report()
    assert report["batch_size_search"][0]["tries"][0] == {"batch_size": None, "outcome": "out of memory"}
    schema = json.loads((Path(__file__).resolve().parents[2] / "xmem_engine/data/report.schema.json").read_text())
    jsonschema.validate(report, schema)
