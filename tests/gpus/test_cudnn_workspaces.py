"""gpus/cudnn + tracing/convolutions: cuDNN convolution workspaces, recorded per call on the CPU
and added from a table measured on a GPU, dropped when the device cannot give them."""

import json

import pytest

from xmem_engine.estimate import estimate_trace
from xmem_engine.gpus import cudnn, get_gpu
from xmem_engine.gpus.cuda_libraries import adapt_trace
from xmem_engine.simulation.simulate import simulate
from xmem_engine.trace import ALLOC, CUDNN_WORKSPACE_OP, FREE, Trace, TraceEvent
from xmem_engine.tracing import trace

MiB = 1 << 20
A100 = get_gpu("A100-40GB")

STEP = """
import torch
net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, stride=2, padding=1),
                          torch.nn.Conv2d(32, 32, 3, groups=32, padding=1), torch.nn.Conv2d(32, 16, 1)).cuda()
x = torch.randn(4, 3, 86, 86, device="cuda")
net(x).sum().backward()
"""


@pytest.fixture(scope="module")
def conv_trace() -> Trace:
    return trace(STEP, {}, mode="fake")


def _calls(tr: Trace) -> list[tuple[str, list[cudnn.ConvProblem]]]:
    ops = {e.id: e.op for e in tr.events if e.kind == ALLOC}
    return [(ops[i], [cudnn.ConvProblem.from_key(k) for k in keys]) for i, keys in tr.meta["conv_calls"]]


def test_the_tracer_records_each_convolution_as_cudnn_sees_it(conv_trace):
    calls = _calls(conv_trace)
    fwd = [p for op, ps in calls if op == "aten.convolution.default" for p in ps]
    assert [(p.input, p.weight, p.stride, p.padding, p.groups) for p in fwd] == [
        ((4, 3, 86, 86), (32, 3, 3, 3), (2, 2), (1, 1), 1),
        ((4, 32, 43, 43), (32, 1, 3, 3), (1, 1), (1, 1), 32),
        ((4, 32, 43, 43), (16, 32, 1, 1), (1, 1), (0, 0), 1)]
    bwd = [[p.direction for p in ps] for op, ps in calls if op == "aten.convolution_backward.default"]
    # backward runs in reverse; the first layer's input needs no gradient: only its weight's
    assert bwd == [["backward_data", "backward_weight"]] * 2 + [["backward_weight"]]
    assert all(p.dtype == "float32" and not p.channels_last and not p.deterministic for _, ps in calls for p in ps)
    assert "cudnn_benchmark" not in conv_trace.meta


def test_settings_that_change_cudnns_choice_are_in_the_key():
    import torch

    step = """
import torch
conv = torch.nn.Conv2d(8, 8, 3).cuda().to(memory_format=torch.channels_last)
x = torch.randn(2, 8, 16, 16, device="cuda").to(memory_format=torch.channels_last)
conv(x)
"""
    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, True
        tr = trace(step, {}, mode="fake")
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before
    (p,), = [ps for _, ps in _calls(tr)]
    assert p.channels_last and p.deterministic and tr.meta["cudnn_benchmark"] is True


def test_a_key_names_its_problem_and_a_bad_one_says_why():
    p = cudnn.ConvProblem("backward_weight", "bfloat16", (8, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3), (1, 1),
                          False, (0, 0), 1, channels_last=True, deterministic=False, allow_tf32=False)
    assert cudnn.ConvProblem.from_key(p.key()) == p
    with pytest.raises(ValueError, match="13 fields"):
        cudnn.ConvProblem.from_key("forward|float32")
    with pytest.raises(ValueError, match="unknown direction 'sideways'"):
        cudnn.ConvProblem.from_key("sideways" + p.key()[len("backward_weight"):])


def _table(tr: Trace, sizes: dict[str, int], cc=(8, 0)) -> dict:
    return {"tables": [{"compute_capability": list(cc), "gpu": "NVIDIA A100-SXM4-40GB", "cudnn_version": 90100,
                        "torch_version": "2.13.0", "source": "test", "bytes": sizes}]}


def test_measured_workspaces_are_asked_for_after_their_op_and_freed_at_once(conv_trace, tmp_path):
    (_, fwd0), *_ = _calls(conv_trace)
    stem_wgrad = next(p for _, ps in _calls(conv_trace) for p in ps
                      if p.direction == "backward_weight" and p.weight == (32, 3, 3, 3))
    path = tmp_path / "ws.json"
    path.write_text(json.dumps(_table(conv_trace, {fwd0[0].key(): 3 * MiB, stem_wgrad.key(): 7 * MiB})))
    events, notes = adapt_trace(conv_trace, A100, "2.13.0", environ={cudnn.ENV: str(path)})
    ws = [(i, e) for i, e in enumerate(events) if e.op == CUDNN_WORKSPACE_OP]
    assert [(e.kind, e.bytes, e.phase) for _, e in ws] == [
        (ALLOC, 3 * MiB, "forward"), (FREE, 3 * MiB, "forward"), (ALLOC, 7 * MiB, "backward"), (FREE, 7 * MiB, "backward")]
    first = ws[0][0]
    assert events[first - 1].op == "aten.convolution.default" and events[first + 1].kind == FREE
    assert any("as measured on NVIDIA A100-SXM4-40GB" in n and "for 2 of 8 convolution calls" in n for n in notes)
    # the same trace for a GPU of an architecture no table has (sm_89), or with the setting off: none added
    for gpu, env in ((get_gpu("L40S"), {cudnn.ENV: str(path)}), (A100, {cudnn.ENV: "off"}), (A100, {})):
        events, notes = adapt_trace(conv_trace, gpu, "2.13.0", environ=env)
        assert not any(e.op == CUDNN_WORKSPACE_OP for e in events)
        assert any(n == cudnn.NOT_INCLUDED for n in notes)


def test_cudnn_benchmark_is_said_not_modelled(conv_trace, tmp_path):
    tr = Trace(conv_trace.events, conv_trace.mode, conv_trace.seconds, {**conv_trace.meta, "cudnn_benchmark": True})
    path = tmp_path / "ws.json"
    path.write_text(json.dumps(_table(tr, {k: MiB for _, keys in tr.meta["conv_calls"] for k in keys})))
    events, notes = adapt_trace(tr, A100, "2.13.0", environ={cudnn.ENV: str(path)})
    assert not any(e.op == CUDNN_WORKSPACE_OP for e in events)
    assert any(n.startswith("cudnn.benchmark is on") for n in notes)


def test_a_malformed_table_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tables": [{"compute_capability": [8, 0], "gpu": "x", "bytes": {"forward|x": 1}}]}))
    with pytest.raises(ValueError, match=r"bad.json: table 0 is not a cuDNN workspace table: .*13 fields"):
        cudnn.table_for(A100, {cudnn.ENV: str(bad)})
    with pytest.raises(ValueError, match="XMEM_CUDNN_WORKSPACES: cannot read"):
        cudnn.table_for(A100, {cudnn.ENV: str(tmp_path / "missing.json")})
    other = tmp_path / "other.json"  # some other JSON file: said, not read as no tables
    other.write_text(json.dumps({"bytes": {}}))
    with pytest.raises(ValueError, match="other.json: expected a JSON object with a list of 'tables'"):
        cudnn.table_for(A100, {cudnn.ENV: str(other)})


KEY = "forward|float32|1x3x8x8|4x3x3x3|1x1|1x1|1x1|N|0x0|1|c|any|tf32"


@pytest.mark.parametrize("text, fragment", [
    ('{"tables": [{"compute_capability": [8, 0], "gpu": "x", "bytes": [1, 2]}]}', "'bytes' maps problem keys"),
    ('{"tables": [{"compute_capability": [8, 0], "gpu": "x", "bytes": {"%s": Infinity}}]}' % KEY, "not a whole number"),
    ('{"tables": [{"compute_capability": [8, 0], "gpu": "x", "bytes": {"%s": -4096}}]}' % KEY, "give 0 to"),
    ('{"tables": [{"compute_capability": [8, 0], "gpu": "x", "bytes": {"%s": 1e30}}]}' % KEY, "give 0 to"),
    ('{"tables": [{"compute_capability": [8, 0], "gpu": "x", "bytes": {"%s": true}}]}' % KEY, "not a whole number"),
    ('{"tables": [{"compute_capability": [8], "gpu": "x", "bytes": {}}]}', "not [major, minor]"),
    ('{"tables": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
def test_bad_values_in_a_table_are_named_before_any_trace(tmp_path, text, fragment):
    # issue #36 item 6: these were AttributeError, OverflowError, RecursionError, or accepted
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(cudnn.WorkspaceTableError, match=fragment):
        cudnn.check_setting({cudnn.ENV: str(bad)})


def _step(workspace: int) -> list[TraceEvent]:
    """Activations of 60 MiB freed in backward, then a conv's weight gradient and its workspace:
    the mechanism that made MnasNet's late-backward workspace raise the reserved peak."""
    ev = [TraceEvent(ALLOC, id=i, bytes=60 * MiB, category="activation", op="aten.convolution.default")
          for i in range(5)]
    ev += [TraceEvent(FREE, id=i) for i in range(4)]
    ev += [TraceEvent(ALLOC, id=10, bytes=4096, op="aten.convolution_backward.default", phase="backward"),
           TraceEvent(ALLOC, id=11, bytes=workspace, category="workspace", op=CUDNN_WORKSPACE_OP, phase="backward"),
           TraceEvent(FREE, id=11), TraceEvent(FREE, id=10), TraceEvent(FREE, id=4)]
    return ev


def test_a_workspace_larger_than_any_cached_block_takes_a_new_segment():
    base = simulate(_step(0)[:-3] + [TraceEvent(FREE, id=10), TraceEvent(FREE, id=4)])
    small = simulate(_step(50 * MiB))  # served from a cached 60 MiB block: no more reserved
    big = simulate(_step(200 * MiB))  # no cached block holds it: cudaMalloc, reserved grows
    assert small.peak_reserved_bytes == base.peak_reserved_bytes
    assert big.peak_reserved_bytes == base.peak_reserved_bytes + 200 * MiB


def test_a_workspace_the_device_cannot_give_is_dropped_not_a_failure():
    # near the capacity the allocator first frees its cache and retries, as PyTorch's does: it fits
    tight = simulate(_step(200 * MiB), capacity=320 * MiB)
    assert not tight.oom and tight.workspaces_dropped == 0 and tight.alloc_retries == 1
    capped = simulate(_step(300 * MiB), capacity=320 * MiB)  # and when even that is not enough
    assert not capped.oom and capped.workspaces_dropped == 1 and capped.alloc_retries == 1
    assert capped.final_allocated_bytes == 0  # its free was skipped with it
    # any other request that does not fit still fails the run
    other = [TraceEvent(ALLOC, id=1, bytes=400 * MiB, op="aten.mm.default")]
    assert simulate(other, capacity=320 * MiB).oom


def test_the_estimate_says_when_a_workspace_did_not_fit(conv_trace, tmp_path):
    path = tmp_path / "ws.json"
    keys = [k for _, ks in conv_trace.meta["conv_calls"] for k in ks]
    path.write_text(json.dumps(_table(conv_trace, {k: (60 << 30 if i == 0 else MiB) for i, k in enumerate(keys)})))
    import os

    old = os.environ.get(cudnn.ENV)
    os.environ[cudnn.ENV] = str(path)
    try:
        est = estimate_trace(conv_trace, "A100-40GB")
    finally:
        if old is None:
            os.environ.pop(cudnn.ENV)
        else:
            os.environ[cudnn.ENV] = old
    assert est.fits and not est.oom
    assert any("1 cuDNN workspace measured for this GPU did not fit here" in n for n in est.notes)
    without = estimate_trace(conv_trace, "A100-40GB")
    assert est.peak_reserved_bytes > without.peak_reserved_bytes  # the 1 MiB ones were added


def test_the_measuring_script_runs_on_the_cpu_and_its_tables_install(conv_trace, tmp_path):
    from benchmarks import cudnn_workspaces as cw

    keys = sorted({k for _, ks in conv_trace.meta["conv_calls"] for k in ks})
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps({"problems": {k: ["test"] for k in keys}}))
    out = cw.measure(problems, tmp_path, budget_s=60, dry_run=True)
    dry = json.loads(out.read_text())
    assert dry["errors"] == {} and sorted(dry["tables"][0]["bytes"]) == keys
    with pytest.raises(SystemExit, match="dry run"):
        cw.install(out, tmp_path / "engine.json")
    # a GPU's file (as measure writes it) goes into the engine's tables, by architecture
    measured = tmp_path / "a100.json"
    measured.write_text(json.dumps({**_table(conv_trace, {keys[0]: 5 * MiB}), "errors": {}, "dry_run": False}))
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps(_table(conv_trace, {keys[0]: MiB}, cc=(9, 0))))
    cw.install(measured, engine)
    tables = json.loads(engine.read_text())["tables"]
    assert [t["compute_capability"] for t in tables] == [[8, 0], [9, 0]]
    assert cudnn.table_for(A100, {cudnn.ENV: str(engine)}).bytes == {keys[0]: 5 * MiB}


@pytest.mark.parametrize("command", ["estimate", "sweep"])
def test_a_bad_setting_is_bad_input_before_any_trace(tmp_path, monkeypatch, capsys, command):
    from xmem_engine.cli import main

    script = tmp_path / "step.py"
    script.write_text("raise SystemExit('traced: the setting was not checked first')\n")
    monkeypatch.setenv(cudnn.ENV, str(tmp_path / "missing.json"))
    argv = [command, str(script)] + (["--out", str(tmp_path / "g.csv"), "--quiet"] if command == "sweep" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "XMEM_CUDNN_WORKSPACES: cannot read cuDNN workspace tables" in err and "bug" not in err
    assert "traced" not in err


def test_a_bad_setting_is_a_usage_error_in_the_notebook(ip, tmp_path, monkeypatch):
    from IPython.core.error import UsageError

    monkeypatch.setenv(cudnn.ENV, str(tmp_path / "missing.json"))
    ip.user_ns.pop("touched", None)
    with pytest.raises(UsageError, match="XMEM_CUDNN_WORKSPACES: cannot read"):
        ip.run_cell_magic("xmem", "", "touched = 1\n")
    assert "touched" not in ip.user_ns
