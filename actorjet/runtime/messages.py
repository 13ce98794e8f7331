"""Control-plane messages exchanged between actors.

They are plain classes in an importable module because thespian pickles them between
processes and nodes (classes defined in ``__main__`` fail remotely).  Payloads stay small
and made of plain data: big things travel over HTTP or files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


# --- supervision -----------------------------------------------------------------------

@dataclass
class Init:
    """Sent by a supervisor to a (re)started child: its spec's state, every time."""
    child_id: str
    path: str
    args: dict
    context: dict            # shared head context: registry address, run dir, job config
    supervisor: Any = None   # parent's address (None for the root)


@dataclass
class Started:
    """Reply of the root supervisor to the head process once its children are up."""
    path: str


@dataclass
class ContextUpdate:
    """A shared address changed (e.g. the registry restarted): children re-learn it."""
    context: dict


@dataclass
class ChildCrashed:
    """A managed child raised: it reports why, then exits so its supervisor restarts it."""
    child_id: str
    error: str


@dataclass
class StoppingNormally:
    """A child asks to end as finished (ManagedActor.stop_normally): a ``transient`` child is
    then not restarted; a ``permanent`` one still is."""
    child_id: str


@dataclass
class Escalated:
    """A supervisor exceeded its restart intensity, stopped its children and gave up."""
    path: str
    reason: str


@dataclass
class ChildRestarted:
    """Bubbled up to the root so the registry can count restarts per child path."""
    path: str


@dataclass
class Lookup:
    """Ask a supervisor for the address of a descendant, e.g. ``model.policy/engine``."""
    path: str
    reply_to: Any = None


@dataclass
class LookupResult:
    path: str
    address: Any   # None when there is no such child (or it is restarting)


@dataclass
class Ping:
    nonce: int = 0


@dataclass
class Pong:
    nonce: int
    pid: int
    info: dict = field(default_factory=dict)


@dataclass
class Crash:
    """Test hook understood by every managed actor: raise inside the handler (``thread``: in
    the actor's long-lived worker thread instead, where it has one — the engine's batcher)."""
    error: str = "crash requested"
    thread: bool = False


@dataclass
class Stopped:
    """Reply of the root supervisor to StopTree once every child is stopped."""
    path: str


@dataclass
class StopTree:
    """Ask a supervisor to stop its children in reverse order, then itself."""


# --- membership ------------------------------------------------------------------------

@dataclass
class WaitAdmission:
    """Sent by the `actorjet join` process to its local node agent."""
    timeout_s: float


@dataclass
class Introduce:
    """Registry → node link → node agent: admitted (with an admission id) or rejected."""
    admitted: bool
    reason: str = ""
    admission: str = ""
    registry: Any = None


@dataclass
class Admission:
    """Node agent → join process: the outcome of the join handshake."""
    admitted: bool
    reason: str = ""
    admission: str = ""


@dataclass
class RunnerHello:
    """A runner tells its node agent which admission placed it (for orphan cleanup)."""
    admission: str
    runner_id: str


@dataclass
class NodeUp:
    node_id: str
    name: str
    slots: int
    admission: str = ""
    gpus: int = 0                # what placement rules match (supervisor specs: placement = {gpus = 1})
    cpus: int = 0


@dataclass
class NodeLost:
    node_id: str
    reason: str


@dataclass
class Leaving:
    """Graceful `actorjet leave`: runners are re-placed at once, no timeout needed."""
    node_id: str


@dataclass
class Subscribe:
    """Ask the registry for node events (NodeUp / NodeLost)."""
    topic: str = "nodes"


@dataclass
class RunnersChanged:
    """The runners' supervisor → registry: the current placement, for `actorjet status`."""
    runners: list


@dataclass
class GetStatus:
    pass


@dataclass
class Status:
    data: dict


@dataclass
class ActorUp:
    """Every managed actor, once started: where it runs (for `actorjet status --actors`:
    an operator acting on a fault needs the PID and the node)."""
    path: str
    pid: int
    node: str
    host: str


@dataclass
class RestartCounts:
    """Root → registry after the registry (re)starts: restart counters per child path."""
    counts: dict


# --- training path ---------------------------------------------------------------------

@dataclass
class ServiceUp:
    """An engine, gateway or learner announces itself to the registry."""
    model: str
    kind: str             # engine | gateway | learner
    url: str | None
    address: Any


@dataclass
class Directory:
    """Registry → subscribers: where every service is, {model: {kind: {url, address}}}, and
    the task table {name: {weight, state}} (learners mix batches by it)."""
    services: dict
    tasks: dict = field(default_factory=dict)


@dataclass
class LoadWeights:
    version: int
    path: str
    adapter: str = ""       # a model sharing the engine's base: its adapter (engine.py)


@dataclass
class LeaseRequest:
    runner_id: str
    max_groups: int
    behaviors: dict = field(default_factory=dict)   # name → version the runner already has
    per_task: int = 0            # isolation = process: groups each task may have in flight here
    busy: dict = field(default_factory=dict)        # task → groups in flight here
    tag: str = ""                # echoed in the answer (the outbound door has many askers)


@dataclass
class Leases:
    leases: list                 # [{lease_id, group_id, task_name, task, urls, behavior, version, episodes, timeout_s}]
    behaviors: dict              # name → signed payload (behaviors.py), only new ones
    tag: str = ""


@dataclass
class NoWork:
    retry_s: float
    reason: str = ""
    tag: str = ""


@dataclass
class AbandonLease:
    """Registry → runner: this lease expired (its episodes made no LLM call for the idle
    limit, or ran past the total limit): report its unfinished episodes as failed now and
    abandon their threads, as at the runner's own time limit."""
    lease_id: str
    cause: str


@dataclass
class GroupResult:
    runner_id: str
    lease_id: str                # a group may be leased several times (retries): the lease answers
    results: list                # [{episode_id, reward, error}]


@dataclass
class Quarantined:
    """Learner → registry: a group left training for good (counted in status and metrics)."""
    model: str
    group_id: str
    cause: str


@dataclass
class StoreCounts:
    """Learner → registry after every step and quarantine: its model's episode store counts
    (``episodes_trained`` …), so status follows the store (a rewound group is not counted as
    trained twice)."""
    model: str
    counts: dict


@dataclass
class Progress:
    """Engine or gateway → registry, every second: a counter that moves while it works
    (engine: batches; gateway: turns of its server loop) and how much work waits for it
    (the registry's watchdog finds a child that is alive but stuck)."""
    model: str
    kind: str
    count: int
    waiting: int


@dataclass
class Stall:
    """Test hook: an engine's batcher thread, or a gateway's server loop, sleeps ``seconds``
    (a child that hangs while its process answers)."""
    seconds: float


@dataclass
class Metric:
    """Learner → registry: one metrics.jsonl record (train step or eval).  The registry writes
    the run's metrics.jsonl on the head, wherever the learner runs."""
    record: dict


@dataclass
class CloseEpisodes:
    """Registry → gateways: these episodes ended without being trained (failed, aborted,
    expired, or their group was dropped): refuse their keys, free their recorded calls.
    ``cause`` is what an agent that still uses a key is told (with a 409)."""
    episode_ids: list
    cause: str = ""


@dataclass
class EpisodeActivity:
    """Gateway → registry, once a second: the episodes that called this model since the last
    report.  The registry stamps them with its own clock (hosts share none) and keeps their
    leases alive: the episode limit is an idle limit, not a wall-clock one."""
    model: str
    episode_ids: list


@dataclass
class RunnerDown:
    """The runners' supervisor → registry: this runner's process died; re-queue its leases now."""
    runner_id: str


@dataclass
class Trained:
    """Learner → registry after each optimizer step."""
    model: str
    step: int
    weight_version: int
    groups: int
    done: bool = False
    tasks: dict = field(default_factory=dict)     # task → groups of it in this step
    evaluating: bool = False    # done, and its last evaluation is still running (Evaluated follows)


@dataclass
class Evaluated:
    """Learner → registry after an evaluation's metrics lines (one per task): a learner done
    with training counts as finished only then."""
    model: str
    step: int


@dataclass
class ClientEvent:
    """Gateway → registry: a client-mode episode was opened, ended or aborted."""
    event: dict


# --- live code iteration (actorjet upgrade / rollback) -------------------------------------

@dataclass
class Upgrade:
    """`actorjet upgrade` → registry: new code for the behavior of task ``upload["name"]``."""
    upload: dict                 # behaviors.py sign_upload(): {name, blob, source, sig}
    canary: int = 0              # episodes to run on one runner before anyone else gets it
    policy: str = "finish"       # finish | abort: what happens to episodes in flight on the old code
    timeout_s: float = 120.0     # for the canary


@dataclass
class Rollback:
    name: str
    to: int | None = None        # None: the version that was current before this one
    policy: str = "finish"


@dataclass
class UpgradeReply:
    ok: bool
    name: str
    version: int | None = None
    error: str = ""
    traceback: str = ""
    runners: list = field(default_factory=list)    # runner ids the version was pushed to


@dataclass
class BehaviorUpdate:
    """Registry → runner: swap to this version between episodes (policy for the ones in flight)."""
    payload: dict                # signed: behaviors.py sign()
    policy: str = "finish"


@dataclass
class BehaviorLoaded:
    """Runner → registry: the version it now runs, or why it could not load it."""
    runner_id: str
    name: str
    version: int
    error: str = ""


@dataclass
class Canary:
    """Registry → one runner: load this version and run these episodes; train nothing."""
    payload: dict
    lease: dict                  # {group_id, tasks: [...], urls, episodes: [{episode_id, api_key}]}


@dataclass
class CanaryResult:
    runner_id: str
    name: str
    version: int
    ok: bool
    error: str = ""
    traceback: str = ""
    rewards: list = field(default_factory=list)


# --- cocktail: tasks while training runs (actorjet task add | pause | resume | remove) -------

@dataclass
class TaskCommand:
    action: str                  # add | pause | resume | remove
    name: str
    config: dict = field(default_factory=dict)   # for add: {source, behavior, weight}


@dataclass
class TaskReply:
    ok: bool
    error: str = ""
    tasks: dict = field(default_factory=dict)

