"""A team of two different trainable LLMs: a proposer drafts the sum, a verifier checks and
corrects its last digit.

The proposer is ``tiny-arith`` (character tokenizer); the verifier is ``tiny-judge`` (a
smaller Llama with SmolLM2's 49k-token BPE tokenizer).  The team's answer is the draft
with the verifier's last digit.  Each model is credited for its own part:

    proposer  1 if its draft is the right sum
    verifier  1 if its last digit is right (whatever the draft said)

The behavior returns ``{role: reward}``; each model's learner trains only on its own
calls, with its own rewards.  Run it with:

    actorjet start --config agents/team.toml --tree supervisors/two_models.toml --slots 2
"""
from __future__ import annotations

import random

from actorjet_agents import arithmetic
from actorjet_agents.arithmetic import tasks  # noqa: F401  - the task stream: 2-digit additions
from actorjet.models.zoo import judge_prompt

JUDGE_EVAL_SEED = 777


def behavior(task: dict, llm) -> dict:
    proposer = llm.client("proposer", role="proposer")
    draft = proposer.chat.completions.create(model="proposer", max_tokens=4, temperature=1.0,
                                             messages=arithmetic.messages(task))
    text = (draft.choices[0].message.content or "").strip()
    verifier = llm.client("verifier", role="verifier")
    check = verifier.chat.completions.create(model="verifier", max_tokens=1, temperature=1.0, messages=[
        {"role": "user", "content": judge_prompt(task["question"], text)}])
    digit = (check.choices[0].message.content or "").strip()
    final = text[:-1] + digit if text else digit
    return {"proposer": float(text == task["answer"]), "verifier": float(digit == task["answer"][-1]),
            "team": float(final == task["answer"])}


# -- held-out evaluation, per model ------------------------------------------------------------

def _judge_eval_tasks(split: str = "validation", n: int = 256) -> list[dict]:
    """Drafts as a proposer makes them: right, or a near miss."""
    rng = random.Random(JUDGE_EVAL_SEED)
    out = []
    for task in arithmetic.eval_tasks(split, n):
        draft = max(0, int(task["answer"]) + rng.choice([0, 0, -1, 1, 2, -2, 10, -10]))
        out.append({"prompt": judge_prompt(task["question"], str(draft)), "digit": task["answer"][-1]})
    return out


def eval_for(model: str):
    if model == "proposer":
        return arithmetic.eval_tasks, arithmetic.messages, arithmetic.score
    if model == "verifier":
        return (_judge_eval_tasks, lambda t: [{"role": "user", "content": t["prompt"]}],
                lambda t, text: float(text.strip() == t["digit"]))
    return None
