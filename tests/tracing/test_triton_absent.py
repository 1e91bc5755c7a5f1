"""Where Triton is not installed (a CPU build of torch): the fallbacks taken, and a failed
import of Triton, are said with what to do. Triton's absence is made here by ``sys.modules``
(``None`` halts an import, as a missing package does), so the tests run in every environment;
the measured case, TRL's QLoRA on the CPU wheel, is in benchmarks/HISTORY.md."""

from __future__ import annotations

import sys
import types

import pytest

from xmem_engine.tracing import trace
from xmem_engine.tracing.shims.triton_absent import FALLBACKS

STEP = """
import torch
x = torch.randn(64, 64, device="cuda", requires_grad=True)
(x @ x).sum().backward()
"""


@pytest.fixture
def no_triton(monkeypatch):
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)


def test_a_library_that_fell_back_for_want_of_triton_is_named(no_triton, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl.kernels.chunked_logprob", types.ModuleType("trl.kernels.chunked_logprob"))
    notes = trace(STEP, {}, mode="fake").meta.get("notes", [])
    said = [n for n in notes if n.startswith("Triton is not installed here")]
    assert len(said) == 1 and FALLBACKS["trl.kernels.chunked_logprob"] in said[0] and "pip install triton" in said[0]


def test_nothing_is_said_without_such_a_library(no_triton, monkeypatch):
    for name in FALLBACKS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    notes = trace(STEP, {}, mode="fake").meta.get("notes", [])
    assert not [n for n in notes if "Triton is not installed" in n]


def test_a_script_that_cannot_import_triton_is_told_how_to_go_on(no_triton):
    with pytest.raises(ModuleNotFoundError) as info:
        trace("import torch\nimport triton\n", {}, mode="fake")
    said = "\n".join(getattr(info.value, "__notes__", [])) or str(info.value)
    assert "Triton is not installed here" in said and "pip install triton" in said
