"""issue 49: the learner trains one packed sample of tiny-long's 32k positions, with the
loss's log-softmax in chunks and activation checkpointing, and the step is the one it takes
without them (the same gradient: the tricks change memory, not the math)."""
import sys
from pathlib import Path

import pytest
import torch

from actorjet.config import normalize
from actorjet.models import trainable, zoo
from actorjet.rl import grpo
from actorjet.rl.algorithms import from_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from long_sample import long_sample  # noqa: E402  - the bench's sample, at a test's size


def gradient(tokens: int, answers: int, checkpointing: bool, chunk_logits: int, monkeypatch) -> dict:
    monkeypatch.setattr(grpo, "CHUNK_LOGITS", chunk_logits)
    cfg = {**normalize({"models": [{"source": "tiny-long", "activation_checkpointing": checkpointing,
                                    "device": "cpu"}]})["models"][0], "path": zoo.resolve("tiny-long")}
    model, _ = trainable.build(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)       # a step that changes nothing: read the grads
    algo = from_config(cfg)
    info = grpo.grpo_step(model, optimizer, [long_sample(tokens, answers)], algo, pad_id=0)
    return {"info": info, "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}


@pytest.mark.parametrize("tokens", [pytest.param(4096, id="4k"),
                                    pytest.param(32768, id="32k", marks=[pytest.mark.slow, pytest.mark.long(minutes=1)])])
def test_a_long_sample_trains_the_same_in_chunks_with_checkpointing(tokens, monkeypatch):
    answers = tokens // 4
    plain = gradient(tokens, answers, False, 2 ** 40, monkeypatch)
    lean = gradient(tokens, answers, True, 97 * 40, monkeypatch)       # chunks of 40 rows of 97 logits
    assert lean["info"]["tokens"] == plain["info"]["tokens"] == answers
    assert lean["info"]["loss"] == pytest.approx(plain["info"]["loss"], rel=1e-5)
    assert plain["grads"].keys() == lean["grads"].keys()
    for name, g in plain["grads"].items():
        assert torch.allclose(lean["grads"][name], g, rtol=1e-4, atol=1e-7), name


def test_chunks_cover_every_row_once():
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(103, 8)
    tokens, temps = torch.randint(0, 50, (103,)), torch.full((103,), 0.7)
    whole = grpo._head_logprobs(head, hidden, tokens, temps)
    old = grpo.CHUNK_LOGITS
    try:
        grpo.CHUNK_LOGITS = 50 * 17                       # 17 rows a chunk: the last chunk has 1
        chunked = grpo.chunked_logprobs(head, hidden, tokens, temps)
    finally:
        grpo.CHUNK_LOGITS = old
    assert chunked.shape == (103,) and torch.allclose(chunked, whole, atol=1e-6)
