"""An LSTM language model trained with Adam. AMP and ACCUM switch on, by hand, the changes
`xmem advise` measures (tests/cli/test_advisor.py)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 512
seq = 64
AMP = False
AMP_DTYPE = "float16"  # "bfloat16" where the GPU has it (no GradScaler then)
ACCUM = 1


class LM(nn.Module):
    def __init__(self, vocab=20000, d=512, hidden=1024, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx):
        out, _ = self.rnn(self.emb(idx))
        return self.head(out)


model = LM().cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
DTYPE = getattr(torch, AMP_DTYPE)
scaler = torch.amp.GradScaler("cuda", enabled=AMP and DTYPE == torch.float16)
micro = batch_size // ACCUM
for _ in range(ACCUM):
    idx = torch.randint(0, 20000, (micro, seq), device="cuda")
    with torch.autocast("cuda", dtype=DTYPE, enabled=AMP):
        logits = model(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx.reshape(-1)) / ACCUM
    scaler.scale(loss).backward()
    del idx, logits, loss  # nothing of this micro-batch outlives it
scaler.step(opt)
scaler.update()
opt.zero_grad(set_to_none=True)
