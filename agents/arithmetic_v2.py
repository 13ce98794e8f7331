"""A second version of the arithmetic behavior, to try `actorjet upgrade` with.

It changes what the agent does while training runs: the answer is asked for with a
tighter token budget and graded with partial credit (a number with the right number of
digits earns 0.2), a typical reward-shaping tweak made mid-run.

    actorjet upgrade arithmetic agents/arithmetic_v2.py:behavior
"""
from __future__ import annotations


def behavior(task: dict, llm) -> float:
    client = llm.client()
    reply = client.chat.completions.create(model=llm.model(), max_tokens=3, temperature=1.0,
                                           messages=[{"role": "user", "content": task["question"]}])
    text = (reply.choices[0].message.content or "").strip()
    if text == task["answer"]:
        return 1.0
    return 0.2 if text.isdigit() and len(text) == len(task["answer"]) else 0.0
