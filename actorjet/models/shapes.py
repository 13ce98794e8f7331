"""Random-init models of real shapes, built in memory on the device they will run on.

Why: timing does not depend on what the weights say, and weights cannot travel to a lent GPU
machine (SmolLM2-135M alone is 270 MB; an 8B model is 16 GB).  A ``LlamaConfig`` of the real
shape built on the GPU takes a second.  The tokenizer is tiny-long's character tokenizer:
its ids are all a benchmark needs, and the model's vocabulary is the real one's size, so the
output layer costs what it really costs.
"""
from __future__ import annotations

from actorjet.errors import UserError

# name: (hidden, intermediate, layers, heads, kv heads, vocabulary)
SHAPES = {
    "llama3-8b": (4096, 14336, 32, 32, 8, 128256),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152),
    "tiny": (64, 128, 2, 4, 2, 512),                 # the same paths in seconds on a CPU (dry runs)
}
PREFIX = "shape:"


def is_shape(name: str) -> bool:
    return name.startswith(PREFIX)


def save(name: str, out, dtype: str = "bfloat16", positions: int = 4096, seed: int = 0):
    """``shape:NAME`` written as a model directory a job can name as its source (random
    weights in ``dtype``, a tokenizer of the full vocabulary)."""
    from pathlib import Path

    from actorjet.models.zoo import build_long_tokenizer

    out = Path(out)
    if (out / "config.json").exists():
        return out
    model, _ = build(name, "cpu", dtype, positions, seed)
    model.save_pretrained(out)
    build_long_tokenizer(fill_to=model.config.vocab_size).save_pretrained(out)
    return out


def build(name: str, device: str = "cpu", dtype: str = "bfloat16", positions: int = 32768, seed: int = 0):
    """(model, tokenizer) for ``shape:NAME``, random weights in ``dtype`` on ``device``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from actorjet.models.zoo import build_long_tokenizer

    key = name[len(PREFIX):] if is_shape(name) else name
    if key not in SHAPES:
        raise UserError(f"unknown shape {name!r}: use one of " + ", ".join(PREFIX + s for s in SHAPES))
    hidden, inter, layers, heads, kv_heads, vocab = SHAPES[key]
    tok = build_long_tokenizer()
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=positions, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))      # built in its dtype: an 8B model never exists in fp32
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval(), tok
