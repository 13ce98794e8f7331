"""Where a study's trials run: on the controller's machine, or on a swarm's nodes.

The controller (controller.py) decides what runs and reads what happened; a launcher only
starts, watches and stops trials.  Both kinds answer the same four questions:

    room()            may one more trial start now?
    start(t)          start trial ``t`` (a registry row): the handle, the row's new fields and
                      where it runs (for people), or None when there was no room after all
    look(t, handle)   its evals so far and, once it is over, how it ended
    stop(t, handle)   stop it (the pruner)
    recover(t)        after a killed controller: how a trial it left running ended, if it
                      did and that can be known (a swarm keeps it), else None (it runs again)
    close()           the study is over: nothing more will start

``LocalTrials``: each trial a process of this machine (research/trial.py, forked from the
study's trial server, research/trial_server.py), at most ``budget.parallel`` at once.
``SwarmTrials``: each trial submitted to a swarm's door (``--head``), placed by its registry
on a node joined with ``--trials``; as many at once as the swarm has free trial slots, and a
trial whose node is lost is reported ``lost``, so the controller runs it again, elsewhere
(registry/trials.py).  Only the door is contacted: a controller on a laptop that can only
connect out works.
"""
from __future__ import annotations

import json
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from actorjet.errors import UserError
from actorjet.monitor import metrics
from actorjet.research import processes
from actorjet.runner.trial_runs import TRIAL_SERVER, tail
from actorjet.runtime.forks import ForkServer, Forked
from actorjet.runtime.http_json import HttpError, Unreachable, request


@dataclass
class Look:
    evals: list = field(default_factory=list)     # [(step, accuracy)]
    over: bool = False
    code: int = 0                                  # exit status of the trial (0: trained and evaluated)
    lost: bool = False                             # its node was lost: not the trial's fault
    tail: str = ""                                 # the end of its log


class LocalTrials:
    def __init__(self, study: dict, study_dir: Path):
        self.study, self.dir = study, Path(study_dir)
        self.parallel = study["budget"]["parallel"]
        self.slot_of: dict[int, int] = {}          # trial id → its slot (of budget.parallel): fixes its port
        # each running trial's metrics.jsonl, followed: re-parsing all of it every second cost
        # ~55 ms at step 80 (a step's timeline line is ~30 KB), per trial, beside the trials
        self.followers: dict[int, metrics.Follower] = {}
        self.server = ForkServer(TRIAL_SERVER, self.dir / "trials")

    def room(self) -> bool:
        return len(self.slot_of) < self.parallel

    def start(self, t: dict):
        run_dir = self.dir / "trials" / f"{t['id']:04d}-{t['stage']}-{t['arm'].replace(' ', '_')}-s{t['seed']}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        (run_dir / "job.json").write_text(json.dumps(t["job"]))
        slot = min(set(range(self.parallel)) - set(self.slot_of.values()))
        where = self.study.get("trials", {})
        port = where.get("port") and where["port"] + 2 * slot          # +1 is the head's door
        (run_dir / "trial.json").write_text(json.dumps({**where, "port": port}))
        proc = self.server.start(run_dir)
        self.slot_of[t["id"]] = slot
        return proc, {"run_dir": str(run_dir), "pid": proc.pid}, ""

    def look(self, t: dict, proc: Forked) -> Look:
        follower = self.followers.setdefault(t["id"], metrics.Follower(t["run_dir"]))
        evals = [(r["step"], r["accuracy"]) for r in follower.read() if r.get("kind") == "eval"]
        code = proc.poll()
        if code is None:
            return Look(evals)
        processes.ended(proc, t["run_dir"])
        self.slot_of.pop(t["id"], None)
        self.followers.pop(t["id"], None)
        return Look(evals, over=True, code=code, tail=tail(Path(t["run_dir"]) / "trial.log"))

    def stop(self, t: dict, proc: Forked) -> None:
        processes.stop(proc, t["run_dir"])
        self.slot_of.pop(t["id"], None)

    def close(self) -> None:
        self.server.close()

    def recover(self, t: dict) -> None:
        """A trial a killed controller left running: stop it by the PID the registry holds
        (it runs again)."""
        if t["pid"]:
            processes.stop_pid(t["pid"])

    def strays(self) -> None:
        """Trials of this study no registry row names (a controller killed between starting one
        and writing its PID left one training on, its head beside it)."""
        for pid in processes.strays(self.dir / "trials"):
            if pid != self.server.pid:
                processes.stop_pid(pid)


def door_url(head: str) -> str:
    """``http(s)://HOST:PORT`` as given, or the door of a head at HOST:PORT (its port + 1,
    as `actorjet start` places it)."""
    if head.startswith(("http://", "https://")):
        return head.rstrip("/")
    host, _, port = head.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--head must be HOST:PORT (the head's address) or the door's URL http://HOST:PORT, "
                        f"got {head!r}")
    return f"http://{host}:{int(port) + 1}"


class SwarmTrials:
    TIMEOUT_S = 15.0

    def __init__(self, study: dict, study_dir: Path, head: str, token: str):
        import hashlib

        self.study, self.dir = study, Path(study_dir)
        self.url, self.token = door_url(head), token
        # every trial id this study submits starts with it: a resumed controller finds its own
        self.free, self.asked_at = 0, 0.0         # the swarm's free trial slots, when last asked
        self.key = f"{study['hash'][:8]}-{hashlib.sha256(str(self.dir.resolve()).encode()).hexdigest()[:6]}"

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        return request(method, self.url + path, body, self.token, self.TIMEOUT_S)

    def check(self) -> dict:
        """The swarm's trial capacity, or a UserError that says why it cannot be used."""
        try:
            return self._call("GET", "/v1/actorjet/trials")["capacity"]
        except Unreachable as e:
            raise UserError(f"--head: cannot reach the head's door at {self.url}: {e.reason}") from None
        except HttpError as e:
            raise UserError(f"--head: the door at {self.url} answered {e.status}: {e.message}"
                            + (" (--token-file holds another swarm's token?)" if e.status == 401 else "")) from None

    def room(self) -> bool:
        """Free trial slots, asked at most once a second (the controller asks before every
        start); a start that finds none after all is refused by the swarm with a 409."""
        if time.monotonic() - self.asked_at > 1.0:
            try:
                self.free = self._call("GET", "/v1/actorjet/trials")["capacity"]["free"]
            except (HttpError, Unreachable):
                self.free = 0
            self.asked_at = time.monotonic()
        return self.free > 0

    def start(self, t: dict):
        remote = f"{self.key}-t{t['id']}-{secrets.token_hex(3)}"     # a re-run after a lost node: a new id
        body = {"trial_id": remote, "job": t["job"], "slots": self.study.get("trials", {}).get("slots", 2),
                "model_seed": self.study["base_job"]["train"]["seed"]}
        try:
            answer = self._call("POST", "/v1/actorjet/trials", body)
        except Unreachable:
            return None
        except HttpError as e:
            if e.status == 409 or e.status >= 500:
                self.free = 0
                return None                   # no room after all, or its registry is restarting
            raise UserError(f"the swarm refused trial {t['id']}: {e.message}") from None
        self.free -= 1
        return remote, {"run_dir": f"node {answer['node']}: trials/{remote}", "pid": None}, f" on node {answer['node']}"

    def look(self, t: dict, remote: str) -> Look:
        before = [tuple(e) for e in t["evals"]]
        try:
            body = self._call("GET", f"/v1/actorjet/trials/{remote}")
        except Unreachable:
            return Look(before)               # the head is out of reach for now: ask again
        except HttpError as e:
            if e.status == 404:               # a head whose registry restarted forgot it; its node stops it
                return Look(before, over=True, lost=True, tail="the swarm's registry forgot the trial (restarted)")
            return Look(before)
        evals = [tuple(e) for e in body["evals"]]
        if body["state"] in ("starting", "running", "stopping"):
            return Look(evals)
        return Look(evals, over=True, code=1 if body["code"] is None else body["code"], lost=body["state"] == "lost",
                    tail=body["log_tail"] or body["reason"])

    def stop(self, t: dict, remote: str) -> None:
        try:
            self._call("DELETE", f"/v1/actorjet/trials/{remote}")
        except (HttpError, Unreachable):
            pass                              # its node stops it when its progress meets the registry

    def recover(self, t: dict) -> Look | None:
        """A trial a killed controller left running: how it ended if it did (a trial that
        finished meanwhile is not run again), else None; strays() stops it if it still runs."""
        remote = (t["run_dir"] or "").rpartition("trials/")[2]
        if not remote:
            return None
        look = self.look(t, remote)
        return look if look.over else None

    def close(self) -> None:
        pass                                  # its trials' processes are the swarm's nodes'

    def strays(self) -> None:
        """Trials of this study the swarm still runs (a controller killed at any moment, even
        between submitting one and writing its id): stopped by their ids' prefix."""
        try:
            trials = self._call("GET", "/v1/actorjet/trials")["trials"]
        except (HttpError, Unreachable):
            return
        for t in trials:
            if t["trial_id"].startswith(self.key + "-") and t["state"] in ("starting", "running"):
                self.stop(t, t["trial_id"])
