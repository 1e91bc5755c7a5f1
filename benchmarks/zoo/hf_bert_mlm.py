"""BERT masked-language-model pre-training step with the usual 80/10/10 masking done by hand
(DataCollatorForLanguageModeling's rule), fp16 autocast and a GradScaler."""
import torch
from transformers import BertConfig, BertForMaskedLM

config = BertConfig()
model = BertForMaskedLM(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.cuda.amp.GradScaler()
mask_token_id = 103


def mask_tokens(inputs):
    labels = inputs.clone()
    probability_matrix = torch.full(labels.shape, 0.15, device=inputs.device)
    masked = torch.bernoulli(probability_matrix).bool()
    labels[~masked] = -100
    replaced = torch.bernoulli(torch.full(labels.shape, 0.8, device=inputs.device)).bool() & masked
    inputs[replaced] = mask_token_id
    random_words = torch.randint(config.vocab_size, labels.shape, dtype=torch.long, device=inputs.device)
    randomized = torch.bernoulli(torch.full(labels.shape, 0.5, device=inputs.device)).bool() & masked & ~replaced
    inputs[randomized] = random_words[randomized]
    return inputs, labels


for step in range(3):
    ids = torch.randint(1000, config.vocab_size, (32, 128), device="cuda")
    inputs, labels = mask_tokens(ids)
    with torch.cuda.amp.autocast():
        loss = model(input_ids=inputs, labels=labels).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
