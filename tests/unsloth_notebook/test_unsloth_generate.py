"""Unsloth's fast decoding under ``generate()`` (the end of its notebooks:
``FastLanguageModel.for_inference`` then ``model.generate``), in processes of their own.

Unsloth's decode step keeps its keys and values in buffers on each attention layer
(``paged_attention``, grown with ``resize_`` by 512 rows when full) and returns them as a list of
``(K, V)`` views of those buffers, which generate() passes back. The decode steps made from
their pattern (``tracing/shims/decode_replay.py``) must give the trace that every step run for
real gives: the same events, the same records beside them, the same Triton launch counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# skips this module too where Unsloth is not installed
from tests.unsloth_notebook.test_unsloth_qlora import ROOT, SCRIPT as QLORA

FIELDS = ("kind", "id", "bytes", "stream", "category", "op", "module", "phase", "dtype", "shape", "source",
          "iteration")

# the QLoRA notebook's model, put in inference mode, generating for two prompts of different lengths
# (left-padded): 520 tokens, past the 518 rows its buffers start with (prompt + 512 + 1), so that
# the steps near the growth must run for real
SCRIPT = QLORA[:QLORA.index("trainer = SFTTrainer(")] + '''
FastLanguageModel.for_inference(model)
tokenizer.padding_side = "left"
inputs = tokenizer(["the model learns to follow", "memory and kernels"], return_tensors="pt",
                   padding=True).to("cuda")
outputs = model.generate(**inputs, max_new_tokens=520, use_cache=True, temperature=1.5, min_p=0.1)
assert outputs.shape == (2, 5 + 520), outputs.shape
'''

_CHILD = """
import json, os, re, sys
from xmem_engine.estimate import estimate_script
est = estimate_script("script.py", "A100-80GB")
tr = est.trace
# what names the run's folders (its own, Inductor's), not what it did
gen = lambda s: re.sub(r"(/tmp/torchinductor_[^/]+/tmp[^/]+|/[^ :]*/inductor/[0-9a-f]{20})/[^/]+/[^:/]+[.]py", "GEN.py",
                       str(s).replace(os.getcwd(), "WORK"))
rows = [[gen(getattr(e, f)) for f in FIELDS] for e in tr.events]
notes = [n for n in tr.meta.get("notes", []) if n.startswith(("generate(): ", "Triton kernel "))]
print(json.dumps({"rows": rows, "notes": notes, "gemm_into": gen(tr.meta.get("gemm_into")),
                  "by_sm": gen(tr.meta.get("by_sm")), "sdpa_calls": tr.meta.get("sdpa_calls"),
                  "peak": est.peak_allocated_bytes}))
"""


def _trace_in_child(work: Path, replay: str, script: str | None = None, **env_extra: str) -> dict:
    work.mkdir()
    (work / "script.py").write_text(SCRIPT if script is None else script)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XMEM_REPLAY_DECODE": replay, **env_extra}
    run = subprocess.run([sys.executable, "-c", f"FIELDS = {FIELDS!r}" + _CHILD], cwd=work, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("unsloth_generate")
    return {flag: _trace_in_child(base / flag, flag) for flag in ("1", "0")}


def test_unsloths_decode_steps_are_made_from_their_pattern(traces):
    made = traces["1"]["notes"][0]
    assert made.startswith("generate(): ") and "did not match" not in made
    assert int(made.split()[1]) >= 400  # of 520 calls: the prefill, 18 to fit, checks, the steps near the growth
    assert not any(n.startswith("generate(): ") for n in traces["0"]["notes"])


def test_made_steps_give_the_trace_of_real_ones(traces):
    made, real = traces["1"], traces["0"]
    first = next((i for i, (a, b) in enumerate(zip(made["rows"], real["rows"])) if a != b), None)
    assert first is None and len(made["rows"]) == len(real["rows"]), \
        (first, made["rows"][first] if first is not None else None, real["rows"][first] if first is not None else None)
    for key in ("gemm_into", "by_sm", "sdpa_calls", "peak"):
        assert made[key] == real[key], key
    # the buffers grew (keys and values, and the scores, in each of the two layers), where they grow
    assert sum(r[0] == "alloc" and r[5] == "aten.resize_.default" for r in real["rows"]) == 4
    # Triton launches are counted for the made steps as if they ran
    assert made["notes"][1:] == real["notes"] and any("_gemv_nf4_kernel" in n for n in real["notes"])
