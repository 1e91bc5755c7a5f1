"""Every demo notebook runs headless, top to bottom (nbclient), and its outputs are right.

Checks per notebook: no errors; each ``%%xmem`` cell shows one result, an output holding the
widget's view and the static report (``application/vnd.xmem.report+json`` + ``text/html``); the saved
widget state holds the Bokeh document and the inline BokehJS loader; and what the notebook
claims in its own text (fits / does not fit, the largest batch, the allocator numbers).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]


def requirements(path: Path) -> list[str]:
    """The libraries a notebook needs beyond xmem's own (``metadata.xmem.requires``): the
    fine-tuning notebook runs in the fine-tuning environment (``tests/finetune/test_finetune_notebook.py``)."""
    return nbformat.read(path, as_version=4).metadata.get("xmem", {}).get("requires", [])


NOTEBOOKS = [p for p in sorted((ROOT / "demo_notebooks").glob("*.ipynb")) if not requirements(p)]
REPORT_MIME = "application/vnd.xmem.report+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
STATE_MIME = "application/vnd.jupyter.widget-state+json"


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def _run(path: Path, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is committed with outputs"
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", store_widget_state=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(nb, tmp_path / path.name)  # the executed copy, for a look when a check fails
    return nb


@pytest.fixture(scope="module")
def executions(tmp_path_factory) -> dict[Path, Future]:
    """All notebooks start at once, each in its own kernel: the machine's cores work in
    parallel, and each test below waits only for its own notebook."""
    pool = ThreadPoolExecutor(max_workers=len(NOTEBOOKS) or 1)
    futures = {p: pool.submit(_run, p, tmp_path_factory.mktemp(p.stem)) for p in NOTEBOOKS}
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_demo_notebook_runs(path, executions):
    check_notebook(path, executions[path].result())


def check_notebook(path: Path, nb) -> None:
    """An executed notebook: no errors, one result per ``%%xmem`` cell, and its text's claims."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        errors = [o for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    xmem_cells = [c for c in code if c.source.startswith("%%xmem") and "--quiet" not in c.source.split("\n")[0]]
    assert xmem_cells, path.name
    for c in xmem_cells:
        # one result: a single output holds the widget's view and the report it falls back to
        kinds = [o.get("data", {}) for o in c.outputs if o.output_type == "display_data"]
        # (a library's own progress bars, tqdm widgets without a report, are the cell's, not xmem's)
        results = [d for d in kinds if REPORT_MIME in d or (WIDGET_MIME in d and "text/html" in d)]
        assert len(results) == 1, (path.name, c.source[:60], [list(d) for d in kinds])
        result = results[0]
        assert WIDGET_MIME in result and REPORT_MIME in result, (path.name, list(result))
        assert "text/html" in result and "peak" in result["text/html"].lower()
        assert result["text/plain"].startswith("xmem: ")  # never the widget's repr
        assert result[REPORT_MIME]["version"] >= 1
    state = nb.metadata["widgets"][STATE_MIME]["state"]
    names = [m["model_name"] for m in state.values()]
    bokeh = [m for m in state.values() if m["model_name"] == "BokehModel"]
    assert len(bokeh) >= len(xmem_cells), names
    assert all(m["state"]["render_bundle"] for m in bokeh)
    loaders = [m for m in state.values() if m["model_name"] == "OutputModel"
               and any("application/javascript" in o.get("data", {})
                       for o in m["state"].get("outputs", []))]
    assert len(loaders) == 1, "one shared inline BokehJS loader"
    _claims(path.stem, nb, code)


def _claims(stem: str, nb, code) -> None:
    """What each notebook's prose says its outputs show. The notebooks print every figure and
    comparison their text points to; these checks keep text and output from drifting apart."""
    import re

    reports = [o.data[REPORT_MIME] for c in code for o in c.outputs
               if o.output_type == "display_data" and REPORT_MIME in o.get("data", {})]
    htmls = [o.data["text/html"] for c in code for o in c.outputs
             if o.output_type == "display_data" and REPORT_MIME in o.get("data", {})]
    allout = "\n".join(_text(c) for c in code)
    lines = allout.splitlines()

    def line(prefix: str) -> str:
        found = [x for x in lines if x.startswith(prefix)]
        assert found, (prefix, allout[-3000:])
        return found[0]

    if stem.startswith("01"):
        cnn, gpt = reports[0], reports[1]
        assert cnn["gpu"] == "T4" and cnn["fits"]
        assert gpt["gpu"] == "T4" and not gpt["fits"]  # "this one does not fit a 16 GB T4"
        assert "does not fit" in line("Tesla T4") and "fits" in line("NVIDIA H100")
        assert "steps_done = 1" in allout and "in namespace: False" in allout
    elif stem.startswith("02"):
        found = dict(re.findall(r"(T4|A100-SXM4-40GB): (\d+)", htmls[0].split("largest batch that fits:")[1]))
        assert set(found) == {"T4", "A100-SXM4-40GB"}
        # max_batch from Python finds what the magic found, GPU by GPU
        assert line("largest batch that fits on T4:").endswith(f": {found['T4']}")
        assert line("largest batch that fits on A100-SXM4-40GB:").endswith(f": {found['A100-SXM4-40GB']}")
        assert f"largest bs on Tesla T4: {found['T4']}" in allout  # the namespace variable: same step, same answer
    elif stem.startswith("03"):
        one = line("one 1-byte tensor")
        assert re.search(r"allocated\s+512 B\s+reserved\s+2\.00 MiB\s+segments 1$", one), one
        assert re.search(r"reserved\s+22\.00 MiB\s+segments 2$", line("+ one 3 MiB tensor"))
        assert re.search(r"reserved\s+22\.00 MiB\s+segments 2$", line("+ one 12 MiB tensor"))
        assert line("the 12 MiB tensor starts where").endswith("True")
        frag, exp = (_text(c) for c in code if "keep.append" in c.source)
        assert "no free hole was large enough" in frag and "a free hole was reused" in exp
        toggle = line("with expandable segments:")
        expandable, plain = (float(x) for x in re.findall(r"([\d.]+) MiB", toggle)[:2])
        verb = "saves" if expandable < plain else "costs" if expandable > plain else "changes"
        assert f": {verb} " in toggle, toggle
        assert expandable % 2 == 0  # expandable segments map whole pages (2 MiB multiples)
        # which iteration peaks: the printout against the report's own timeline
        tl = reports[0]["timeline"]
        starts = tl["iterations"] + [tl["event"][-1] + 1]
        marker = next(i for i, (lo, hi) in enumerate(zip(starts, starts[1:]), 1) if lo <= tl["peak_event"] < hi)
        said = line("both iterations peak") if "both iterations peak" in allout else line("iteration ")
        assert ("at the first" in said and marker == 1) or f"iteration {marker} peaks higher" in allout, (said, marker)
    elif stem.startswith("04"):
        rows = {m.group(1).strip(): m.group(2) for m in (re.match(r"^(fp32|bf16|autocast fp16|checkpointing)\s(.*)$", x)
                                                         for x in lines) if m}
        assert set(rows) == {"fp32", "bf16", "autocast fp16", "checkpointing"}, allout
        base, bf16, amp, ckpt = reports[:4]
        assert bf16["peak_device_bytes"] < base["peak_device_bytes"] and ckpt["peak_device_bytes"] < base["peak_device_bytes"]
        assert not any("autocast" in n and "not" in n for n in amp["notes"])  # autocast is traced
        share = line("autocast fp16: peak")
        assert f"{amp['peak_device_bytes'] / base['peak_device_bytes']:.0%}" in share
        # "What would make it fit": the advice in the report, and what the prose says of it
        advice = reports[4]["advice"]
        assert not advice["fits"] and advice["batch"] == 32  # "this one does not fit the T4"
        assert line("cheapest change that fits:").endswith(": " + " + ".join(advice["combination"]))
        share = {lv["lever"]: lv["peak_device_bytes"] / advice["peak_device_bytes"] for lv in advice["levers"]
                 if lv["peak_device_bytes"] is not None}
        for name, value in share.items():
            assert line(f"{name}: ").endswith(f", {value:.0%} of as written"), name
        assert share["activation checkpointing"] < 0.5 and share["gradient accumulation x2"] < 0.6  # "cut"
        assert 0.9 < share["autocast float16"] < 1.05  # "barely moves this step"
        assert share["Adafactor instead of Adam(W)"] > 0.99  # "nothing at the peak"
    elif stem.startswith("05"):
        table = [x for x in lines if re.match(r"^\s+\d+\s+[\d.]+ GiB", x)]
        assert len(table) == 5, allout
        batches = [int(x.split()[0]) for x in table]
        peaks = [[float(v) for v in re.findall(r"([\d.]+) GiB", x)] for x in table]
        marks = [re.findall(r"[✓✗]", x) for x in table]
        assert all(len(p) == 4 for p in peaks) and all(a[g] < b[g] for a, b in zip(peaks, peaks[1:]) for g in range(4))
        largest = [int(re.search(r": (\d+)$", x).group(1)) for x in lines if x.startswith("largest batch that fits on")]
        assert len(largest) == 4 and largest == sorted(largest), largest  # more memory, larger batch
        for g, n in enumerate(largest):  # the table's marks agree with each GPU's search
            assert [m[g] == "✓" for m in marks] == [b <= n for b in batches], (g, n, marks)
        assert "parameter" in line("the same at both batch sizes:")
        assert "activation" in line("grew by more than half")
    elif stem.startswith("07"):
        qlora, forgot = reports[0], reports[1]
        assert qlora["gpu"] == "T4" and qlora["fits"]  # "The step fits"
        assert not forgot["fits"]  # "Without model.train() the step does not fit"
        assert line("peak ").endswith(": fits")
        assert line("with model.train():").endswith(": fits")
        assert line("without model.train():").endswith(": does not fit")
        gib = [float(x) for x in re.findall(r"activations ([\d.]+) GiB", allout)]
        assert len(gib) == 2 and gib[1] > 2 * gib[0]  # "every layer keeps its activations"
        assert any(x.startswith("- paged optimizer states") for x in lines)
        assert any(x.startswith("- PreTrainedModel.save_pretrained") for x in lines)
    elif stem.startswith("06"):
        assert reports[0]["world"] == {"size": 8, "rank": 0, "gpus_per_node": 8} and reports[0]["fits"]
        rows = {s: [float(v) for v in re.findall(r"([\d.]+) GiB", line(s + " "))]
                for s in ("DDP", "FSDP", "FSDP + CPU offload")}
        assert all(len(v) == 4 for v in rows.values()), rows
        # "does not move with the number of GPUs once there are two or more"; "NCCL's communicator adds"
        assert len(set(rows["DDP"][1:])) == 1 and 0.5 < rows["DDP"][1] - rows["DDP"][0] < 1.0, rows["DDP"]
        assert rows["FSDP"] == sorted(rows["FSDP"], reverse=True) and rows["FSDP"][-1] < rows["FSDP"][0]  # "falls"
        assert rows["FSDP + CPU offload"][-1] < rows["FSDP"][-1]
        share = int(re.search(r"activations are (\d+)%", allout).group(1))
        assert share > 50  # "mostly activations"
        largest = [int(re.search(r"is (\d+)$", line(f"{s}: the largest batch")).group(1))
                   for s in ("DDP", "FSDP", "FSDP + CPU offload")]
        assert largest[0] < min(largest[1:]), largest  # "a larger batch than DDP's"
