"""2-digit addition asked of every model of the job: one episode, one call per model, and a
reward per model (``{model: score}``), so several models — each trained with its own algorithm,
say — learn side by side from one task source (tests/test_algorithms_train.py).  The held-out
set, its prompts and its scoring are the quickstart's (agents/arithmetic.py)."""
from __future__ import annotations

from actorjet_agents.arithmetic import eval_tasks, messages, score, tasks  # noqa: F401  (this source's held-out set)


def behavior(task: dict, llm) -> dict:
    rewards = {}
    for model in llm.models():
        reply = llm.client(model).chat.completions.create(model=model, messages=messages(task), max_tokens=4,
                                                           temperature=1.0)
        rewards[model] = score(task, reply.choices[0].message.content or "")
    return rewards
