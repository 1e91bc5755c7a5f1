"""`xmem sweep` (xmem_engine/sweep/engine.py): a grid of estimates on all cores or a Ray cluster.

The rows are the engine's estimates (one trace per script and --set values, re-simulated per
GPU); the process pool gives exactly the rows of a serial loop, and Ray, on a local head
started here, the rows of the pool. A point whose script fails is a row with its error;
bad input is refused before anything is traced; a second run with the same --out skips the
points it holds; Ctrl-C keeps the finished rows.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xmem_engine.cli import main
from xmem_engine.estimate import estimate_script, max_batch
from xmem_engine.sweep import Row, SweepInputError, make_grid, parse_set, plan, run_unit, sweep

REPO = Path(__file__).resolve().parents[2]
GPUS = ["RTX-4060-8GB", "T4"]
BATCHES = ["3", "8", "4096", "16384"]  # 3: the script raises; 16384 fits neither GPU
TINY = '''import torch
import torch.nn as nn

batch = 8
width = 512
if batch == 3:
    raise ValueError("batch 3 is not supported")
model = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(2):
    x = torch.randn(batch, 64, width, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sweep") / "tiny.py"
    path.write_text(TINY)
    return str(path)


@pytest.fixture(scope="module")
def serial_rows(tiny) -> list[Row]:
    """The reference: every unit run in this process, one after another."""
    return sweep(tiny, GPUS, {"batch": BATCHES}, max_batch="batch", engine="serial")


@pytest.fixture(scope="module")
def local_csv(tiny, tmp_path_factory) -> Path:
    """The same grid through the CLI's default engine, a pool of 2 worker processes."""
    out = tmp_path_factory.mktemp("local") / "rows.csv"
    code = main(["sweep", tiny, "--gpu", ",".join(GPUS), "--set", "batch=" + ",".join(BATCHES),
                 "--max-batch", "batch", "--out", str(out), "--workers", "2", "--quiet"])
    assert code == 1  # batch=3 failed (its row says why); every other point ran
    return out


def results(rows) -> list[dict]:
    """Rows without their timings, in grid order."""
    return sorted((r.result() for r in rows), key=lambda d: json.dumps(d, sort_keys=True, default=str))


def read_rows(path: Path) -> list[Row]:
    from xmem_engine.sweep.output import Output

    return Output(str(path), Row, ["batch"]).rows


def test_rows_are_the_engine_s_estimates(tiny, serial_rows):
    points = {(r.settings["batch"], r.gpu): r for r in serial_rows if r.kind == "point"}
    assert len(points) == len(BATCHES) * len(GPUS)
    for batch in ("8", "16384"):
        traced = estimate_script(tiny, GPUS[0], overrides={"batch": batch})
        for gpu in GPUS:
            est = traced.resimulate(gpu)
            row = points[(batch, gpu)]
            assert row.status == "ok" and row.traced_for == GPUS[0]
            assert (row.peak_device_bytes, row.fits, row.headroom_bytes, row.mode) == \
                (est.peak_device_bytes, est.fits, est.headroom_bytes, str(est.mode))
    assert points[("4096", "T4")].fits and not points[("16384", "T4")].fits


def test_exact_gives_the_rows_of_xmem_estimate_per_gpu(tiny):
    """--exact traces for every GPU: each row is what `xmem estimate --gpu G` says."""
    rows = sweep(tiny, GPUS, {"batch": ["8", "4096"]}, exact=True, engine="serial")
    for row in rows:
        est = estimate_script(tiny, row.gpu, overrides=row.settings)
        assert row.traced_for == row.gpu
        assert (row.peak_device_bytes, row.peak_allocated_bytes, row.fits, row.notes) == \
            (est.peak_device_bytes, est.peak_allocated_bytes, est.fits, est.notes)


def test_a_failing_point_is_a_row_with_its_error(serial_rows):
    failed = [r for r in serial_rows if r.status == "failed"]
    assert {(r.settings["batch"], r.gpu) for r in failed} == {("3", g) for g in GPUS}
    assert all("ValueError: batch 3 is not supported (line 7 of tiny.py)" == r.error for r in failed)
    assert all(r.peak_device_bytes is None for r in failed)


def test_max_batch_per_gpu_is_estimate_max_batch(tiny, serial_rows):
    searches = {r.gpu: r for r in serial_rows if r.kind == "max_batch"}
    assert set(searches) == set(GPUS) and all(r.settings == {} for r in searches.values())
    traces = {}

    def build(v):
        if v not in traces:
            traces[v] = estimate_script(tiny, GPUS[0], overrides={"batch": str(v)}).trace
        return traces[v]

    from xmem_engine.estimate import estimate_trace

    for gpu, row in searches.items():
        expected = max_batch(lambda v: estimate_trace(build(v), gpu), start=16384)
        assert row.max_value == expected.value and row.answer == str(expected.value)
        assert row.fits and row.peak_device_bytes == expected.estimate.peak_device_bytes
    assert 4096 < searches["RTX-4060-8GB"].max_value < searches["T4"].max_value < 16384


def test_local_pool_gives_the_serial_rows(serial_rows, local_csv):
    assert results(read_rows(local_csv)) == results(serial_rows)
    with open(local_csv, newline="") as fh:
        header = next(csv.reader(fh))
    for column in ("script", "set:batch", "gpu", "fits", "peak_device_bytes", "headroom_bytes", "mode", "seconds",
                   "notes", "error", "max_value"):
        assert column in header


def test_the_script_travels_as_text(tiny, serial_rows):
    """What a Ray node runs: the script's text under its name, no file needed."""
    grid = make_grid([tiny], GPUS, {"batch": ["8"]})
    [unit] = plan(grid)
    unit.path = "/nowhere/on/this/node/tiny.py"
    rows = run_unit(unit)
    ref = {r.gpu: r for r in serial_rows if r.kind == "point" and r.settings == {"batch": "8"}}
    assert [r.peak_device_bytes for r in rows] == [ref[g].peak_device_bytes for g in GPUS]
    unit.source = unit.source.replace("if batch == 3:", "if batch == 8:")
    assert run_unit(unit)[0].error == "ValueError: batch 3 is not supported (line 7 of tiny.py)"


@pytest.mark.parametrize("ext", [".csv", ".jsonl"])
def test_a_second_run_skips_the_points_in_out(tiny, serial_rows, tmp_path, ext):
    out = str(tmp_path / f"rows{ext}")
    counts = []
    first = sweep(tiny, GPUS, {"batch": ["8"]}, out=out, engine="serial", progress=lambda d, t: counts.append(t))
    assert len(first) == 2 and counts[-1] == 2
    counts.clear()
    rows = sweep(tiny, GPUS, {"batch": ["8", "4096"]}, out=out, engine="serial",
                 progress=lambda d, t: counts.append(t))
    assert counts[-1] == 2  # only batch 4096's two points ran
    assert [r.result() for r in rows[:2]] == [r.result() for r in first]
    ref = [r.result() for r in serial_rows if r.kind == "point" and r.settings["batch"] in ("8", "4096")]
    assert [r.result() for r in rows] == ref
    assert sweep(tiny, GPUS, {"batch": ["8", "4096"]}, out=out, engine="serial") == rows  # nothing left to run
    assert len(read_rows(Path(out)) if ext == ".csv" else open(out).read().splitlines()) == 4


def test_parquet_round_trip(tiny, tmp_path):
    pytest.importorskip("pyarrow")
    out = str(tmp_path / "rows.parquet")
    rows = sweep(tiny, GPUS, {"batch": ["8"]}, out=out, engine="serial")
    again = sweep(tiny, GPUS, {"batch": ["8"]}, out=out, engine="serial", progress=lambda d, t: pytest.fail("re-ran"))
    assert [r.result() for r in again] == [r.result() for r in rows]


def test_parquet_without_pyarrow_is_refused_before_tracing(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    code = main(["sweep", tiny, "--gpu", "T4", "--out", str(tmp_path / "r.parquet")])
    assert code == 2 and "pip install pyarrow" in capsys.readouterr().err


def test_parse_set_splits_at_top_level_commas():
    assert parse_set(["batch=8,16", "shape=(2,3),(4,5)", "name='a,b',c", "lr=1e-3"]) == {
        "batch": ["8", "16"], "shape": ["(2,3)", "(4,5)"], "name": ["'a,b'", "c"], "lr": ["1e-3"]}
    with pytest.raises(SweepInputError):
        parse_set(["batch"])


@pytest.mark.parametrize("argv, fragment", [
    (["--gpu", "B9000"], "unknown GPU"),
    (["--set", "batch"], "VAR=V1,V2"),
    (["--set", "batchsize=3,4"], "batchsize"),
    (["--set", "batch=8,,16"], "empty value"),
    (["--alloc-conf", "max_split_size_mb:1"], "max_split_size_mb"),
    (["--max-batch", "width_name"], "width_name"),
    (["--set", "batch=8,big", "--max-batch", "batch"], "positive integer"),
    (["--out", "rows.xlsx"], ".csv"),
    (["--iterations", "0"], "--iterations"),
    (["--workers", "0"], "--workers"),
])
def test_bad_input_exits_2_before_tracing(tiny, tmp_path, monkeypatch, capsys, argv, fragment):
    monkeypatch.setattr("xmem_engine.sweep.engine.run_units", lambda *a, **k: pytest.fail("traced"))
    monkeypatch.chdir(tmp_path)
    if "--out" not in argv:
        argv = [*argv, "--out", "rows.csv"]
    code = main(["sweep", tiny, *argv])
    assert code == 2
    assert fragment.lower() in capsys.readouterr().err.lower()
    assert not (tmp_path / "rows.csv").exists()


def test_unreadable_script_and_missing_ray_exit_2(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "missing.py", "--out", "r.csv"]) == 2
    assert "no such script: missing.py" in capsys.readouterr().err
    (tmp_path / "bad.py").write_text("batch = 8\nif batch:\nprint(1)\n")
    assert main(["sweep", "bad.py", "--out", "r.csv"]) == 2
    assert "syntax error (line 3)" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["sweep", tiny, "--engine", "ray", "--out", "r.csv"]) == 2
    assert "pip install 'xmem[ray]'" in capsys.readouterr().err


def test_a_ray_cluster_that_does_not_start_is_said_with_what_to_do(tiny, tmp_path, monkeypatch, capsys):
    # issue #36 item 6: a local head too slow to start gave Ray's own exception and traceback
    ray = pytest.importorskip("ray")

    def slow_head(*args, **kwargs):
        raise TimeoutError("Timed out after 60 seconds waiting for the GCS to start")

    monkeypatch.setattr(ray, "init", slow_head)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", tiny, "--engine", "ray", "--gpu", "T4", "--out", "r.csv", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the local Ray cluster did not start: TimeoutError" in err and "--engine local" in err
    assert "Traceback" not in err


def test_ctrl_c_keeps_finished_rows_and_stops_the_workers(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\nimport torch\nscale = 1.0\ntime.sleep(1)\nx = torch.ones(int(scale), device='cuda')\n")
    out = tmp_path / "rows.jsonl"
    # not whole numbers: a unit per value (whole ones would be one unit, sweep.family_axis)
    cmd = [sys.executable, "-m", "xmem_engine", "sweep", str(script), "--gpu", "T4", "--set",
           "scale=" + ",".join(f"{b}.0" for b in range(1, 13)), "--out", str(out), "--workers", "1", "--quiet"]
    # A test run started in the background by a shell ignores SIGINT, and children inherit that:
    # give the sweep the default disposition a terminal's foreground job has.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole foreground group
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command again to resume" in err
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(kept) < 12 and all(r["status"] == "ok" for r in kept)
    time.sleep(0.5)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()
             and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]]
    assert not alive


def test_ray_cluster_gives_the_local_rows(tiny, local_csv, tmp_path, monkeypatch, capsys):
    """A Ray head on the loopback address, started and stopped here; `xmem sweep --engine ray`
    sends its units to it as tasks (the script as text) and takes the rows as they finish.
    (benchmarks/sweep_speed.py also connects to such a head from another process, --address.)"""
    # Ray binds a head to the machine's outward address, even when told 127.0.0.1, unless
    # clusters are off (its setting for laptops); Ray's own processes inherit it.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    monkeypatch.setattr("ray._private.ray_constants.ENABLE_RAY_CLUSTER", False)  # if imported before
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = tmp_path / "ray.jsonl"
    try:
        address = ray.get_runtime_context().gcs_address
        assert address.startswith("127.0.0.1:")
        code = main(["sweep", tiny, "--gpu", ",".join(GPUS), "--set", "batch=" + ",".join(BATCHES), "--max-batch",
                     "batch", "--engine", "ray", "--address", address, "--out", str(out), "--quiet"])
        assert ray.is_initialized()  # the sweep used the cluster it found, and left it running
    finally:
        ray.shutdown()
    assert code == 1, capsys.readouterr().err  # batch=3 failed on the cluster too, and said why
    ray_rows = read_rows(out)
    assert results(ray_rows) == results(read_rows(local_csv))
    assert any(r.status == "failed" and "batch 3 is not supported" in r.error for r in ray_rows)


def test_heat_map_shows_peaks_and_the_fit_boundary(serial_rows):
    pytest.importorskip("bokeh")
    from xmem_jupyter.palette import HEAT_COLORS, SWEEP_COLORS
    from xmem_jupyter.sweep_view import heat_map, heat_map_data

    d = heat_map_data(serial_rows)
    assert d["var"] == "batch" and d["xs"] == BATCHES and d["gpus"] == GPUS  # GPUs by memory, batches by value
    cells = dict(zip(zip(d["columns"]["x"], d["columns"]["y"]), d["columns"]["fill"]))
    assert cells[(0, 0)] == SWEEP_COLORS["failed"] and cells[(3, 1)] == SWEEP_COLORS["nofit"]
    assert cells[(1, 1)] in HEAT_COLORS
    # the boundary: between 4096 (fits) and 16384 (does not), on both GPUs
    assert sorted(zip(d["boundary"]["x0"], d["boundary"]["y0"])) == [(2.5, -0.5), (2.5, 0.5)]
    assert d["searched"]["T4"] == next(r.answer for r in serial_rows if r.kind == "max_batch" and r.gpu == "T4")
    fig = heat_map(serial_rows)
    assert "peak GPU memory" in fig.title.text and fig.yaxis.major_label_overrides[1].startswith("T4 (max ")
    from xmem_jupyter.sweep_view import sweep_view

    assert len(sweep_view(serial_rows).children) == 2  # the shared BokehJS loader, then the heat map


FSDP_LIKE = """
import os
import torch, torch.distributed as dist
dist.init_process_group("nccl")
world = dist.get_world_size()
shard = torch.empty(4 * 2**20 // world, device="cuda")      # 16 MiB of states, sharded
full = torch.empty(4 * 2**20 // world * world, device="cuda")
dist.all_gather_into_tensor(full, shard)
del full
dist.destroy_process_group()
"""


def test_world_sizes_are_a_dimension_of_the_grid(tmp_path):
    """Each world size is traced (rank 0 of it), every row says which, and a second run of the
    same command finds them all done."""
    script = tmp_path / "sharded.py"
    script.write_text(FSDP_LIKE)
    out = tmp_path / "rows.jsonl"
    rows = sweep(str(script), ["T4", "L4"], world_sizes=[1, 4], out=str(out), engine="serial")
    assert [(r.world_size, r.gpu) for r in rows] == [(1, "T4"), (1, "L4"), (4, "T4"), (4, "L4")]
    assert all(r.status == "ok" for r in rows), [r.error for r in rows]
    one, four = rows[0].peak_allocated_bytes, rows[2].peak_allocated_bytes
    assert one - four == 16 * 2**20 - 4 * 2**20  # the shard: all of it at 1 rank, a quarter at 4
    again = sweep(str(script), ["T4", "L4"], world_sizes=[1, 4], out=str(out), engine="serial",
                  progress=lambda done, total: pytest.fail("a point ran again"))
    assert [r.result() for r in again] == [r.result() for r in rows]
    assert main(["sweep", str(script), "--world-size", "2,x", "--out", str(tmp_path / "r.csv")]) == 2


def test_a_worker_that_dies_fails_its_own_point_only(tmp_path):
    # issue #36 item 3: one point killing its process failed every row of the sweep
    script = tmp_path / "dies.py"
    script.write_text(TINY.replace('raise ValueError("batch 3 is not supported")',
                                   "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    # --exact: a unit per value; else one unit for 3..5 (traced at 3 and 5), which dies at 3 and
    # runs again value by value
    for values, exact in ((["2", "3", "4"], True), (["3", "4", "5"], False)):
        rows = sweep(str(script), ["T4"], {"batch": values}, engine="local", workers=2, exact=exact)
        status = {r.settings["batch"]: (r.status, r.error) for r in rows}
        assert status["3"][0] == "failed" and "worker process died" in status["3"][1]
        assert all(status[b] == ("ok", "") for b in values if b != "3"), status


@pytest.mark.parametrize("ext", [".csv", ".jsonl"])
def test_resume_does_not_trust_a_row_cut_short_or_altered(serial_rows, tmp_path, ext):
    # issue #36 item 4: a row cut inside peak_device_bytes was read back as a peak of 767 bytes
    from xmem_engine.sweep.output import Output

    path = tmp_path / ("rows" + ext)
    ok = [r for r in serial_rows if r.status == "ok" and r.peak_device_bytes][:3]
    out = Output(str(path), Row, ["batch"])
    out.append(ok)
    text = path.read_text()
    peak = str(ok[1].peak_device_bytes)
    altered = text.replace(peak, peak[:-1] + str((int(peak[-1]) + 1) % 10), 1)  # one digit off
    assert altered != text
    cut = text[:text.rindex(str(ok[2].peak_device_bytes)) + 3]  # the last row ends inside its peak
    for broken, good in ((altered, [ok[0], ok[2]]), (cut, ok[:2])):
        path.write_text(broken)
        again = Output(str(path), Row, ["batch"])
        assert [r.result() for r in again.rows] == [r.result() for r in good] and again.dropped == 1
        again.append([ok[1] if good[-1] is ok[2] else ok[2]])  # the dropped point, run again
        assert len(Output(str(path), Row, ["batch"]).rows) == 3 and Output(str(path), Row, ["batch"]).dropped == 0


def test_resume_after_an_open_quoted_field(serial_rows, tmp_path):
    # a write cut inside a quoted CSV field (the notes): the next append must not land inside it
    from xmem_engine.sweep.output import Output

    path = tmp_path / "rows.csv"
    ok = [r for r in serial_rows if r.status == "ok"][:2]
    Output(str(path), Row, ["batch"]).append(ok[:1])
    path.write_text(path.read_text() + 'point,' + ok[1].script + ',"8,T4,half a note\nstill open')
    again = Output(str(path), Row, ["batch"])
    assert len(again.rows) == 1 and again.dropped == 1
    again.append(ok[1:])
    assert len(Output(str(path), Row, ["batch"]).rows) == 2


def test_each_point_starts_in_the_sweeps_folder_and_environment(tmp_path, monkeypatch):
    # issue #36 item 5: a point that changed folder made the next point's relative open() fail
    script = tmp_path / "moves.py"
    script.write_text("import os, torch\nbatch = 1\nassert open('data.txt').read() == 'ok'\n"
                      "assert 'XMEM_TEST_LEAK' not in os.environ\n"
                      "os.environ['XMEM_TEST_LEAK'] = '1'\nos.chdir('/')\nx = torch.ones(batch, device='cuda')\n")
    (tmp_path / "data.txt").write_text("ok")
    monkeypatch.chdir(tmp_path)
    rows = sweep(str(script), ["T4"], {"batch": ["1", "2", "3"]}, engine="serial")
    assert [r.status for r in rows] == ["ok"] * 3, [r.error for r in rows]
    assert os.getcwd() == str(tmp_path) and "XMEM_TEST_LEAK" not in os.environ


def _counting(monkeypatch) -> tuple[list[str], list[int]]:
    """The values the sweep traces as they are, and those it traces with the batch a symbol."""
    import xmem_engine.batch_family as bf
    import xmem_engine.sweep.engine as sw

    traced: list[str] = []
    symbolic: list[int] = []
    real_trace, real_symbolic = sw._trace, bf.symbolic_family
    monkeypatch.setattr(sw, "_trace", lambda unit, settings: traced.append(settings["batch"]) or
                        real_trace(unit, settings))
    monkeypatch.setattr(bf, "symbolic_family", lambda path, var, v, **kw: symbolic.append(v) or
                        real_symbolic(path, var, v, **kw))
    return traced, symbolic


def test_a_batch_axis_is_one_symbolic_trace(tmp_path, monkeypatch):
    """issue #34: 4 batch sizes x 2 GPUs from one trace with the batch a symbol; each row equals
    --exact's (a trace per point), and the rows not traced say so. The cell's test of the batch
    for a value (batch == 3) is a guard the other values keep."""
    script = tmp_path / "mlp.py"
    script.write_text(TINY)
    traced, symbolic = _counting(monkeypatch)
    values = ["8", "16", "24", "40"]
    rows = sweep(str(script), ["T4", "A100-40GB"], {"batch": values}, engine="serial")
    assert traced == [] and symbolic == [8]
    exact = sweep(str(script), ["T4", "A100-40GB"], {"batch": values}, engine="serial", exact=True)
    assert len(traced) == 8 and symbolic == [8]  # --exact: a trace per value and GPU
    assert [(r.settings, r.gpu, r.peak_device_bytes, r.peak_reserved_bytes) for r in rows] == \
           [(r.settings, r.gpu, r.peak_device_bytes, r.peak_reserved_bytes) for r in exact]
    for r in rows:
        assert any("was not traced" in n for n in r.notes) == (r.settings["batch"] != "8"), r


def test_a_batch_axis_that_cannot_be_symbolic_is_traced_at_its_ends_and_the_rest_is_the_family(tmp_path, monkeypatch):
    """issue #34: where the batch cannot be a symbol (here: range() over it), two traces and
    their family; a script that tests the batch for a value (batch == 3) may differ between the
    ends: every value traced."""
    script = tmp_path / "mlp.py"
    pinned = TINY.replace('if batch == 3:\n    raise ValueError("batch 3 is not supported")\n', "") + \
        "ids = list(range(batch))\n"
    script.write_text(pinned)
    traced, symbolic = _counting(monkeypatch)
    values = ["8", "16", "24", "40"]
    rows = sweep(str(script), ["T4", "A100-40GB"], {"batch": values}, engine="serial")
    assert sorted(traced, key=int) == ["8", "40"] and symbolic == [8]
    exact = sweep(str(script), ["T4", "A100-40GB"], {"batch": values}, engine="serial", exact=True)
    assert [(r.settings, r.gpu, r.peak_device_bytes, r.peak_reserved_bytes) for r in rows] == \
           [(r.settings, r.gpu, r.peak_device_bytes, r.peak_reserved_bytes) for r in exact]
    for r in rows:
        assert any("was not traced" in n for n in r.notes) == (r.settings["batch"] in ("16", "24")), r
    script.write_text(TINY + "ids = list(range(batch))\n")
    traced.clear()
    sweep(str(script), ["T4"], {"batch": values}, engine="serial")
    assert sorted(traced, key=int) == values
