"""A behavior that does no work: no LLM call, a reward at once.  What bench/control_plane.py
runs on real (thespian) runners, so that only the swarm's bookkeeping is measured."""


def behavior(task: dict, llm) -> float:
    return float(len(task["question"]) % 2)
