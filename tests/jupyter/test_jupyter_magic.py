"""``%%xmem`` in a real IPython shell: options, namespace semantics, errors, interrupts."""

from __future__ import annotations

import pytest
import torch

IPython = pytest.importorskip("IPython")

STEP = """
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(batch, 64, device="cuda")
model(x).sum().backward()
opt.step()
answer = 42
label = "done"
sizes = [1, 2, 3]
"""


@pytest.fixture()
def ns(ip):
    before = set(ip.user_ns)
    yield ip.user_ns
    for k in set(ip.user_ns) - before:
        ip.user_ns.pop(k, None)


def _run(ip, text):
    return ip.run_cell(text)


def _no_gpu_values(ns: dict) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    for k, v in ns.items():
        if isinstance(v, torch.Tensor):
            assert not isinstance(v, FakeTensor), k
            assert v.device.type != "cuda", k


def test_quiet_one_line_and_namespace(ip, ns, capsys):
    ns["batch"] = 16
    rng = torch.get_rng_state().clone()
    res = _run(ip, "%%xmem --quiet --gpu a100 --gpu T4 -o est\n" + STEP)
    assert res.success, res.error_in_exec
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("xmem: NVIDIA A100-SXM4-40GB: peak") and "Tesla T4" in out[0]
    # what persists: plain values the cell assigned, and -o
    assert ns["answer"] == 42 and ns["label"] == "done" and ns["sizes"] == [1, 2, 3]
    assert ns["est"].gpu == "A100-SXM4-40GB" and ns["est"].fits
    # what does not: the model, the optimizer, tensors of the virtual GPU
    for name in ("model", "opt", "x", "_xmem_iteration"):
        assert name not in ns, name
    _no_gpu_values(ns)
    assert torch.equal(rng, torch.get_rng_state())
    assert not torch._C._is_torch_function_mode_enabled()


def test_existing_objects_keep_their_state(ip, ns):
    ns["batch"] = 4
    ns["counter"] = 7
    net = torch.nn.Linear(4, 4)
    w = net.weight.detach().clone()
    ns["net"] = net
    res = _run(ip, "%%xmem --quiet\nimport torch\nnet.cuda()\ncounter = counter + 1\ny = net(torch.randn(batch, 4, device='cuda'))\n")
    assert res.success, res.error_in_exec
    assert ns["net"] is net and net.weight.device.type == "cpu" and torch.equal(net.weight, w)
    assert ns["counter"] == 8  # a plain value the cell assigned
    assert "y" not in ns


def test_user_error_shows_cell_traceback(ip, ns, capsys):
    # store_history as a kernel runs cells: IPython 9 counts the cell before running it
    res = ip.run_cell("%%xmem --quiet\nx = 1\ny = undefined_name + 1\n", store_history=True)
    assert not res.success and isinstance(res.error_in_exec, NameError)
    tb = res.error_in_exec.__traceback__
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    # the cell's own number, as the notebook shows it (IPython 9 has already counted it)
    assert frames[-1][0] == f"In[{res.execution_count}]" and frames[-1][1] == 3  # line 3 of the cell
    out = capsys.readouterr()
    assert "undefined_name + 1" in out.out + out.err
    assert "x" not in ns or ns.get("x") != 1


def test_keyboard_interrupt_leaves_kernel_usable(ip, ns, capsys):
    ns["batch"] = 2
    rng = torch.get_rng_state().clone()
    res = _run(ip, "%%xmem --quiet\nimport torch\nkept = 5\nt = torch.randn(3, device='cuda')\nraise KeyboardInterrupt\n")
    assert not res.success and isinstance(res.error_in_exec, KeyboardInterrupt)
    assert "kept" not in ns and "t" not in ns
    assert torch.equal(rng, torch.get_rng_state())
    assert not torch._C._is_torch_function_mode_enabled()
    assert not torch.cuda.is_available() or torch.cuda.device_count() >= 0  # torch.cuda answers normally
    # the kernel still works, plain and under xmem
    assert _run(ip, "import torch\nz = torch.ones(2).sum().item()").success and ns["z"] == 2.0
    res = _run(ip, "%%xmem --quiet\n" + STEP)
    assert res.success and ns["answer"] == 42
    assert not isinstance(torch.randn(1), torch._subclasses.fake_tensor.FakeTensor)


def test_line_magic(ip, ns, capsys):
    ns["torch"] = torch
    res = _run(ip, "%xmem --quiet --gpu t4 torch.randn(1024, 1024, device='cuda').sum()")
    assert res.success, res.error_in_exec
    assert capsys.readouterr().out.startswith("xmem: Tesla T4: peak")


def test_usage_errors(ip, ns, capsys):
    for line, words in [("%%xmem --gpu no-such-gpu\nx = 1", "no-such-gpu"),
                        ("%%xmem --max-batch\nx = 1", "--batch-var"),
                        ("%%xmem --batch-var bs\nx = 1", "bs"),
                        ("%%xmem --batch-var bs --batch-values 8:x\nbs = 8", "batch-values"),
                        ("%%xmem --alloc-conf nonsense_option:1\nx = 1", "alloc-conf")]:
        res = _run(ip, line)
        assert not res.success, line
        captured = capsys.readouterr()
        assert words in captured.out + captured.err, (line, captured)


def test_config_and_environment_default_gpu(ip, ns, capsys, monkeypatch):
    monkeypatch.setenv("XMEM_GPU", "T4")
    assert _run(ip, "%%xmem --quiet\nimport torch\na = torch.zeros(10, device='cuda')").success
    assert capsys.readouterr().out.startswith("xmem: Tesla T4:")
    _run(ip, "%xmem_config --gpu h100")
    assert "H100-SXM-80GB" in capsys.readouterr().out
    assert _run(ip, "%%xmem --quiet\nimport torch\na = torch.zeros(10, device='cuda')").success
    assert capsys.readouterr().out.startswith("xmem: NVIDIA H100 80GB HBM3:")
    _run(ip, "%xmem_config --reset")
    capsys.readouterr()


def test_iterations_and_max_batch(ip, ns, capsys):
    res = _run(ip, "%%xmem --quiet --iterations 3 -o est3\nimport torch\nbatch = 8\n"
                   "t = torch.randn(batch, 1 << 18, device='cuda')\n")
    assert res.success, res.error_in_exec
    assert ns["est3"].n_events >= 3 and "_xmem_iteration" not in ns
    res = _run(ip, "%%xmem --quiet --gpu T4 --batch-var batch --max-batch\nimport torch\nbatch = 64\n"
                   "t = torch.empty(batch, 64, 1 << 20, device='cuda')\n")  # 256 MiB per sample
    assert res.success, res.error_in_exec
    out = capsys.readouterr().out
    largest = int(out.strip().rsplit(":", 1)[1])
    assert 40 <= largest <= 60, out  # 14.5 GiB usable minus the context: ~55 samples


def test_help_has_examples(ip):
    doc = ip.find_cell_magic("xmem").__doc__
    assert "%%xmem --gpu" in doc and "--batch-var" in doc and "What persists" in doc


def test_a_syntax_error_in_a_cell_shows_the_line_only(ip):
    from xmem_jupyter.magic import CellSyntaxError

    res = ip.run_cell("%%xmem --quiet\nimport torch\nx = (\n")
    assert not res.success and isinstance(res.error_in_exec, CellSyntaxError)
    lines = res.error_in_exec._render_traceback_()
    assert lines[0].strip().startswith('File "In[') and lines[-1].startswith("SyntaxError")
    assert not any("xmem" in line or "IPython" in line for line in lines)


def test_an_xmem_error_shows_its_message_only(ip):
    """A TracerError (here a call that needs a real GPU) is xmem's message, which names the
    cell's line: IPython shows it without the frames of the magic and the tracer above it."""
    from xmem_engine.tracing import UnsupportedOpError

    res = ip.run_cell("%%xmem --quiet\nimport torch\nh = torch.cuda.current_blas_handle()\n")
    assert not res.success and isinstance(res.error_in_exec, UnsupportedOpError)
    lines = res.error_in_exec._render_traceback_()
    assert len(lines) == 1 and lines[0].startswith("UnsupportedOpError: torch.cuda.current_blas_handle at In[")
    assert "real GPU" in lines[0]


def test_one_result_per_cell_holds_the_widget_and_its_report(ip, ns, monkeypatch):
    """One output: the widget's view and the static report in the same bundle, so a front end
    shows one or the other, never both; a change in the widget updates that same output."""
    import xmem_jupyter.magic as magic
    from xmem_engine.estimate import REPORT_MIME

    shown: list[tuple[dict, str]] = []
    updates: list[dict] = []

    class Handle:
        def __init__(self, display_id: str):
            self.display_id = display_id

        def update(self, obj, raw=False):
            assert raw
            updates.append(obj)

        def close(self):
            pass

    def fake_display(obj, raw=False, display_id=None):
        if isinstance(obj, dict):
            shown.append((obj, "raw" if raw else ""))
        elif hasattr(obj, "_repr_mimebundle_") and type(obj).__name__ == "XmemWidget":
            shown.append((obj._repr_mimebundle_(), "widget"))
        return Handle(str(len(shown)))

    monkeypatch.setattr(magic, "display", fake_display)
    ns["batch"] = 8
    res = _run(ip, "%%xmem --gpu T4 -o est\n" + STEP)
    assert res.success, res.error_in_exec
    results = [b for b, how in shown if "application/vnd.jupyter.widget-view+json" in b or REPORT_MIME in b]
    assert len(results) == 1, [list(b) for b, _ in shown]
    bundle = results[0]
    assert set(bundle) == {"application/vnd.jupyter.widget-view+json", REPORT_MIME, "text/html", "text/plain"}
    assert bundle["text/plain"].startswith("xmem: Tesla T4: peak")
    model_id = bundle["application/vnd.jupyter.widget-view+json"]["model_id"]
    from ipywidgets.widgets.widget import _instances  # ipywidgets 8: live widgets by model id

    widget = _instances[model_id]
    widget.gpu_dropdown.value = widget.gpu_dropdown.options[-1][1]
    assert updates and updates[-1]["application/vnd.jupyter.widget-view+json"]["model_id"] == model_id
    assert updates[-1][REPORT_MIME]["gpu"] == widget.est.gpu != "T4"


DDP_CELL = """
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
ddp = DDP(nn.Linear(1024, 1024).cuda(), device_ids=[local_rank])
ddp(torch.randn(8, 1024, device="cuda")).sum().backward()
seen = (dist.get_world_size(), dist.get_rank(), local_rank)
"""


def test_world_size_traces_one_rank_and_leaves_no_group(ip, ns, capsys):
    import os

    import torch.distributed as dist

    res = _run(ip, "%%xmem --quiet --gpu a100 --world-size 16 --rank 9 -o est\n" + DDP_CELL)
    assert res.success, res.error_in_exec
    assert capsys.readouterr().out.strip().endswith("(rank 9 of 16)")
    assert ns["seen"] == (16, 9, 1)
    assert ns["est"].world == {"size": 16, "rank": 9, "gpus_per_node": 8}
    assert "rank 9 of 16" in ns["est"].headline
    assert ns["est"].breakdown.get("communication", 0) > 0 or any(
        e.category == "communication" for e in ns["est"].trace.events)
    assert not dist.is_initialized() and "LOCAL_RANK" not in os.environ
    res = _run(ip, "%%xmem --quiet --rank 2\nx = 1")
    assert not res.success and "--rank needs --world-size" in str(res.error_in_exec)
