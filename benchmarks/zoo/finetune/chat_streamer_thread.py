"""A chat demo's streamed reply: ``generate()`` runs in a thread with a ``TextIteratorStreamer``
and the main thread prints the text as it arrives, sampling 256 new tokens for one prompt of 384,
bf16.

Pattern: transformers docs, "Generation features" / "Streaming"
(https://huggingface.co/docs/transformers/generation_features): ``Thread(target=model.generate,
kwargs=dict(inputs, streamer=streamer, max_new_tokens=...))``, then ``for text in streamer``, the
form of every Gradio chat example.

Stands for TinyLlama-1.1B-Chat (its config, written in code: nothing can be downloaded), with a
word-level tokenizer made in code.
"""
from threading import Thread

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TextIteratorStreamer

words = [f"w{i}" for i in range(31996)]
vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *words])}
backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="<pad>")

config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                     bos_token_id=1, eos_token_id=2, pad_token_id=3)
model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()

prompt = " ".join(words[i * 7 % 31996] for i in range(384))
inputs = tokenizer([prompt], return_tensors="pt").to("cuda")
streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
thread = Thread(target=model.generate, kwargs=dict(**inputs, streamer=streamer, max_new_tokens=256, do_sample=True,
                                                   temperature=0.7, top_p=0.9))
thread.start()
reply = ""
for text in streamer:
    reply += text
thread.join()
print(len(reply.split()), "words streamed")
