"""Held-out evaluation: greedy answers from the current weights, scored by the task (which
tasks, and how they are asked and scored: serving/heldout.py).  The learner runs it on its own
weights (no swarm round trip), so "accuracy before/after" measures the model, not the network.
"""
from __future__ import annotations

import torch

from actorjet.serving.engine import GenRequest, TransformersEngine


@torch.no_grad()
def greedy_accuracy(model, tokenizer, spec: tuple, max_tokens: int = 8, limit: int | None = None) -> float:
    eval_tasks, messages, score = spec
    tasks = eval_tasks()[:limit] if limit else eval_tasks()
    was_training = model.training
    model.eval()
    engine = TransformersEngine(model=model, tokenizer=tokenizer, start_thread=False,
                                device=str(next(model.parameters()).device))
    requests = []
    for task in tasks:
        text = tokenizer.apply_chat_template(messages(task), add_generation_prompt=True, tokenize=False)
        requests.append(GenRequest(tokenizer(text, add_special_tokens=False)["input_ids"], max_tokens, 0.0))
    correct = 0.0
    for start in range(0, len(requests), 256):
        for task, res in zip(tasks[start:start + 256], engine.generate(requests[start:start + 256])):
            correct += score(task, tokenizer.decode(res[0].completion_ids, skip_special_tokens=True))
    if was_training:
        model.train()
    return correct / max(1, len(tasks))
