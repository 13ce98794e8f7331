"""TrialHost: runs research trials on a joined node for the head's registry.

Created by the registry on a node that joined with ``--trials N`` when the first trial is
placed there (placement by node_id, like NodeLink).  It only moves messages: the processes
are runner/trial_runs.py's, the placement and states registry/trials.py's.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from thespian.actors import ActorExitRequest, ActorTypeDispatcher, WakeupMessage

from actorjet.registry import trials as tr
from actorjet.runner.trial_runs import TrialRuns
from actorjet.runtime import endpoints, logs
from actorjet.runtime.lineage import die_with_parent, exit_soon_after_sigterm
from actorjet.runtime.node import on_node

log = logs.log
POLL_S = 1.0


class TrialHost(ActorTypeDispatcher):
    @staticmethod
    def actorSystemCapabilityCheck(capabilities, requirements):
        return on_node(capabilities, requirements)

    def __init__(self):
        super().__init__()
        die_with_parent()
        exit_soon_after_sigterm()
        self.registry = None
        self.runs = TrialRuns((endpoints.node_dir() or Path(".")) / "trials")
        self.polling = False

    def receiveMessage(self, msg, sender):
        logs.ensure()
        if isinstance(msg, ActorExitRequest):
            self.runs.stop_all()           # the node leaves or the head is gone: no trial outlives us
        super().receiveMessage(msg, sender)

    def receiveMsg_RunTrial(self, msg: tr.RunTrial, sender):
        self.registry = sender
        try:
            self.runs.start(msg.trial_id, msg.job, msg.model_seed, msg.slots)
            log.info("trial %s started in %s", msg.trial_id, self.runs.base / msg.trial_id)
        except (OSError, ValueError, RuntimeError) as e:     # (RuntimeError: the trial server did not answer)
            self.send(sender, tr.TrialEnded(msg.trial_id, 1, f"the node could not start the trial: {e}"))
            return
        if not self.polling:
            self.polling = True
            self.wakeupAfter(timedelta(seconds=POLL_S))

    def receiveMsg_StopTrial(self, msg: tr.StopTrial, sender):
        self.runs.stop(msg.trial_id)

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender):
        for kind, trial_id, *rest in self.runs.poll():
            if kind == "progress":
                self.send(self.registry, tr.TrialProgress(trial_id, *rest))
            else:
                log.info("trial %s ended with exit status %s", trial_id, rest[0])
                self.send(self.registry, tr.TrialEnded(trial_id, *rest))
        self.polling = bool(self.runs.runs)
        if self.polling:
            self.wakeupAfter(timedelta(seconds=POLL_S))
