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

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "demo_notebooks").glob("*.ipynb"))
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
    nb = executions[path].result()
    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        errors = [o for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    xmem_cells = [c for c in code if c.source.startswith("%%xmem") and "--quiet" not in c.source.split("\n")[0]]
    assert xmem_cells, path.name
    for c in xmem_cells:
        # one result: a single output holds the widget's view and the report it falls back to
        kinds = [o.get("data", {}) for o in c.outputs if o.output_type == "display_data"]
        results = [d for d in kinds if WIDGET_MIME in d or REPORT_MIME in d]
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
    """What each notebook's prose says its outputs show."""
    reports = [o.data[REPORT_MIME] for c in code for o in c.outputs
               if o.output_type == "display_data" and REPORT_MIME in o.get("data", {})]
    allout = "\n".join(_text(c) for c in code)
    if stem.startswith("01"):
        cnn, gpt = reports[0], reports[1]
        assert cnn["gpu"] == "T4" and cnn["fits"]
        assert gpt["gpu"] == "T4" and not gpt["fits"]
        assert "does not fit" in allout and "steps_done = 1" in allout and "in namespace: False" in allout
    elif stem.startswith("02"):
        html = [o.data["text/html"] for c in code for o in c.outputs
                if o.output_type == "display_data" and REPORT_MIME in o.get("data", {})]
        assert "largest batch that fits" in html[0]
        assert "largest bs on T4:" in allout
    elif stem.startswith("03"):
        assert "reserved" in allout and "expandable" in allout
    elif stem.startswith("04"):
        rows = [line for line in allout.splitlines() if line.startswith(("fp32", "bf16", "checkpointing"))]
        assert len(rows) == 3, allout
        base, bf16, ckpt = (r["peak_device_bytes"] for r in reports[:3])
        assert bf16 < base and ckpt < base
