"""The environment read one way by every front end (``xmem_engine/inputs.py``, issue #33):
``XMEM_GPU`` a list everywhere, ``PYTORCH_ALLOC_CONF`` before ``PYTORCH_CUDA_ALLOC_CONF`` as
PyTorch reads them. Each of these disagreed between the CLI, the sweep and ``%%xmem``."""

from __future__ import annotations

from xmem_engine.inputs import DEFAULT_GPU, default_gpus, env_alloc_conf, env_gpus

BOTH = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}


def test_readings():
    assert env_gpus({"XMEM_GPU": " T4, L4 ,"}) == ["T4", "L4"]
    assert env_gpus({}) == [] and default_gpus({}) == [DEFAULT_GPU]
    assert env_alloc_conf(BOTH) == ("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert env_alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})[1] == "max_split_size_mb:64"
    assert env_alloc_conf({"PYTORCH_ALLOC_CONF": ""}) == ("", "")


def test_the_notebook_reads_the_allocator_setting_as_pytorch_does(monkeypatch):
    from xmem_engine.simulation.alloc_conf import AllocatorConfig
    from xmem_jupyter.config import Config

    for name, value in BOTH.items():
        monkeypatch.setenv(name, value)
    assert Config().default_alloc_conf() == "expandable_segments:True"
    assert AllocatorConfig.from_env().expandable_segments  # the CLI's reading, the same


def test_a_sweep_reads_the_newer_variable_too(tmp_path, monkeypatch):
    from xmem_engine.sweep.grid import make_grid

    script = tmp_path / "s.py"
    script.write_text("import torch\nx = torch.ones(4, device='cuda')\n")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    grid = make_grid([str(script)], ["T4"])
    assert grid.alloc_confs == ["expandable_segments:True"]


def test_xmem_estimate_takes_the_first_gpu_xmem_gpu_lists(tmp_path, monkeypatch, capsys):
    from xmem_engine.cli import main

    script = tmp_path / "tiny.py"
    script.write_text("import torch\nx = torch.ones(4, device='cuda')\n")
    monkeypatch.setenv("XMEM_GPU", "T4,L4")
    assert main(["estimate", str(script), "--json"]) == 0
    assert '"Tesla T4"' in capsys.readouterr().out
