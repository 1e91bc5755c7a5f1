"""The named ground-truth runs: which workload script, with which knob overrides and env.

The scripts themselves are ordinary CUDA training scripts; a run is one script
plus `--set`-style overrides plus extra environment variables (for allocator
settings, which must be set before CUDA initialises, hence a fresh process).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKLOADS_DIR = Path(__file__).resolve().parent
MODELS_FILE = WORKLOADS_DIR / "models.py"
ZOO_DIR = WORKLOADS_DIR.parent / "zoo"


@dataclass(frozen=True)
class RunSpec:
    """One measured run. `dry_run_overrides` shrink it so --dry-run finishes in seconds on a CPU."""

    name: str
    script: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    dry_run_overrides: dict[str, Any] = field(default_factory=dict)
    dry_runnable: bool = True  # False: the script hard-codes "cuda" and big sizes (the zoo's)

    def effective_overrides(self, dry_run: bool) -> dict[str, Any]:
        """Overrides for this run; the dry run also moves the script to the CPU."""
        if not dry_run:
            return dict(self.overrides)
        return {**self.overrides, **self.dry_run_overrides, "device": "cpu"}


def _script(name: str) -> Path:
    return WORKLOADS_DIR / f"{name}.py"


def _zoo(name: str, **kw: Any) -> RunSpec:
    """A zoo script (benchmarks/zoo/), run as written: these have no knobs to shrink for a dry run."""
    return RunSpec(f"zoo-{Path(name).stem.replace('_', '-')}", ZOO_DIR / f"{name}.py", dry_runnable=False, **kw)


_DRY_RESNET = {"batch_size": 2, "image_size": 32, "num_classes": 10}
_DRY_SMALL = {"dim": 64, "n_layers": 2, "n_heads": 4}
_DRY_VIT = {**_DRY_SMALL, "mlp_dim": 256, "batch_size": 2, "image_size": 32, "num_classes": 10}
_DRY_BERT = {**_DRY_SMALL, "mlp_dim": 256, "batch_size": 2, "seq_len": 32, "max_positions": 32, "vocab_size": 1000}
_DRY_GPT2 = {**_DRY_SMALL, "batch_size": 2, "seq_len": 32, "max_positions": 32, "vocab_size": 1000}
_DRY_MOBILENET = {"batch_size": 2, "image_size": 32, "num_classes": 10, "iterations": 2}
_EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

WORKLOADS: list[RunSpec] = [
    RunSpec("resnet50-bs64-sgd", _script("resnet50"), {"batch_size": 64, "optimizer_name": "SGD"},
            dry_run_overrides=_DRY_RESNET),
    RunSpec("resnet50-bs64-adamw", _script("resnet50"),
            {"batch_size": 64, "optimizer_name": "AdamW", "lr": 1e-3}, dry_run_overrides=_DRY_RESNET),
    RunSpec("vit-b16-bs32-adamw", _script("vit"), {"batch_size": 32}, dry_run_overrides=_DRY_VIT),
    RunSpec("bert-base-bs16x512-adamw", _script("bert"), {"batch_size": 16, "seq_len": 512},
            dry_run_overrides=_DRY_BERT),
    RunSpec("gpt2-small-bs8x1024-fp32", _script("gpt2"), {"batch_size": 8, "seq_len": 1024},
            dry_run_overrides=_DRY_GPT2),
    RunSpec("gpt2-small-bs8x1024-bf16", _script("gpt2"),
            {"batch_size": 8, "seq_len": 1024, "amp_dtype": "bfloat16"}, dry_run_overrides=_DRY_GPT2),
    RunSpec("gpt2-small-bs8x1024-fp32-ckpt", _script("gpt2"),
            {"batch_size": 8, "seq_len": 1024, "checkpointing": True}, dry_run_overrides=_DRY_GPT2),
    RunSpec("gpt2-small-bs8x1024-bf16-ckpt", _script("gpt2"),
            {"batch_size": 8, "seq_len": 1024, "amp_dtype": "bfloat16", "checkpointing": True},
            dry_run_overrides=_DRY_GPT2),
    RunSpec("gpt2-small-bs8x1024-fp32-expandable", _script("gpt2"), {"batch_size": 8, "seq_len": 1024},
            env=_EXPANDABLE, dry_run_overrides=_DRY_GPT2),
    RunSpec("resnet50-bs64-sgd-expandable", _script("resnet50"), {"batch_size": 64, "optimizer_name": "SGD"},
            env=_EXPANDABLE, dry_run_overrides=_DRY_RESNET),
    # The xMem paper's RTX 3060 runs: 11-16% above xmem at batch 251-317, within 2% at 638-764.
    RunSpec("mobilenetv2-86px-bs251-adamw", _script("mobilenetv2"), {"batch_size": 251},
            dry_run_overrides=_DRY_MOBILENET),
    RunSpec("mobilenetv2-86px-bs638-adamw", _script("mobilenetv2"), {"batch_size": 638},
            dry_run_overrides=_DRY_MOBILENET),
    # torch.compile (issue #32): Inductor's own buffer plan instead of eager's allocations.
    RunSpec("gpt2-small-bs8x1024-bf16-compiled", _script("gpt2"),
            {"batch_size": 8, "seq_len": 1024, "amp_dtype": "bfloat16", "compiled": True},
            dry_run_overrides={**_DRY_GPT2, "iterations": 2}),
    # mode="reduce-overhead": CUDA graph trees' private pool; step 1 warms up, 2 records, 3 replays.
    RunSpec("gpt2-small-bs8x1024-bf16-reduce-overhead", _script("gpt2"),
            {"batch_size": 8, "seq_len": 1024, "amp_dtype": "bfloat16", "compiled": True,
             "compile_mode": "reduce-overhead"},
            dry_run_overrides={**_DRY_GPT2, "iterations": 2}),
    # Scripts from benchmarks/zoo/ as written, most telling first: the fine-tuning stack (issue #31)
    # has had no GPU measurement at all.  They need transformers 5.x, peft, trl and liger-kernel.
    _zoo("finetune/lora_sft_bf16"),
    _zoo("finetune/generate_dynamic"),
    _zoo("finetune/generate_static"),
    _zoo("finetune/grpo_trl"),
    _zoo("lstm_tagger"),
    _zoo("finetune/user_triton_kernel"),
    _zoo("finetune/liger_llama"),
    _zoo("finetune/dpo_trl"),
    _zoo("finetune/generate_beam"),
    _zoo("finetune/hf_fp16_gradscaler_bert"),
    _zoo("finetune/save_pretrained_end"),
    _zoo("finetune/liger_sft_trl"),
    _zoo("finetune/lightning_bf16"),
    _zoo("peft_lora_llama"),
    _zoo("hf_llama_bf16"),
]


def select(names: list[str] | None, dry_run: bool = False) -> list[RunSpec]:
    """Runs named in `names` (in the given order), or all (a dry run: all it can shrink); unknown names are an error."""
    if not names:
        return [r for r in WORKLOADS if r.dry_runnable or not dry_run]
    by_name = {r.name: r for r in WORKLOADS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise KeyError(f"unknown run(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    fixed = [n for n in names if dry_run and not by_name[n].dry_runnable]
    if fixed:
        raise KeyError(f"run(s) {', '.join(fixed)} cannot be dry-run: their scripts hard-code cuda and full sizes")
    return [by_name[n] for n in names]
