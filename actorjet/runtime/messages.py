"""Control-plane messages exchanged between actors.

They are plain classes in an importable module because thespian pickles them between
processes and nodes (classes defined in ``__main__`` fail remotely).  Payloads stay small
and made of plain data: big things travel over HTTP or files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Message:
    """The base of every control-plane message: its ``str`` is its type's name.

    Why: thespian formats ``str(message)`` for its own debug log when a message is sent,
    transmitted and received (systemCommon, asyncTransportBase, actorManager), even with that
    log off, and a dataclass's str is its whole repr: 0.84 ms a time for a step's timeline
    record of 256 episodes, 1.4 µs for a small message.  Its name is all that log needs, and a
    lease's API keys no longer reach thespian.log when that log is on.  ``repr`` stays whole.
    """
    __slots__ = ()

    def __str__(self) -> str:
        return type(self).__name__


# --- supervision -----------------------------------------------------------------------

@dataclass
class Init(Message):
    """Sent by a supervisor to a (re)started child: its spec's state, every time."""
    child_id: str
    path: str
    args: dict
    context: dict            # shared head context: registry address, run dir, job config
    supervisor: Any = None   # parent's address (None for the root)
    incarnation: int = 0     # which start of this child it is, counted by its supervisor (ServiceUp)


@dataclass
class Started(Message):
    """Reply of the root supervisor to the head process once its children are up; its pid
    lets the head stop waiting on a root that is gone (runtime/head.py ``stop``)."""
    path: str
    pid: int = 0


@dataclass
class ContextUpdate(Message):
    """A shared address changed (e.g. the registry restarted): children re-learn it."""
    context: dict


@dataclass
class ChildCrashed(Message):
    """A managed child raised: it reports why, then exits so its supervisor restarts it."""
    child_id: str
    error: str


@dataclass
class StoppingNormally(Message):
    """A child asks to end as finished (ManagedActor.stop_normally): a ``transient`` child is
    then not restarted; a ``permanent`` one still is."""
    child_id: str


@dataclass
class Escalated(Message):
    """A supervisor exceeded its restart intensity, stopped its children and gave up."""
    path: str
    reason: str


@dataclass
class ChildRestarted(Message):
    """Bubbled up to the root so the registry can count restarts per child path."""
    path: str


@dataclass
class Lookup(Message):
    """Ask a supervisor for the address of a descendant, e.g. ``model.policy/engine``."""
    path: str
    reply_to: Any = None


@dataclass
class LookupResult(Message):
    path: str
    address: Any   # None when there is no such child (or it is restarting)


@dataclass
class Ping(Message):
    nonce: int = 0


@dataclass
class Pong(Message):
    nonce: int
    pid: int
    info: dict = field(default_factory=dict)


@dataclass
class Crash(Message):
    """Test hook understood by every managed actor: raise inside the handler (``thread``: in
    the actor's long-lived worker thread instead, where it has one — the engine's batcher)."""
    error: str = "crash requested"
    thread: bool = False


@dataclass
class Stopped(Message):
    """Reply of the root supervisor to StopTree once every child is stopped."""
    path: str


@dataclass
class StopTree(Message):
    """Ask a supervisor to stop its children in reverse order, then itself."""


# --- membership ------------------------------------------------------------------------

@dataclass
class WaitAdmission(Message):
    """Sent by the `actorjet join` process to its local node agent."""
    timeout_s: float


@dataclass
class Introduce(Message):
    """Registry → node link → node agent: admitted (with an admission id) or rejected."""
    admitted: bool
    reason: str = ""
    admission: str = ""
    registry: Any = None


@dataclass
class Admission(Message):
    """Node agent → join process: the outcome of the join handshake."""
    admitted: bool
    reason: str = ""
    admission: str = ""


@dataclass
class RunnerHello(Message):
    """A runner tells its node agent which admission placed it (for orphan cleanup)."""
    admission: str
    runner_id: str


@dataclass
class NodeUp(Message):
    node_id: str
    name: str
    slots: int
    admission: str = ""
    gpus: int = 0                # what placement rules match (supervisor specs: placement = {gpus = 1})
    cpus: int = 0


@dataclass
class NodeLost(Message):
    node_id: str
    reason: str


@dataclass
class Leaving(Message):
    """Graceful `actorjet leave`: runners are re-placed at once, no timeout needed."""
    node_id: str


@dataclass
class Subscribe(Message):
    """Ask the registry for node events (NodeUp / NodeLost), or for the directory.  ``path``:
    the subscriber's place in the tree, so a restarted subscriber replaces its old self."""
    topic: str = "nodes"
    path: str = ""


@dataclass
class RunnersChanged(Message):
    """The runners' supervisor → registry: the current placement, for `actorjet status`."""
    runners: list


@dataclass
class ChildrenWaiting(Message):
    """A supervisor → registry: its children that wait for a node matching their placement
    ({child id: placement}; empty: none waits), so `actorjet status` says what waits and why."""
    path: str
    waiting: dict


@dataclass
class GetStatus(Message):
    pass


@dataclass
class Status(Message):
    data: dict


@dataclass
class ActorUp(Message):
    """Every managed actor, once started: where it runs (for `actorjet status --actors`:
    an operator acting on a fault needs the PID and the node)."""
    path: str
    pid: int
    node: str
    host: str


@dataclass
class RestartCounts(Message):
    """Root → registry after the registry (re)starts: restart counters per child path."""
    counts: dict


# --- services ------------------------------------------------------------------------------

@dataclass
class ServiceUp(Message):
    """An engine, gateway or learner announces itself to the registry (with who supervises
    it, so the watchdog can have a stalled one restarted even if it no longer answers)."""
    model: str
    kind: str             # engine | gateway | learner
    url: str | None
    address: Any
    supervisor: Any = None
    child_id: str = ""
    pid: int = 0
    # An incarnation stopped while it started (its node was lost, say) may still announce
    # after its successor did: the registry keeps the newest one (registry/episodes.py).
    incarnation: int = 0


@dataclass
class RestartStalled(Message):
    """Registry's watchdog → the supervisor of a stalled child, alongside the Crash it sends
    the child.  A child that is hung (cannot run the Crash) or dead without thespian's exit
    notice (seen once: a SIGKILLed engine never restarted) would otherwise stay down: if the
    same incarnation still holds the slot after a grace period, the supervisor ends it (its
    PID, when it runs on the supervisor's own machine) and restarts it as a failure."""
    child_id: str
    address: Any
    pid: int = 0
    reason: str = ""


@dataclass
class Directory(Message):
    """Registry → subscribers: where every service is, {model: {kind: {url, address}}}, and
    the task table {name: {weight, state}} (learners mix batches by it)."""
    services: dict
    tasks: dict = field(default_factory=dict)


@dataclass
class Metric(Message):
    """Learner → registry: one metrics.jsonl record (train step or eval).  The registry writes
    the run's metrics.jsonl on the head, wherever the learner runs."""
    record: dict


@dataclass
class RunnerDown(Message):
    """The runners' supervisor → registry: this runner's process died; re-queue its leases now."""
    runner_id: str
