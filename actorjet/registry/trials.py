"""Research trials hosted on this swarm's joined nodes: the head's book and its messages.

A node joined with ``--trials N`` hosts up to N trial heads at once.  A study's controller,
on any machine that reaches the head's door (an outbound-only laptop included), submits a
trial's job over HTTP; the registry places it on the live node with the most free trial
capacity; the node's TrialHost (actors/trial_host.py) runs it as a process of its own
(``python -m actorjet.research.trial``: an embedded head with its own runners, on that node)
and reports the learner's step, the periodic evals and the end.  A node that is lost takes
its trials with it: they become ``lost``, and the controller submits them again, to a node
that is alive.

Why trial heads on nodes rather than several jobs on one head: a trial is a whole job (its
own models, learner, engines, store) and a study compares jobs, so a trial that shares a
head's registry, supervisor and runners with other trials would measure its neighbours too;
and a head runs one job from start to end in every other part of ActorJet.  The swarm's head
only places and relays (a few small messages per trial per second); each trial's data stays
on the node that runs it.  docs/research.md says more.

Kept free of thespian so the placement rules are plain functions a test can call directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from actorjet.runtime.messages import Message

ACTIVE = ("starting", "running", "stopping")
KEEP_ENDED = 1000            # ended trials remembered for their controllers to read (oldest go first)

# --- the door and the registry (every ask carries a tag the answer echoes) ----------------


@dataclass
class SubmitTrial(Message):
    trial_id: str
    job: dict
    model_seed: int              # the study's one starting model is built from this seed
    slots: int = 2               # runner slots of the trial's own head
    tag: str = ""


@dataclass
class TrialQuery(Message):
    trial_id: str = ""           # "" → every trial, and the swarm's trial capacity
    tag: str = ""


@dataclass
class CancelTrial(Message):
    trial_id: str
    tag: str = ""


@dataclass
class TrialAnswer(Message):
    status: int                  # the HTTP status the door answers with
    body: dict
    tag: str = ""


# --- the registry and a node's TrialHost -------------------------------------------------

@dataclass
class RunTrial(Message):
    trial_id: str
    job: dict
    model_seed: int
    slots: int


@dataclass
class StopTrial(Message):
    trial_id: str


@dataclass
class TrialProgress(Message):
    trial_id: str
    step: int                    # the learner's last step
    evals: list                  # [(step, accuracy)] of the periodic held-out evals


@dataclass
class TrialEnded(Message):
    trial_id: str
    code: int                    # the trial process's exit status (0: trained and evaluated)
    log_tail: str = ""


@dataclass
class Trial:
    trial_id: str
    node_id: str
    node: str                    # the node's name, for people
    state: str = "starting"      # starting → running → done | failed | lost | stopped
    step: int = 0
    evals: list = field(default_factory=list)
    code: int | None = None
    log_tail: str = ""
    reason: str = ""
    submitted: float = field(default_factory=time.time)

    def summary(self) -> dict:
        """What a list of every trial shows (the evals and log tail are read one trial at a time)."""
        return {"trial_id": self.trial_id, "node": self.node, "state": self.state, "step": self.step,
                "code": self.code, "reason": self.reason}

    def public(self) -> dict:
        return {"trial_id": self.trial_id, "node": self.node, "state": self.state, "step": self.step,
                "evals": self.evals, "code": self.code, "log_tail": self.log_tail, "reason": self.reason}


class TrialBook:
    def __init__(self):
        self.trials: dict[str, Trial] = {}

    def busy(self, node_id: str) -> int:
        return sum(1 for t in self.trials.values() if t.node_id == node_id and t.state in ACTIVE)

    def capacity(self, nodes) -> dict:
        """Trial heads the live nodes host at most, and how many more they take now."""
        hosts = [n for n in nodes if n.alive and n.trials > 0]
        total = sum(n.trials for n in hosts)
        free = sum(max(0, n.trials - self.busy(n.node_id)) for n in hosts)
        return {"total": total, "free": free, "nodes": {n.name: {"trials": n.trials, "busy": self.busy(n.node_id)}
                                                        for n in hosts}}

    def place(self, trial_id: str, nodes):
        """The node a new trial goes to (the most free capacity, then by name), or why none."""
        known = self.trials.get(trial_id)
        if known is not None and known.state in ACTIVE:
            return f"trial {trial_id!r} is already {known.state} on node {known.node}"
        hosts = [n for n in nodes if n.alive and n.trials > self.busy(n.node_id)]
        if not hosts:
            cap = self.capacity(nodes)
            return (f"no free trial capacity: {cap['total']} trial slot(s) on live nodes, all busy" if cap["total"]
                    else "no live node hosts trials (join one with `actorjet join HEAD --trials N`)")
        node = max(hosts, key=lambda n: (n.trials - self.busy(n.node_id), n.name))
        self.trials.pop(trial_id, None)
        self.trials[trial_id] = Trial(trial_id, node.node_id, node.name)
        ended = [k for k, t in self.trials.items() if t.state not in ACTIVE]
        for k in ended[:max(0, len(ended) - KEEP_ENDED)]:
            del self.trials[k]
        return node

    def progress(self, msg: TrialProgress) -> bool:
        """Record it; False if the trial is not one this book expects to run (lost, stopped,
        unknown): the node should stop it."""
        t = self.trials.get(msg.trial_id)
        if t is None or t.state not in ACTIVE:
            return False
        if t.state == "starting":
            t.state = "running"
        t.step, t.evals = int(msg.step), [list(e) for e in msg.evals]
        return True

    def ended(self, msg: TrialEnded) -> Trial | None:
        t = self.trials.get(msg.trial_id)
        if t is None or t.state not in ACTIVE:
            return None
        t.code, t.log_tail = int(msg.code), str(msg.log_tail)[-4000:]
        t.state = "stopped" if t.state == "stopping" else "done" if msg.code == 0 else "failed"
        return t

    def cancel(self, trial_id: str) -> Trial | None:
        t = self.trials.get(trial_id)
        if t is not None and t.state in ("starting", "running"):
            t.state = "stopping"
        return t

    def node_lost(self, node_id: str, reason: str) -> list[Trial]:
        lost = [t for t in self.trials.values() if t.node_id == node_id and t.state in ACTIVE]
        for t in lost:
            t.state, t.reason = "lost", f"node {t.node} lost: {reason}"
        return lost
