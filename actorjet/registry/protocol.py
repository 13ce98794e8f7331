"""The messages of the registry's desks: work (leases, results, training progress), live
upgrades and the task table.  Spoken by the registry, the learner, gateway, engine, runner
and door actors, and by the CLI; the supervision and membership messages stay in
runtime/messages.py, below every desk.

Plain classes in an importable module: thespian pickles them between processes and nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from actorjet.runtime.messages import Message

# --- work: leases, results, training progress ---------------------------------------------

@dataclass
class LoadWeights(Message):
    version: int
    path: str
    adapter: str = ""       # a model sharing the engine's base: its adapter (engine.py)


@dataclass
class LeaseRequest(Message):
    runner_id: str
    max_groups: int
    behaviors: dict = field(default_factory=dict)   # name → version the runner already has
    per_task: int = 0            # isolation = process: groups each task may have in flight here
    busy: dict = field(default_factory=dict)        # task → groups in flight here
    tag: str = ""                # echoed in the answer (the outbound door has many askers)


@dataclass
class Leases(Message):
    leases: list                 # [{lease_id, group_id, task_name, task, urls, behavior, version, episodes, timeout_s}]
    behaviors: dict              # name → signed payload (behaviors.py), only new ones
    tag: str = ""


@dataclass
class NoWork(Message):
    retry_s: float
    reason: str = ""
    tag: str = ""


@dataclass
class Batch(Message):
    """Many control messages in one frame: the door's lease requests and results taken since
    its last turn (every 20 ms), and the registry's answers to them.  thespian spends most of a
    message's cost on the frame, not on what it carries, so at hundreds of outbound runners
    the door and the registry were busy with frames (bench/control_plane.py)."""
    messages: list


@dataclass
class AbandonLease(Message):
    """Registry → runner: this lease expired (its episodes made no LLM call for the idle
    limit, or ran past the total limit): report its unfinished episodes as failed now and
    abandon their threads, as at the runner's own time limit."""
    lease_id: str
    cause: str


@dataclass
class GroupResult(Message):
    """Runner → registry when a lease's episodes ended: each one ran and its reward is in
    every model's store (no ``error``), or it failed (``error``: why).  No rewards: the
    stores hold them and judge the group (store/completed.py); the registry only re-leases."""
    runner_id: str
    lease_id: str                # a group may be leased several times (retries): the lease answers
    results: list                # [{episode_id, error?}]


@dataclass
class Quarantined(Message):
    """Learner → registry: a group left training for good (counted in status and metrics)."""
    model: str
    group_id: str
    cause: str


@dataclass
class StoreCounts(Message):
    """Learner → registry after every step and quarantine: its model's episode store counts
    (``episodes_trained`` …), so status follows the store (a rewound group is not counted as
    trained twice)."""
    model: str
    counts: dict


@dataclass
class StoreNews(Message):
    """Gateway → registry, every second: what its model's store judged.  ``completed``: the
    groups that became complete since it last said, each with its rewards (group_id,
    task_name, behavior, version, rewards: RUN_DIR/groups.jsonl, which code produced which
    rewards); ``complete``: every group complete in the store so far (retired included:
    status's ``groups.finished``); ``untrained``: complete groups the learner has not trained
    yet (the watchdog's backlog)."""
    model: str
    completed: list
    complete: int
    untrained: int


@dataclass
class GroupsLogged(Message):
    """Registry → gateway: these groups are in groups.jsonl; mark them told (store/completed.py)."""
    group_ids: list


@dataclass
class Progress(Message):
    """Engine or gateway → registry, every second: a counter that moves while it works
    (engine: batches; gateway: turns of its server loop) and how much work waits for it
    (the registry's watchdog finds a child that is alive but stuck)."""
    model: str
    kind: str
    count: int
    waiting: int


@dataclass
class Hardware(Message):
    """Engine or learner → registry: the device it runs on (``device = "auto"`` decided there)
    and its memory (engine: the kept KV caches' budget and use, MB; learner: its share of the
    GPU), for status: at start, and from an engine every second."""
    model: str
    kind: str
    info: dict


@dataclass
class EngineReplicas(Message):
    """Gateway → registry, every second: how it spreads calls over its engine replicas
    (per replica: url, out, outstanding, served, failed; serving/engine_client.py), for status."""
    model: str
    replicas: dict


@dataclass
class Stall(Message):
    """Test hook: an engine's batcher thread, or a gateway's server loop, sleeps ``seconds``
    (a child that hangs while its process answers)."""
    seconds: float


@dataclass
class CloseEpisodes(Message):
    """Registry → gateways: these episodes ended without being trained (failed, aborted,
    expired, or their group was dropped): refuse their keys, free their recorded calls.
    ``cause`` is what an agent that still uses a key is told (with a 409)."""
    episode_ids: list
    cause: str = ""


@dataclass
class EpisodeActivity(Message):
    """Gateway → registry, once a second: the episodes that called this model since the last
    report.  The registry stamps them with its own clock (hosts share none) and keeps their
    leases alive: the episode limit is an idle limit, not a wall-clock one."""
    model: str
    episode_ids: list


@dataclass
class Resumed(Message):
    """Learner → registry when it starts from what an earlier run (or its crashed self) left:
    the checkpoint's step, the weight version it publishes, and how many groups the store made
    pending again (trained or taken after that checkpoint).  ``status`` shows it (recovered)."""
    model: str
    step: int
    weight_version: int
    pending_again: int


@dataclass
class DiskFull(Message):
    """Any writer of the run directory → registry: ``who`` (e.g. "gateway.MODEL") could not
    write for want of space (``cause``), or can again (``cause=""``).  While any report
    stands no episode is leased (actorjet/disk.py)."""
    who: str
    cause: str


@dataclass
class Trained(Message):
    """Learner → registry after each optimizer step."""
    model: str
    step: int
    weight_version: int
    groups: int
    done: bool = False
    tasks: dict = field(default_factory=dict)     # task → groups of it in this step
    evaluating: bool = False    # done, and its last evaluation is still running (Evaluated follows)


@dataclass
class Evaluated(Message):
    """Learner → registry after an evaluation's metrics lines (one per task): a learner done
    with training counts as finished only then."""
    model: str
    step: int


@dataclass
class ClientEvent(Message):
    """Gateway → registry: a client-mode episode was opened (a lease of one member, timed like
    any other), ended (its reward is in the stores) or aborted."""
    event: dict


# --- live code iteration (actorjet upgrade / rollback) -------------------------------------

@dataclass
class Upgrade(Message):
    """`actorjet upgrade` → registry: new code for the behavior of task ``upload["name"]``."""
    upload: dict                 # behaviors.py sign_upload(): {name, blob, source, sig}
    canary: int = 0              # episodes to run on one runner before anyone else gets it
    policy: str = "finish"       # finish | abort: what happens to episodes in flight on the old code
    timeout_s: float = 120.0     # for the canary


@dataclass
class Rollback(Message):
    name: str
    to: int | None = None        # None: the version that was current before this one
    policy: str = "finish"


@dataclass
class UpgradeReply(Message):
    ok: bool
    name: str
    version: int | None = None
    error: str = ""
    traceback: str = ""
    runners: list = field(default_factory=list)    # runner ids the version was pushed to


@dataclass
class BehaviorUpdate(Message):
    """Registry → runner: swap to this version between episodes (policy for the ones in flight)."""
    payload: dict                # signed: behaviors.py sign()
    policy: str = "finish"


@dataclass
class BehaviorLoaded(Message):
    """Runner → registry: the version it now runs, or why it could not load it."""
    runner_id: str
    name: str
    version: int
    error: str = ""


@dataclass
class Canary(Message):
    """Registry → one runner: load this version and run these episodes; train nothing."""
    payload: dict
    lease: dict                  # {group_id, tasks: [...], urls, episodes: [{episode_id, api_key}]}


@dataclass
class CanaryResult(Message):
    runner_id: str
    name: str
    version: int
    ok: bool
    error: str = ""
    traceback: str = ""
    rewards: list = field(default_factory=list)


# --- cocktail: tasks while training runs (actorjet task add | pause | resume | remove) -------

@dataclass
class TaskCommand(Message):
    action: str                  # add | pause | resume | remove
    name: str
    config: dict = field(default_factory=dict)   # for add: {source, behavior, weight}


@dataclass
class TaskReply(Message):
    ok: bool
    error: str = ""
    tasks: dict = field(default_factory=dict)
