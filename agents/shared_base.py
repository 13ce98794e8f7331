"""Two policies over one base: two LoRA adapters of tiny-arith in one engine, each trained on
its own reward.

Both roles see the same 2-digit addition; they are rewarded for different answers:

    adder    1 if it answers the sum                      (12+34= → 46)
    rounder  1 if it answers the sum rounded down to tens (12+34= → 40)

The untrained model (an adder) is right as a rounder only when the sum ends in 0, about one
time in ten, so the rounder has a signal to learn from and a long way to go.  Each model
entry names the other's base (``base = "adder"`` in agents/shared_base.toml): one engine
holds tiny-arith once and serves both adapters.  Run it with:

    actorjet start --config agents/shared_base.toml --tree supervisors/shared_base.toml --slots 2
"""
from __future__ import annotations

from actorjet_agents import arithmetic
from actorjet_agents.arithmetic import tasks  # noqa: F401  - the task stream: 2-digit additions


def rounded(answer: str) -> str:
    return str(int(answer) // 10 * 10)


def behavior(task: dict, llm) -> dict:
    rewards = {}
    for role, want in (("adder", task["answer"]), ("rounder", rounded(task["answer"]))):
        client = llm.client(role, role=role)
        reply = client.chat.completions.create(model=role, max_tokens=4, temperature=1.0,
                                               messages=arithmetic.messages(task))
        rewards[role] = float((reply.choices[0].message.content or "").strip() == want)
    return rewards


def eval_for(model: str):
    """Held-out evaluation per model: each on its own answer."""
    if model == "adder":
        return arithmetic.eval_tasks, arithmetic.messages, arithmetic.score
    if model == "rounder":
        return arithmetic.eval_tasks, arithmetic.messages, lambda t, text: float(text.strip() == rounded(t["answer"]))
    return None
