"""A bf16 transformer language model whose loop skips a step when the loss is not finite and
logs the gradient norm, the guards people add after a divergence."""
import math

import torch
import torch.nn as nn

vocab, d, layers = 32000, 1024, 12
emb = nn.Embedding(vocab, d).cuda()
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 16, 4 * d, batch_first=True, norm_first=True), layers).cuda()
head = nn.Linear(d, vocab, bias=False).cuda()
params = [*emb.parameters(), *enc.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=3e-4)
skipped = 0
for step in range(3):
    ids = torch.randint(0, vocab, (8, 512), device="cuda")
    causal = nn.Transformer.generate_square_subsequent_mask(512, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = head(enc(emb(ids), mask=causal, is_causal=True))
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    if not torch.isfinite(loss):
        skipped += 1
        opt.zero_grad(set_to_none=True)
        continue
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    if math.isnan(grad_norm.item()) or grad_norm.item() > 100:
        print(f"step {step}: large gradient norm {grad_norm.item():.1f}")
    opt.step()
    opt.zero_grad(set_to_none=True)
