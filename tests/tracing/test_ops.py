"""One registry of the ops xmem models (``tracing/ops.py``, issue #33): every rule table
registers into it, and ``xmem ops`` answers "which ops are modelled?"."""

from __future__ import annotations

import json

import pytest

import xmem_engine.tracing  # noqa: F401 - registers every rule table
from xmem_engine.tracing import alloc_mode
from xmem_engine.tracing.fake import fake_fastpaths, guesses, out_metas, shadow_values, sparse_entries, value_rules
from xmem_engine.tracing.kernels import autocast_policy, convolutions, cuda_dtypes, cuda_temporaries, grad_accumulation
from xmem_engine.tracing.ops import KINDS, op_label, register, rules
from xmem_engine.tracing.shims import bitsandbytes_shim

TABLES = [
    (cuda_temporaries.RULES, "cuda temporaries"), (grad_accumulation.SCATTERS, "in-place backward"),
    (convolutions.OPS, "cudnn convolution"), (autocast_policy.POLICY, "autocast"),
    (fake_fastpaths.FAST_FAKE, "fake fast path"), (guesses.BOUNDS, "size bound"),
    (value_rules.ONES_REDUCTIONS, "guessed value"), (value_rules.UNEQUAL, "guessed value"),
    (out_metas.OUT_OVERLOADS, "meta kernel"), (alloc_mode.HOST_OUTPUTS, "host output"),
    (shadow_values._SHADOW_KERNELS, "known value"), (bitsandbytes_shim.CUDA_COMPOSITES, "cuda composite"),
    (cuda_dtypes.RULES, "cuda dtype"), (sparse_entries.RULES, "sparse entries"),
]


@pytest.mark.parametrize("table,kind", TABLES, ids=[k for _, k in TABLES])
def test_every_rule_of_every_table_is_registered(table, kind):
    registered = {r.op for r in rules(kind)}
    assert {op_label(op) for op in table} <= registered


def test_rules_name_ops_as_torch_prints_them_and_their_module():
    by_op = {(r.op, r.kind): r for r in rules()}
    softmax = by_op[("aten._softmax.default", "cuda temporaries")]
    assert softmax.module == "xmem_engine.tracing.kernels.cuda_temporaries" and softmax.rule == "contiguous_input"
    assert ("torch.nn.functional.scaled_dot_product_attention", "torch function") in by_op
    assert ("aten.nonzero.default", "size bound") in by_op
    assert ("aten._scaled_mm.out", "meta kernel") in by_op
    assert all(r.kind in KINDS for r in by_op.values())


def test_a_rule_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kind"):
        register("magic", {"aten.add.Tensor": None}, __name__)


def test_xmem_ops(capsys):
    from xmem_engine.cli import main

    assert main(["ops", "--kind", "size bound", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rules"] and {r["kind"] for r in out["rules"]} == {"size bound"}
    assert main(["ops", "--grep", "softmax"]) == 0
    assert "aten._softmax.default" in capsys.readouterr().out
    assert main(["ops", "--kind", "nope"]) == 2
    assert "one of autocast" in capsys.readouterr().err
