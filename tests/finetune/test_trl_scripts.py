"""TRL's own command-line scripts (``trl/scripts/sft.py``, ``dpo.py``, shipped in the package),
estimated as their docstrings run them, on a local checkpoint and local datasets (no Hub):
code nobody wrote for xmem, run through ``xmem estimate SCRIPT -- ARGS`` as a user would."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = "below is an instruction that describes a task write a response memory grows with batch size".split()


@pytest.fixture(scope="module")
def local_hub(tmp_path_factory) -> dict:
    """A Qwen2-shaped checkpoint with its tokenizer and chat template, a conversational dataset and
    a preference dataset, saved as the Hub would give them."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    root = tmp_path_factory.mktemp("hub")
    vocab = {w: i for i, w in enumerate(["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = ("{% for message in messages %}<|im_start|>{{ message['role'] }} {{ message['content'] }}"
                         "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
    cfg = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=3, pad_token_id=1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    rng = random.Random(0)

    def say(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    (root / "chat").mkdir()
    (root / "chat" / "train.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": say(5, 40)}, {"role": "assistant", "content": say(10, 80)}]}) + "\n"
        for _ in range(32)))
    (root / "prefs").mkdir()
    (root / "prefs" / "train.jsonl").write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": say(5, 30)}], "chosen": [{"role": "assistant", "content": say(5, 60)}],
        "rejected": [{"role": "assistant", "content": say(5, 60)}]}) + "\n" for _ in range(32)))
    # bytes as float32 parameters, each rounded up to the allocator's 512-byte blocks (the breakdown's unit)
    params = list(model.parameters())
    return {"root": root, "fp32_bytes": sum(-(-p.numel() * 4 // 512) * 512 for p in params),
            # the Trainer's default optimizer on CUDA, fused AdamW: two moments, and each
            # parameter's step count as a one-element tensor on the GPU (a 512-byte block)
            "adamw_bytes": sum(2 * -(-p.numel() * 4 // 512) * 512 + 512 for p in params)}


def _estimate(script: str, args: list[str], cwd) -> tuple[dict, str]:
    path = os.path.join(os.path.dirname(trl.__file__), "scripts", script)
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "xmem_engine", "estimate", path, "--gpu", "A100-80GB", "--json",
                           "--", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), path


def test_trls_sft_script_is_estimated_with_its_own_lines_named(local_hub, tmp_path):
    root = local_hub["root"]
    out, path = _estimate("sft.py", ["--model_name_or_path", str(root / "model"), "--dataset_name", str(root / "chat"),
                                     "--per_device_train_batch_size", "2", "--max_steps", "2", "--max_length", "256",
                                     "--output_dir", str(tmp_path / "out"), "--report_to", "none"], tmp_path)
    # TRL's ModelConfig loads in float32 unless told otherwise (--dtype): 4 bytes a parameter
    assert out["breakdown"]["parameter"] == local_hub["fp32_bytes"]
    assert out["breakdown"]["optimizer_state"] == local_hub["adamw_bytes"]
    # the script's file is the user's code, though it lives in site-packages: its lines are named
    assert any(f"{path}:" in n and "save_model" in n for n in out["notes"]), out["notes"]
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")  # nothing was written


def test_trls_dpo_script_holds_the_policy_and_its_reference(local_hub, tmp_path):
    root = local_hub["root"]
    out, _ = _estimate("dpo.py", ["--model_name_or_path", str(root / "model"), "--dataset_name", str(root / "prefs"),
                                  "--per_device_train_batch_size", "2", "--max_steps", "2", "--max_length", "256",
                                  "--output_dir", str(tmp_path / "out"), "--report_to", "none",
                                  "--no_remove_unused_columns"], tmp_path)
    assert out["breakdown"]["parameter"] == 2 * local_hub["fp32_bytes"]  # the policy and the frozen reference
    assert out["breakdown"]["optimizer_state"] == local_hub["adamw_bytes"]  # the policy's only
