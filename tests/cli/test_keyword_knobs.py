"""Knobs written as keyword arguments: ``SFTConfig(per_device_train_batch_size=4)``,
``DataLoader(ds, batch_size=64)``. Fine-tuning scripts keep their batch size in a trainer's
config, not in a variable; ``--set``, ``--max-batch``, sweeps, the advisor and the widget's
slider change it there (``xmem_engine/overrides.py``)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from xmem_engine.overrides import batch_var_in
from xmem_engine.overrides import (NO_VALUE, OverrideError, apply_overrides, keyword_value, positive_int_value,
                                   rewrite_source)

TRAINER = textwrap.dedent("""\
    from types import SimpleNamespace as Config
    args = Config(output_dir="out",
                  per_device_train_batch_size=4,  # per GPU
                  per_device_eval_batch_size=4,
                  gradient_accumulation_steps=2)
    def main():
        return Config(per_device_train_batch_size=4, learning_rate=2e-4)
    other = main()
""")


def test_set_changes_every_literal_keyword_in_place() -> None:
    out, found = rewrite_source(TRAINER, {"per_device_train_batch_size": "16"})
    assert found == {"per_device_train_batch_size"}
    lines = out.splitlines()
    assert lines[2] == "              per_device_train_batch_size=16,  # per GPU"  # the comment stays
    assert lines[3] == "              per_device_eval_batch_size=4,"  # another knob: untouched
    assert lines[6] == "    return Config(per_device_train_batch_size=16, learning_rate=2e-4)"  # inside a function
    assert out.count("\n") == TRAINER.count("\n")
    ns: dict = {}
    exec(compile(apply_overrides(ast.parse(TRAINER), {"per_device_train_batch_size": "16"}, "s.py"), "s.py", "exec"),
         ns)
    assert ns["args"].per_device_train_batch_size == ns["other"].per_device_train_batch_size == 16


def test_an_assignment_wins_and_a_variable_keyword_is_not_a_site() -> None:
    src = "batch_size = 8\nloader = dict(batch_size=32)\nother = dict(batch_size=batch_size)\n"
    out, _ = rewrite_source(src, {"batch_size": "64"})
    assert out == "batch_size = 64\nloader = dict(batch_size=32)\nother = dict(batch_size=batch_size)\n"
    with pytest.raises(OverrideError, match=r"no top-level assignment to bs and no call with bs=<a literal>"):
        apply_overrides(ast.parse("n = 4\nx = dict(bs=n)\n"), {"bs": "8"}, "s.py")


def test_values_that_differ_are_not_one_knob(tmp_path: Path) -> None:
    tree = ast.parse("a = dict(batch_size=32)\nb = dict(batch_size=1000)\nc = dict(lr=1)\n")
    with pytest.raises(OverrideError, match=r"batch_size= different values \(32 at line 1, 1000 at line 2\)"):
        keyword_value(tree, "batch_size")
    assert keyword_value(tree, "lr") == 1 and keyword_value(tree, "nope") is NO_VALUE
    script = tmp_path / "s.py"
    script.write_text(TRAINER)
    assert positive_int_value(script, "per_device_train_batch_size") == 4  # --max-batch starts there
    script.write_text("x = dict(bs=0)\n")
    with pytest.raises(OverrideError, match="positive integer"):
        positive_int_value(script, "bs")


@pytest.mark.parametrize("source, expected", [
    (TRAINER, "per_device_train_batch_size"),
    ("loader = dict(batch_size=64)\n", "batch_size"),
    ("batch = 8\nloader = dict(batch_size=64)\n", "batch"),  # an assigned name wins over a keyword
    ("a = dict(batch_size=32)\nb = dict(batch_size=1000)\n", None),  # which one is the batch?
    ("a = dict(batch_size=32, per_device_train_batch_size=4)\n", None),
    ("a = dict(batch_size=n)\n", None),
])
def test_the_batch_name_is_inferred_from_a_keyword(source: str, expected: str | None) -> None:
    assert batch_var_in(source) == expected


SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    def main():
        data = TensorDataset(torch.randn(2048, 1024), torch.randint(0, 10, (2048,)))
        loader = DataLoader(data, batch_size=16, shuffle=True)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == 1:
                break

    if __name__ == "__main__":
        main()
""")


def test_the_cli_sets_a_dataloaders_batch_size(tmp_path: Path) -> None:
    from xmem_engine.estimate import estimate_script

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    small = estimate_script(str(script), "T4", overrides={"batch_size": "16"})
    big = estimate_script(str(script), "T4", overrides={"batch_size": "1024"})
    # the input batch and its activations: 1,024 - 16 rows of 1,024 + 4,096 x 2 floats more at least
    assert big.peak_allocated_bytes - small.peak_allocated_bytes > (1024 - 16) * (1024 + 2 * 4096) * 4
    assert (1024, 1024) in {e.shape for e in big.trace.events if e.op == "aten._to_copy.default"}


def test_a_name_of_a_tuple_assignment_is_a_knob(tmp_path: Path) -> None:
    """``batch, seq_len = 4, 1024`` (``B, T = 4, 32`` in nanoGPT-style code): ``--set``, the
    slider and the batch-name inference reach the one element."""
    src = "import math\nbatch, seq_len = 4, 1024  # tokens\nx = (batch, seq_len)\n"
    out, found = rewrite_source(src, {"batch": "16"})
    assert found == {"batch"} and out.splitlines()[1] == "batch, seq_len = 16, 1024  # tokens"
    ns: dict = {}
    exec(compile(apply_overrides(ast.parse(src), {"seq_len": "64"}, "s.py"), "s.py", "exec"), ns)
    assert ns["x"] == (4, 64)
    assert batch_var_in(src) == "batch"
    script = tmp_path / "s.py"
    script.write_text(src)
    assert positive_int_value(script, "seq_len") == 1024
    assert batch_var_in("batch, n = f()\n") is None  # no literal to set
