"""The overhead benchmark's behaviors over plain HTTP, without the `openai` SDK.

The same tasks, prompts and scores as agents/arithmetic.py and bench/digits_task.py.  The
`openai` SDK costs ~1.4–2 ms of CPU per call on this machine (~10x a plain `http.client`
call: request transforms, httpx, response models).  That is the agent's own cost, not the
swarm's; running both shows what each adds.  The quickstart's task over plain HTTP is the
shipped agents/arithmetic_http.py; the digits task uses its client."""
from __future__ import annotations

import digits_task
from actorjet_agents.arithmetic_http import behavior as arithmetic, chat  # noqa: F401  (arithmetic: overhead.py's PLAIN)


def digits(task: dict, llm) -> float:
    return digits_task.score(task, chat(llm, llm.model(), digits_task.messages(task), digits_task.MAX_TOKENS))
