"""Held-out evaluation: greedy answers from the current weights, scored by the task (which
tasks, and how they are asked and scored: models/heldout.py).  The learner runs it on its own
weights (no swarm round trip), so "accuracy before/after" measures the model, not the network.

A multi-turn task (one whose held-out spec has ``messages=None``: models/heldout.py) plays
each held-out episode with its own ``eval_episode(task, chat)``; ``chat`` answers greedily
from these weights, rendered and parsed exactly as the gateway does it (tools included).
The episodes run in threads, so their calls meet in the engine's batches.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from actorjet.serving import tool_calls
from actorjet.serving.transformers_engine import GenRequest, TransformersEngine
from actorjet.serving.openai_api import render_prompt

CALL_TIMEOUT_S = 600.0   # a call never answered fails the evaluation (the learner restarts and
                         # evaluates again), rather than leave a finished run waiting for its line


@torch.no_grad()
def greedy_accuracy(model, tokenizer, spec: tuple, max_tokens: int = 8, limit: int | None = None,
                    tool_parser: str = "") -> float:
    eval_tasks, messages, score = spec
    tasks = eval_tasks()[:limit] if limit else eval_tasks()
    if messages is None:
        return episode_accuracy(model, tokenizer, tasks, score, max_tokens, tool_parser=tool_parser)
    was_training = model.training
    model.eval()
    engine = TransformersEngine(model=model, tokenizer=tokenizer, start_thread=False, prefix_cache_mb=0,
                                device=str(next(model.parameters()).device))     # no conversations to keep
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


def episode_accuracy(model, tokenizer, tasks: list, eval_episode, max_tokens: int, threads: int = 64,
                     tool_parser: str = "") -> float:
    """Mean score of ``eval_episode(task, chat)`` over ``tasks``, played greedily; tool calls
    parsed as the gateway parses them (``tool_parser``: the model entry's, or the template's)."""
    was_training = model.training
    model.eval()
    engine = TransformersEngine(model=model, tokenizer=tokenizer, max_batch=threads, prefix_cache_mb=0,
                                device=str(next(model.parameters()).device))     # calls carry no cache key

    def chat(messages: list[dict], tools: list | None = None, max_tokens: int = max_tokens) -> dict:
        """One greedy answer as an OpenAI message dict (``content``, ``tool_calls``)."""
        ids = render_prompt(tokenizer, messages, tools)
        res = engine.submit(GenRequest(ids, max_tokens, 0.0)).result(timeout=CALL_TIMEOUT_S)[0]
        content, calls = tool_calls.split_tool_calls(
            tokenizer.decode(res.completion_ids, skip_special_tokens=True), tools, tokenizer, tool_parser)
        return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}

    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="eval") as pool:
            scores = list(pool.map(lambda t: float(eval_episode(t, chat)), tasks))
    finally:
        engine.close()
        if was_training:
            model.train()
    return sum(scores) / max(1, len(scores))
