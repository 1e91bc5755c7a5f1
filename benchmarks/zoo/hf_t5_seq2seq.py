"""T5-small as a seq2seq summariser: encoder 512 tokens, decoder 128, AdamW with a linear
schedule (transformers' run_summarization recipe, one optimizer step per batch)."""
import torch
from transformers import T5Config, T5ForConditionalGeneration, get_linear_schedule_with_warmup

device = torch.device("cuda")
config = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128, decoder_start_token_id=0)
model = T5ForConditionalGeneration(config).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=100)

batch_size = 16
for step in range(3):
    input_ids = torch.randint(2, config.vocab_size, (batch_size, 512), device=device)
    labels = torch.randint(2, config.vocab_size, (batch_size, 128), device=device)
    labels[:, -10:] = -100  # padding ignored by the loss
    outputs = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels)
    outputs.loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
