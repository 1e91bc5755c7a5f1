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


@dataclass(frozen=True)
class RunSpec:
    """One measured run. `dry_run_overrides` shrink it so --dry-run finishes in seconds on a CPU."""

    name: str
    script: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    dry_run_overrides: dict[str, Any] = field(default_factory=dict)

    def effective_overrides(self, dry_run: bool) -> dict[str, Any]:
        """Overrides for this run; the dry run also moves the script to the CPU."""
        if not dry_run:
            return dict(self.overrides)
        return {**self.overrides, **self.dry_run_overrides, "device": "cpu"}


def _script(name: str) -> Path:
    return WORKLOADS_DIR / f"{name}.py"


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
]


def select(names: list[str] | None) -> list[RunSpec]:
    """Runs named in `names` (in the given order), or all; unknown names are an error."""
    if not names:
        return list(WORKLOADS)
    by_name = {r.name: r for r in WORKLOADS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise KeyError(f"unknown run(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]
