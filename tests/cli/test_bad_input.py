"""Bad input everywhere: each case a user (or a hostile file) can give the CLI, the engine and
the notebook, with the error it gets. Exit codes mean one thing each: 0 fits, 3 does not fit,
2 bad input (before any tracing), 1 the script failed or xmem itself failed."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xmem_engine.cli import REPORT_HINT, main
from xmem_engine.estimate import BatchSearch, max_batch
from xmem_engine.gpus import GPUCatalogError, UnknownGPUError, get_gpu, load_catalog
from xmem_engine.simulation.allocator import CachingAllocator

MARK = "SCRIPT-RAN"  # printed by the scripts below: proves whether tracing started


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own checks (--torch, --capacity): usage and reason
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.py"
    p.write_text("import torch\nbatch_size = 8\nknob = 1\nprint('SCRIPT-RAN')\n"
                 "m = torch.nn.Linear(64, 64).cuda()\nx = torch.randn(batch_size, 64, device='cuda')\n"
                 "m(x).sum().backward()\n")
    return p


# --------------------------------------------------------------------------- --max-batch
class _Est:
    def __init__(self, fits: bool, peak: int):
        self.fits, self.peak_allocated_bytes = fits, peak


def test_max_batch_says_when_memory_does_not_follow_the_variable():
    search = max_batch(lambda v: _Est(True, 1000), start=8)
    assert search.unbounded == "independent" and search.tried == [8, 16, 32]
    assert "fits at any batch" in search.describe("batch", "T4")


def test_max_batch_says_when_it_stops_at_its_limit():
    search = max_batch(lambda v: _Est(True, v), start=1, limit=64)
    assert (search.value, search.unbounded) == (64, "limit")
    assert "at least 64" in search.describe("batch", "T4")
    best, est = search  # unpacks as (value, estimate)
    assert best == 64 and est.peak_allocated_bytes == 64


def test_a_real_mode_search_stays_within_reach_of_its_start():
    class _Real(_Est):
        mode = "real"  # every larger value would hold real CPU tensors

    search = max_batch(lambda v: _Real(True, v), start=8)
    assert (search.value, search.unbounded, search.limit) == (8 * 16, "limit", 8 * 16)
    assert search.answer() == "at least 128"


def test_max_batch_searches_far_above_any_gpu():
    answer = 3 << 30  # a variable whose memory grows by ~1 byte a step
    search = max_batch(lambda v: _Est(v <= answer, v), start=1)
    assert search.value == answer and not search.unbounded


def test_cli_max_batch_of_a_variable_memory_does_not_follow(tiny: Path):
    code, out, _ = run("estimate", tiny, "--gpu", "T4", "--max-batch", "knob", "--json")
    res = json.loads(out)
    assert code == 0 and res["unbounded"] == "independent" and res["max_value"] is None
    code, out, _ = run("estimate", tiny, "--gpu", "T4", "--max-batch", "knob")
    assert "does not change the step's memory" in out and "largest knob that fits" not in out


def test_max_batch_refuses_a_variable_it_cannot_search(tiny: Path, tmp_path: Path):
    f = tmp_path / "s.py"
    f.write_text("bs = 'big'\n")
    code, _, err = run("estimate", f, "--max-batch", "bs")
    assert code == 2 and "positive integer" in err
    code, _, err = run("estimate", tiny, "--max-batch", "batch_size", "--set", "batch_size=4")
    assert code == 2 and "drop one of them" in err


# --------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("status", [3, 5, "boom"])
def test_a_scripts_own_exit_is_a_script_failure(tmp_path: Path, status):
    f = tmp_path / "s.py"
    f.write_text(f"import sys\nsys.exit({status!r})\n")
    code, out, err = run("estimate", f)
    assert code == 1 and f"exited with status {status}" in err
    code, out, _ = run("estimate", f, "--json")
    res = json.loads(out)
    assert code == 1 and res["error"] == "script_failed" and res["script_exit_status"] == status


def test_xmem_failures_are_xmems_not_the_scripts(tiny: Path, monkeypatch):
    import xmem_engine.estimate as estimate_mod

    # a simulator that breaks (a C function, so no frame of this test file counts as the user's)
    monkeypatch.setattr(estimate_mod, "simulate", {}.__getitem__)
    code, out, err = run("estimate", tiny, "--json")
    assert code == 1 and "xmem failed: TypeError" in err and REPORT_HINT in err
    assert "tiny.py raised" not in err and json.loads(out)["error"] == "xmem_failed"


@pytest.mark.parametrize("flag,value,words", [
    ("--torch", "1.0", "outside the releases xmem models"),
    ("--torch", "99.1", "outside the releases xmem models"),
    ("--torch", "x.y", "cannot read a PyTorch version"),
    ("--alloc-conf", "backend:cudaMallocAsync", "bypasses PyTorch's caching allocator"),
    ("--alloc-conf", "max_split_size_mb:oops", "max_split_size_mb"),
    ("--gpu", "", "empty GPU name"),
    ("--gpu", "A1OO", "A1OO"),
    ("--iterations", "0", "at least 1"),
    ("--set", "batch_size", "VAR=VALUE"),
    ("--set", "nope=3", "no top-level assignment to nope"),
])
def test_bad_flags_are_refused_before_the_script_runs(tiny: Path, flag, value, words):
    code, out, err = run("estimate", tiny, flag, value)
    assert code == 2 and words in err and MARK not in out + err
    assert "Traceback" not in err  # one line naming the input, no frames of xmem's


def test_a_negative_batch_says_so_as_torch_would(tiny: Path):
    code, _, err = run("estimate", tiny, "--set", "batch_size=-1")
    assert code == 1 and "negative dimension -1" in err and "Expected cond" not in err


def test_a_syntax_error_shows_the_line_not_xmem(tmp_path: Path):
    f = tmp_path / "s.py"
    f.write_text("import torch\nx = (\n")
    for cmd in ("estimate", "trace"):
        extra = ["--events", str(tmp_path / "e.jsonl")] if cmd == "trace" else []
        code, _, err = run(cmd, f, *extra)
        assert code == 1 and "SyntaxError" in err and "line 2" in err
        assert "xmem_engine" not in err and "Traceback" not in err


def test_nothing_on_cuda_is_noted(tmp_path: Path):
    f = tmp_path / "s.py"
    f.write_text("import torch\nx = torch.randn(4, 3)\n")
    code, out, _ = run("estimate", f)
    assert code == 0 and "put nothing on cuda" in out


# --------------------------------------------------------------------------- output files
def test_outputs_never_overwrite_the_script_or_an_existing_file(tiny: Path, tmp_path: Path):
    before = tiny.read_text()
    for argv in (["estimate", tiny, "--snapshot", tiny], ["estimate", tiny, "--events", tiny],
                 ["trace", tiny, "--events", tiny]):
        code, out, err = run(*argv)
        assert code == 2 and "that is the input" in err and MARK not in out + err
    assert tiny.read_text() == before
    code, out, err = run("estimate", tiny, "--events", tmp_path / "missing" / "e.jsonl")
    assert code == 2 and "does not exist" in err and MARK not in out + err
    existing = tmp_path / "e.jsonl"
    existing.write_text("keep me")
    code, _, err = run("estimate", tiny, "--events", existing)
    assert code == 2 and "--force" in err and existing.read_text() == "keep me"
    code, _, _ = run("estimate", tiny, "--events", existing, "--force")
    assert code == 0 and existing.read_text().startswith("{")


# --------------------------------------------------------------------------- xmem simulate
GOOD = {"kind": "alloc", "id": 1, "bytes": 4096, "stream": 0}


@pytest.mark.parametrize("lines,words", [
    ([{**GOOD, "bytes": -4096}], "'bytes' from 0"),
    ([{**GOOD, "bytes": 4096.0}], "whole number"),
    ([{**GOOD, "bytes": "4096"}], "whole number"),
    (['{"kind": "alloc", "id": 1, "bytes": NaN}'], "whole number"),
    ([{**GOOD, "bytes": 10**20}], "1 PiB"),
    ([{**GOOD, "bytes": 1e20}], "whole number"),
    (["[1, 2, 3]"], "JSON object"),
    ([{"kind": "alloc", "bytes": 10}], "needs an 'id'"),
    ([{"kind": "alloc", "id": 1}], "needs 'bytes'"),
    ([GOOD, GOOD], "allocated again while still live"),
    ([{"kind": "free", "id": 9}], "not live"),
    ([{**GOOD, "stream": 1.5}], "'stream' must be a whole number"),
    ([{**GOOD, "stream": -1}], "'stream' must be >= 0"),
    ([{**GOOD, "shape": "big"}], "'shape'"),
    (["not json"], "not a trace event"),
])
def test_simulate_validates_every_event(tmp_path: Path, lines, words):
    f = tmp_path / "e.jsonl"
    f.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    code, _, err = run("simulate", f)
    assert code == 2 and words in err and f"{f}:" in err and "Traceback" not in err


@pytest.mark.parametrize("capacity", ["1e400", "nan", "-5GiB", "0", "lots", "2e15GiB"])
def test_simulate_refuses_impossible_capacities(tmp_path: Path, capacity):
    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps(GOOD) + "\n")
    code, _, err = run("simulate", f, "--capacity", capacity)
    assert code == 2 and "--capacity" in err


@pytest.mark.parametrize("size", [-1, 512.0, "512", 1 << 51, True, None])
def test_the_allocator_refuses_impossible_requests(size):
    with pytest.raises(ValueError, match="whole number of bytes"):
        CachingAllocator().malloc(size)


# --------------------------------------------------------------------------- xmem replay
EV = {"action": "alloc", "addr": 0, "size": 512, "stream": 0}


@pytest.mark.parametrize("snap,words", [
    ({"segments": [[1, 2, 3]]}, "segments[0]: expected a segment"),
    ({"segments": [{"address": 0, "stream": 0, "blocks": []}]}, "no 'total_size'"),
    ({"segments": [{"address": 0, "total_size": 2 << 20, "stream": 0, "blocks": [None]}]}, "blocks[0]"),
    ({"segments": [], "device_traces": [[None]]}, "device_traces[0][0]: expected an event"),
    ({"segments": [], "device_traces": [[{**EV, "size": 10**20}]]}, "device_traces[0][0].size"),
    ({"segments": [], "device_traces": [[{**EV, "action": "teleport"}]]}, "device_traces[0][0].action"),
    ({"segments": [], "device_traces": [{}]}, "device_traces[0]: expected a list"),
    ({"segments": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "foo:bar"}}, "allocator_settings"),
    ({"segments": {}}, "segments"),
    ([1, 2], "not a memory snapshot"),
])
def test_replay_validates_every_field(tmp_path: Path, snap, words):
    f = tmp_path / "s.pickle"
    f.write_bytes(pickle.dumps(snap))
    code, _, err = run("replay", f, "--check")
    assert code == 2 and words in err and "Traceback" not in err


# --------------------------------------------------------------------------- the catalog
def _gpu_toml(**fields) -> str:
    base = {"name": "My GPU", "total_memory_bytes": 8 << 30, "compute_capability": "8.6", "sm_count": 10,
            "cublas_workspace_bytes": 8_519_680, "context_bytes": 300 << 20}
    base.update(fields)
    return "[gpus.MINE]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items())


@pytest.mark.parametrize("fields,words", [
    ({"context_bytes": 8 << 30}, "leave nothing of total_memory_bytes"),
    ({"context_bytes": (8 << 30) - (10 << 20)}, "kernel_bytes"),  # the default kernels do not fit
    ({"name": "  "}, "must not be empty"),
])
def test_the_catalog_refuses_impossible_gpus(tmp_path: Path, fields, words):
    f = tmp_path / "gpus.toml"
    f.write_text(_gpu_toml(**fields))
    with pytest.raises(GPUCatalogError, match=words):
        load_catalog(f)
    code, _, err = run("gpus", "--file", f)
    assert code == 2 and words in err


def test_an_empty_gpu_name_is_not_the_default():
    with pytest.raises(UnknownGPUError, match="empty GPU name"):
        get_gpu("")


# --------------------------------------------------------------------------- properties
# Random and mutated inputs to every parser: never a traceback, only the documented exits.
FAST = settings(max_examples=int(__import__("os").environ.get("XMEM_HYPOTHESIS_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _no_traceback(code: int, err: str, allowed: tuple[int, ...]) -> None:
    assert code in allowed, err
    assert "Traceback" not in err and "xmem failed" not in err, err


@FAST
@given(st.text(max_size=40))
def test_set_values_never_crash(text):
    from xmem_engine.overrides import OverrideError, apply_overrides, parse_overrides
    import ast

    try:
        ov = parse_overrides([text])
        apply_overrides(ast.parse("knob = 1\nbatch = 2\n"), ov, "s.py")
    except OverrideError:
        pass


@FAST
@given(st.text(alphabet=st.sampled_from(list("abcdefgimnoprstuxz_:,.0123456789 TrueFals>[]")), max_size=60))
def test_alloc_conf_strings_never_crash(tmp_path_factory, text):
    f = tmp_path_factory.mktemp("ac") / "e.jsonl"
    f.write_text(json.dumps(GOOD) + "\n")
    code, _, err = run("simulate", f, "--alloc-conf", text)
    _no_traceback(code, err, (0, 2, 3))


_json_value = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=3), max_leaves=6)
_event = st.fixed_dictionaries({"kind": st.sampled_from(["alloc", "free", "record_stream", "phase", "iteration",
                                                         "empty_cache", "reset_peak", "bogus"])},
                                optional={"id": st.one_of(st.integers(-2, 4), _json_value),
                                          "bytes": st.one_of(st.integers(-10, 1 << 52), _json_value),
                                          "stream": st.one_of(st.integers(-1, 3), _json_value),
                                          "streams": _json_value, "shape": _json_value, "phase": _json_value})


@FAST
@given(st.lists(st.one_of(_event, _json_value), max_size=8))
def test_event_files_never_crash(tmp_path_factory, lines):
    f = tmp_path_factory.mktemp("ev") / "e.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code, _, err = run("simulate", f, "--capacity", "1GiB")
    _no_traceback(code, err, (0, 2, 3))


_seg = st.fixed_dictionaries({}, optional={
    "address": st.one_of(st.integers(-1, 1 << 40), _json_value), "total_size": st.integers(-1, 1 << 30),
    "stream": st.integers(-1, 2), "segment_type": st.sampled_from(["small", "large", 3]),
    "blocks": st.lists(st.fixed_dictionaries({}, optional={
        "address": st.integers(-1, 1 << 40), "size": st.integers(-1, 1 << 30),
        "state": st.sampled_from(["active_allocated", "inactive", 7]), "requested_size": st.integers(-1, 1 << 30)}),
        max_size=3)})
_trace_event = st.fixed_dictionaries({"action": st.sampled_from(
    ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "bogus"])}, optional={
    "addr": st.integers(-1, 1 << 40), "size": st.integers(-1, 1 << 52), "stream": st.integers(-1, 2)})


@FAST
@given(st.fixed_dictionaries({"segments": st.lists(_seg, max_size=3)}, optional={
    "device_traces": st.lists(st.lists(st.one_of(_trace_event, _json_value), max_size=6), max_size=2),
    "allocator_settings": st.one_of(_json_value, st.fixed_dictionaries(
        {"PYTORCH_CUDA_ALLOC_CONF": st.sampled_from(["", "expandable_segments:True", "bad", 5])}))}))
def test_snapshots_never_crash(tmp_path_factory, snap):
    f = tmp_path_factory.mktemp("sn") / "s.pickle"
    f.write_bytes(pickle.dumps(snap))
    code, _, err = run("replay", f, "--check")
    _no_traceback(code, err, (0, 2, 3))


@FAST
@given(st.dictionaries(st.sampled_from(["name", "total_memory_bytes", "compute_capability", "sm_count",
                                        "cublas_workspace_bytes", "context_bytes", "kernel_bytes", "aliases",
                                        "nvidia_smi_memory_mib", "bogus"]),
                       st.one_of(st.integers(-5, 1 << 40), st.text(max_size=6), st.booleans(),
                                 st.lists(st.text(max_size=4), max_size=2)), max_size=7),
       st.sampled_from(["MINE", "T4", ""]))
def test_catalog_files_never_crash(tmp_path_factory, fields, key):
    f = tmp_path_factory.mktemp("cat") / "gpus.toml"
    f.write_text(f"[gpus.{json.dumps(key)}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items()))
    code, _, err = run("gpus", "--file", f)
    _no_traceback(code, err, (0, 2))


def test_a_search_result_is_plain_data():
    s = BatchSearch(4, None, "", 8, [1, 2, 4])
    assert list(s) == [4, None] and s.describe("b", "T4") == "largest b that fits on T4: 4"


def test_settings_from_the_environment_name_their_variable(tmp_path, monkeypatch, capsys):
    # issue #36 item 8: an error from an environment variable did not say which variable
    from xmem_engine.cli import main

    script = tmp_path / "tiny.py"
    script.write_text("import torch\nx = torch.ones(4, device='cuda')\n")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:abc")
    assert main(["estimate", str(script)]) == 2
    assert "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb" in capsys.readouterr().err
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("XMEM_GPU", "no-such-gpu")
    assert main(["estimate", str(script)]) == 2
    assert "XMEM_GPU: Unknown GPU 'no-such-gpu'" in capsys.readouterr().err
    monkeypatch.delenv("XMEM_GPU")
    monkeypatch.setenv("XMEM_CACHE_MAX_MB", "1GB")  # refused before tracing, not at the script's first compile
    assert main(["estimate", str(script)]) == 2
    assert "XMEM_CACHE_MAX_MB='1GB': expected the compile cache's size limit in MiB" in capsys.readouterr().err


@pytest.mark.parametrize("conf", ["max_split_size_mb:100000000000000000000000", "max_split_size_mb:-5",
                                  "max_non_split_rounding_mb:18446744073709551616"])
def test_allocator_sizes_beyond_a_size_t_are_refused_as_pytorch_refuses_them(conf):
    from xmem_engine.simulation.alloc_conf import AllocConfError, parse_alloc_conf

    with pytest.raises(AllocConfError, match="out of range"):
        parse_alloc_conf(conf)
    assert parse_alloc_conf("max_split_size_mb:18446744073709551615").max_split_size == (2**64 - 1) // 2**20 * 2**20


def test_every_rank_of_a_huge_world_is_refused_before_tracing(tmp_path, capsys):
    # issue #36 item 8: --world-size 100000 --rank all started 100k traces with no word
    from xmem_engine.cli import main

    script = tmp_path / "tiny.py"
    script.write_text("raise AssertionError('must not run')\n")
    assert main(["estimate", str(script), "--world-size", "100000", "--rank", "all"]) == 2
    assert "100,000 traces" in capsys.readouterr().err


_KEY = "forward|float32|1x3x8x8|4x3x3x3|1x1|1x1|1x1|N|0x0|1|c|any|tf32"
_size = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                  st.text(max_size=4), st.none(), st.lists(st.integers(), max_size=2))


@FAST
@given(st.one_of(
    st.fixed_dictionaries({"tables": st.lists(st.fixed_dictionaries({
        "compute_capability": st.one_of(st.just([8, 0]), _json_value), "gpu": st.one_of(st.just("x"), _json_value),
        "bytes": st.one_of(st.dictionaries(st.just(_KEY), _size, max_size=1), _json_value)}), max_size=2)}),
    _json_value), st.integers(0, 3000))
def test_cudnn_tables_never_crash(tmp_path_factory, table, depth):
    # issue #36: types, huge and negative sizes, and nesting depth in XMEM_CUDNN_WORKSPACES
    from xmem_engine.gpus.cudnn import WorkspaceTableError, check_setting

    f = tmp_path_factory.mktemp("cudnn") / "t.json"
    text = json.dumps(table)
    f.write_text("[" * depth + text + "]" * depth)
    try:
        tables = check_setting({"XMEM_CUDNN_WORKSPACES": str(f)})
    except WorkspaceTableError:
        return
    for t in tables:
        assert all(type(v) is int and 0 <= v <= 1 << 50 for v in t.bytes.values())


@FAST
@given(st.integers(1, 5000), st.sampled_from(["[", "{x = "]))
def test_catalog_nesting_never_crashes(tmp_path_factory, depth, opener):
    closer = "]" if opener == "[" else "}"
    f = tmp_path_factory.mktemp("cat") / "gpus.toml"
    f.write_text("[gpus.X]\naliases = " + opener * depth + closer * depth + "\n")
    try:
        load_catalog(f)
    except GPUCatalogError:
        pass


def test_a_batch_larger_than_the_data_ends_the_search():
    """A 32-row dataset: above 32 every step gets all of it, paired and padded a little
    differently each time (TRL's KTO at 32, 64, 128, 256: 6.21, 6.09, 6.21, 6.29 GB). The
    search used to double to its limit, 2**40, tracing 40 batch sizes for 6 minutes."""
    wobble = {32: 6.21e9, 64: 6.09e9, 128: 6.21e9, 256: 6.29e9}
    search = max_batch(lambda v: _Est(True, wobble.get(v, v * 0.19e9)), start=32)
    assert search.unbounded == "independent" and search.tried == [32, 64, 128, 256]
    assert "larger than the dataset" in search.describe("per_device_train_batch_size", "T4")
    # memory that follows the batch, however little per sample, rises at every doubling
    search = max_batch(lambda v: _Est(v <= 5000, 6e9 + v), start=32)
    assert (search.value, search.unbounded) == (5000, "")
