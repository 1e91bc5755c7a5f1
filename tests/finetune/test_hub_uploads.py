"""Traced code sends nothing to the Hugging Face Hub (``shims/hub_uploads.py``): a notebook's
``trainer.push_to_hub()``, ``model.push_to_hub(...)`` and ``TrainingArguments(push_to_hub=True)``
would have made the user's repository and committed placeholder weights to it from an estimate
(or, offline, retried for 23 s a call and stopped the script)."""

from __future__ import annotations

import sys
import types

import pytest

pytest.importorskip("transformers")
hub = pytest.importorskip("huggingface_hub")

from xmem_engine.tracing import trace  # noqa: E402

PUSHING = """
import tempfile
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
rows = [{"input_ids": [5] * 32, "labels": [5] * 32}] * 16
args = TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=2, report_to=[], save_strategy="steps",
                         save_steps=1, push_to_hub=True, hub_model_id="someone/finetune", hub_strategy="every_save")
trainer = Trainer(model=model, args=args, train_dataset=rows)
trainer.train()
commit = trainer.push_to_hub(commit_message="end of training")
url = str(model.push_to_hub("someone/finetune-2"))
"""


def _no_network(*args, **kwargs):
    raise AssertionError("traced code reached the Hugging Face Hub")


def test_push_to_hub_sends_nothing_and_returns_as_the_hub_would(monkeypatch):
    import huggingface_hub.utils._http as http

    monkeypatch.setattr(http, "_http_backoff_base", _no_network)
    monkeypatch.setattr(http, "get_session", _no_network)
    ns: dict = {}
    tr = trace(PUSHING, ns, mode="fake")
    assert ns["url"].endswith("/someone/finetune-2/commit/" + "0" * 40)
    note = next(n for n in tr.meta["notes"] if n.startswith("Hugging Face Hub: nothing sent"))
    lines = {name: i for i, name in ((i, line.split(" =")[0].split("(")[0].strip())
                                     for i, line in enumerate(PUSHING.splitlines(), 1))}
    assert f"create_repo at <cell>:{lines['trainer']}" in note  # TrainingArguments(push_to_hub=True)
    assert f"upload_folder (2 times) at <cell>:{lines['trainer.train']}" in note  # each save
    assert f"upload_folder at <cell>:{lines['commit']}" in note
    assert f"create_repo, create_commit at <cell>:{lines['url']}" in note


def test_a_bound_alias_imported_before_the_trace_sends_nothing(monkeypatch):
    import huggingface_hub.utils._http as http

    monkeypatch.setattr(http, "_http_backoff_base", _no_network)
    monkeypatch.setattr(http, "get_session", _no_network)
    early = types.ModuleType("early_user_module")
    early.create_repo = hub.create_repo  # `from huggingface_hub import create_repo`, before tracing
    monkeypatch.setitem(sys.modules, "early_user_module", early)
    ns: dict = {}
    trace("import early_user_module\nurl = str(early_user_module.create_repo('someone/x', exist_ok=True))", ns, mode="fake")
    assert ns["url"] == f"{hub.constants.ENDPOINT}/someone/x"
    assert early.create_repo == hub.create_repo  # put back after the trace


def test_the_hub_kernels_note_is_for_code_that_ran_a_transformers_model():
    """transformers 5 may swap layers for Hub kernels on a GPU: said where a transformers model
    ran, not where a library merely imported transformers (Lightning, torchmetrics)."""
    ran = trace("""
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256)).cuda()
model(torch.randint(0, 256, (2, 16), device="cuda"))
""", {}, mode="fake")
    imported = trace("""
import torch, transformers
model = torch.nn.Linear(64, 64).cuda()
model(torch.randn(2, 64, device="cuda"))
""", {}, mode="fake")
    hub = [any("Hub kernels" in n for n in t.meta.get("notes", [])) for t in (ran, imported)]
    assert hub == [True, False]
