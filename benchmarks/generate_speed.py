"""How the fake-mode trace of ``model.generate()`` scales with the number of new tokens
(issue #31, item 5): tokens, seconds, peak RSS, for a ~1.2B Llama (bf16), batch 32.

Run in an environment with transformers (``.venv-ft``):
    PYTHONPATH=. .venv-ft/bin/python benchmarks/generate_speed.py 64 128 256 512
Each count runs in a fresh process, so that the peak RSS is that count's."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

SOURCE = """
import torch
from transformers import LlamaConfig, AutoModelForCausalLM
cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
ids = torch.randint(0, cfg.vocab_size, (32, 128), device="cuda")
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N,
                         min_new_tokens=0, pad_token_id=0, eos_token_id=2)
"""


def one(n: int) -> None:
    from xmem_engine.tracing import trace

    start = time.perf_counter()
    tr = trace(SOURCE.replace("=N", f"={n}"), {}, mode="fake")
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{n:>6} {seconds:>9.1f} {seconds / n:>9.3f} {len(tr.events):>9,} {rss:>9.0f}", flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        one(int(argv[1]))
        return
    counts = [int(a) for a in argv] or [64, 128, 256, 512]
    print(f"{'tokens':>6} {'trace s':>9} {'s/token':>9} {'events':>9} {'RSS MB':>9}", flush=True)
    for n in counts:
        subprocess.run([sys.executable, __file__, "--one", str(n)], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
