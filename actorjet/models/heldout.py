"""Which held-out tasks measure a model, without torch (the head checks a job with it).

A task source opts in by defining ``eval_tasks(split)`` (or ``eval_tasks()``: one split),
``messages(task)`` and ``score(task, text)`` — or, when its episodes use several models,
``eval_for(model)`` returning that triple for the model (or None).  Splits: ``validation``
is what training runs report; ``test`` is kept for a study's final comparison.

A multi-turn task defines ``eval_episode(task, chat) -> score`` instead of ``messages`` and
``score``: it plays the episode against ``chat(messages, tools=None, max_tokens=...)``, which
answers greedily with an OpenAI-shaped message (models/evaluate.py).  Its spec is then
``(eval_tasks, None, eval_episode)``.
"""
from __future__ import annotations

import functools
import importlib
import inspect


def eval_spec(source: str, model_name: str, split: str = "validation") -> tuple | None:
    """(eval_tasks, messages, score) that measure ``model_name`` on ``split`` of this task
    source, or None.  A source whose ``eval_tasks`` takes no ``split`` has one held-out set,
    which counts as its validation split."""
    from actorjet.config import examples_name

    module = importlib.import_module(examples_name(source))
    if hasattr(module, "eval_for"):
        spec = module.eval_for(model_name)
    elif hasattr(module, "eval_tasks") and hasattr(module, "eval_episode"):
        spec = (module.eval_tasks, None, module.eval_episode)
    elif all(hasattr(module, f) for f in ("eval_tasks", "messages", "score")):
        spec = (module.eval_tasks, module.messages, module.score)
    else:
        return None
    if spec is None:
        return None
    eval_tasks, messages, score = spec
    if "split" in inspect.signature(eval_tasks).parameters:
        return functools.partial(eval_tasks, split=split), messages, score
    return spec if split == "validation" else None
