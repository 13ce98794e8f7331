"""What the learners and the episode stores tell the registry, and the run's history files.

The registry hears each learner's progress (``Trained``, ``Evaluated``), its store counts
(``StoreCounts``), what it resumed from after a restart (``Resumed``) and its metrics lines
(``Metric``: metrics.jsonl and TensorBoard live on the head, whichever node trains); and from
each gateway, what its model's store judged (``StoreNews``: the groups newly complete, for
groups.jsonl; how many are complete; how many wait for the learner).  This desk keeps all of
it, so status, the lease desk (groups trained per task: the staleness bound) and the watchdog
(a learner's backlog) read one place.  "Done" is the stores' word: ``finished_groups`` is the
stores' complete count, never a count of the registry's own.

A plain state object like the other desks: ``handlers()`` maps its message types to methods
that return the messages to send.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from actorjet import disk
from actorjet.monitor import metrics, tensorboard_events
from actorjet.registry import protocol as proto
from actorjet.registry.group_log import GroupLog
from actorjet.runtime import messages as m

RECENT_STEPS = 60         # learner steps per model kept for status / `actorjet top`
REWIND_STEPS = 10_000     # steps per model whose groups a learner's rewind can take back (see on_Resumed)
RECENT_KEYS = ("step", "time", "reward_mean", "batch_wait_s", "train_s", "publish_s", "step_time_s",
               "staleness_mean", "tokens", "token_ratio", "by_task", "rank_step_s")

Out = list


class LearnerDesk:
    def __init__(self, run_dir: str | None, train: dict, full_disks: disk.FullDisks,
                 swarm_line: Callable[[], dict]):
        """``swarm_line``: the swarm's counters as a metrics line (written after every step)."""
        self.run_dir = run_dir
        self.full_disks = full_disks
        self.swarm_line = swarm_line
        self.tb = tensorboard_events.EventWriter(run_dir) if train.get("tensorboard") and run_dir else None
        self.metrics = metrics.Writer(run_dir) if run_dir else None
        self.group_log = GroupLog(run_dir)           # RUN_DIR/groups.jsonl, from the stores' news
        self.models: dict[str, dict] = {}            # name → {weight_version, learner_step, consumed, …}
        self.counted: dict[str, dict[int, tuple]] = {}    # model → step → (groups, tasks) counted as consumed
        self.recent: dict[str, deque] = {}           # model → its last train lines
        self.accuracy: dict[str, dict[str, float]] = {}   # model → task → last held-out accuracy
        self.store_counts: dict[str, dict] = {}      # each learner's counts of its episode store
        self.recovered: dict[str, dict] = {}         # model → what its learner resumed from (Resumed)
        self.untrained: dict[str, int] = {}          # model → complete groups its learner has not trained
        self.store_complete: dict[str, int] = {}     # model → groups its store judged complete (StoreNews)
        self.finished = False

    def handlers(self) -> dict:
        return {
            m.Metric: self.on_Metric, proto.Trained: self.on_Trained, proto.Evaluated: self.on_Evaluated,
            proto.StoreNews: self.on_StoreNews,
            proto.StoreCounts: lambda msg, sender: keep_latest(self.store_counts, msg.model, msg.counts),
            proto.Resumed: self.on_Resumed,
        }

    def learner_up(self, model: str) -> None:
        self.models.setdefault(model, {"weight_version": 0, "learner_step": 0, "consumed": 0})

    # -- what the stores say ------------------------------------------------------------
    def on_StoreNews(self, msg: proto.StoreNews, sender) -> Out:
        """A gateway's store judged these groups complete (groups.jsonl; the gateway marks them
        told when it hears back), holds this many complete groups, and this many its learner
        has not trained (the backlog)."""
        groups = self.group_log.add(msg.completed if isinstance(msg.completed, list) else [])
        self.full_disks.report("registry (groups.jsonl)", self.group_log.cause)
        if isinstance(msg.untrained, int):
            self.untrained[str(msg.model)] = msg.untrained
        if isinstance(msg.complete, int):
            self.store_complete[str(msg.model)] = msg.complete
        return [(sender, proto.GroupsLogged(groups))] if groups else []

    def finished_groups(self) -> int:
        """Groups complete, as the stores count them (a group that calls several models is
        complete in each of their stores: the largest count)."""
        return max(self.store_complete.values(), default=0)

    def episodes_trained(self) -> int:
        return max((n.get("episodes_trained", 0) for n in self.store_counts.values()), default=0)

    # -- learners -----------------------------------------------------------------------
    def on_Metric(self, msg: m.Metric, sender) -> Out:
        """The run's metrics.jsonl lives on the head, whichever node the learner runs on.  The
        last steps are also kept for status (`actorjet top` draws from them)."""
        if not isinstance(msg.record, dict):
            return []
        self.record(msg.record)
        model = str(msg.record.get("model", ""))
        if msg.record.get("kind") == "train":
            self.recent.setdefault(model, deque(maxlen=RECENT_STEPS)).append(
                {k: msg.record.get(k) for k in RECENT_KEYS if k in msg.record})
        elif msg.record.get("kind") == "eval":
            self.accuracy.setdefault(model, {})[str(msg.record.get("task", ""))] = msg.record.get("accuracy")
        return []

    def on_Evaluated(self, msg: proto.Evaluated, sender) -> Out:
        info = self.models.get(msg.model, {})
        if info.get("evaluating_step") is not None and msg.step == info["evaluating_step"]:
            info["evaluating_step"] = None
            self.finished = True
        return []

    def on_Trained(self, msg: proto.Trained, sender) -> Out:
        info = self.models.setdefault(msg.model, {"weight_version": 0, "learner_step": 0, "consumed": 0})
        info.update(weight_version=msg.weight_version, learner_step=msg.step)
        counted = self.counted.setdefault(msg.model, {})
        if msg.groups:                   # (none: a finished run started again says it is done)
            if msg.step in counted:      # trained again after a rewind no Resumed told of: counted once
                self._count(msg.model, counted.pop(msg.step), -1)
            counted[msg.step] = (msg.groups, dict(msg.tasks))
            self._count(msg.model, counted[msg.step], +1)
            while len(counted) > REWIND_STEPS:
                counted.pop(next(iter(counted)))
        if msg.done and msg.evaluating:      # done training; finished when its last evaluation reports
            info["evaluating_step"] = msg.step
        elif msg.done:
            self.finished = True
        self.record({"kind": "swarm", "model": msg.model, "step": msg.step, **self.swarm_line()})
        return []

    def on_Resumed(self, msg: proto.Resumed, sender) -> Out:
        """A restarted learner rewound its store to its checkpoint's step: the groups it had
        trained after it are pending again and will be trained again, so they are no longer
        consumed.  Left counted, every learner restart would widen the staleness window (the
        lease desk's room is groups issued less groups consumed) by the steps it lost."""
        keep_latest(self.recovered, msg.model, {**vars(msg), "time": time.time()})
        counted = self.counted.get(msg.model, {})
        if isinstance(msg.step, int):
            for step in [s for s in counted if s > msg.step]:
                self._count(msg.model, counted.pop(step), -1)
        return []

    def _count(self, model: str, step: tuple, sign: int) -> None:
        """Add one step's groups (``step``: its (groups, tasks)) to the model's consumed counts,
        or take them out (``sign=-1``)."""
        groups, tasks = step
        info = self.models[model]
        info["consumed"] += sign * groups
        per_task = info.setdefault("consumed_by_task", {})
        for task, n in tasks.items():
            per_task[task] = per_task.get(task, 0) + sign * n

    def consumed(self, tasks: list[str]) -> dict[str, int]:
        """Groups trained per task (the slowest model decides)."""
        return {t: min((v.get("consumed_by_task", {}).get(t, 0) for v in self.models.values()), default=0)
                for t in tasks}

    # -- the history files ----------------------------------------------------------------
    def record(self, record: dict) -> None:
        """A metrics line: metrics.jsonl on the head, and TensorBoard when asked for (a line
        that meets a full disk waits in the writer; TensorBoard, a second view, skips it)."""
        if not self.run_dir:
            return
        record = {"time": time.time(), **record}
        self.full_disks.report("registry (metrics.jsonl)", self.metrics.write(record))
        if self.tb is not None and not self.metrics.cause:
            try:
                self.tb.write(record)
            except OSError as e:
                if not disk.is_full(e):
                    raise

    def retry_writes(self) -> None:
        """Lines that met a full disk go out once there is room (every registry tick)."""
        if self.metrics is not None and self.metrics.waiting:
            self.full_disks.report("registry (metrics.jsonl)", self.metrics.write())

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def keep_latest(table: dict, model, report) -> Out:
    """A per-model report kept for status as it last came (a learner's store counts, a
    gateway's engine replicas, an engine's hardware)."""
    if isinstance(report, dict):
        table[str(model)] = dict(report)
    return []
