"""A soak run: the quickstart's job trained without end across network-namespace hosts, a
fault every few minutes, and every process's memory, the run directory's disk, the step rate,
node losses and the episode store's books sampled throughout.  Shared by bench/soak.py (60
minutes, the issue's figure) and tests/test_soak.py (a few minutes, the same checks).

Hosts: the head (registry, model), node "a" (joined), node "b" (outbound-only: it can only
connect out, through the door).  Faults, in a shuffled cycle: a runner killed, the learner
killed, the gateway killed, node a's network cut for 10 s, the head killed and started again.
Node timeouts stay at their default (6 s): a loss outside a network cut is a false alarm.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import hosts
import jobs
from actorjet.config import MODEL_DEFAULTS
from swarm import REPO, Swarm

FAULTS = ("runner", "learner", "gateway", "netcut", "head")
CUT_S = 10.0
NODE_TIMEOUT_S = 6.0            # the default of `actorjet start`
GROUPS = 8
HISTORY = ("metrics.jsonl", "groups.jsonl")     # one line per step / per group, kept for good
KEEP_LAST = MODEL_DEFAULTS["checkpoint_keep_last"]    # the soak's job keeps the defaults
KEEP_BEST = MODEL_DEFAULTS["checkpoint_keep_best"]


@dataclass
class Sample:
    t: float                     # seconds since the start
    step: int
    disk_bytes: int              # the run directory, all of it
    history_bytes: int           # of which its append-only history: metrics.jsonl, groups.jsonl
    rss: dict[int, tuple[str, int]]      # pid → (role, bytes)
    cpu: dict[int, float] = field(default_factory=dict)     # pid → CPU seconds (user + system) so far
    parts: dict[str, int] = field(default_factory=dict)     # top-level entry of the run directory → bytes
    checkpoints: int = 0         # checkpoint directories of the busiest model at once


@dataclass
class Soak:
    swarm: Swarm
    net: hosts.Network
    tmp: Path
    seed: int = 0
    episode_s: float = 0.0       # each episode waits this long first (an agent's tool time); 0: none
    samples: list[Sample] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)      # (t, what)
    accounted: int = 0           # groups the registries issued, less those dropped or still open, over head restarts

    def start(self) -> None:
        self.lock = threading.RLock()
        self.run = self.tmp / "run"
        self.job = self.tmp / "job.toml"
        behavior = "agents.arithmetic:behavior"
        if self.episode_s:          # every episode "hangs" that long, then runs as ever (agents/flaky_arithmetic.py)
            behavior = "agents.flaky_arithmetic:behavior"
            self.swarm.env.update(AJ_FLAKY_RAISE="0", AJ_FLAKY_HANG="1", AJ_FLAKY_HANG_S=str(self.episode_s))
        self.job.write_text(jobs.tiny_arith(10 ** 6, group_size=8, groups_per_step=GROUPS, runner_concurrency=16,
                                            model="checkpoint_every = 10", behavior=behavior))
        self.tree = str(REPO / "supervisors" / "default.toml")
        self.head_host, self.a, self.b = self.net.host("head"), self.net.host("a"), self.net.host("b")
        self.net.outbound_only(self.b)
        self._head()
        self.swarm.join(self.port, self.token, "a", slots=2, head_host=self.head_host.ip, host=self.a)
        self.swarm.outbound(self.door, self.token, "b", slots=2, host=self.b)
        self.t0 = time.time()
        self.stop = threading.Event()

    def _head(self, port: int | None = None) -> None:
        proc, self.port, self.token = self.swarm.head(self.run, self.tree, port=port, host=self.head_host,
                                                      node_timeout=NODE_TIMEOUT_S, extra=["--config", str(self.job)])
        self.door = proc.wait_for(r"actorjet join --outbound (\S+)").group(1)

    def ctl(self, verb: str, *args) -> dict:
        with self.lock:          # one headctl pipe, asked from the sampler and the main thread
            return self.swarm.ctl(self.head_host, verb, self.port, *args)

    def status(self) -> dict:
        return self.ctl("status")

    def step(self) -> int:
        with contextlib.suppress(Exception):
            models = self.status()["models"]
            return models[0]["learner_step"] if models else 0
        return -1

    # -- sampling --------------------------------------------------------------------------
    def _sample_loop(self, every_s: float = 10.0) -> None:
        while not self.stop.wait(every_s):
            with contextlib.suppress(Exception):
                self.samples.append(self.sample())

    def sample(self) -> Sample:
        roles = {}
        with contextlib.suppress(Exception):
            roles = {a["pid"]: a["path"].removeprefix("root/") for a in self.status()["actors"]}
        rss, cpu = {}, {}
        for host in (self.head_host, self.a, self.b):
            for p in self.swarm.host_processes(host):
                with contextlib.suppress(psutil.Error):
                    role = roles.get(p.pid) or _role(p.cmdline(), host.name)
                    if not role.endswith("headctl"):       # the bench's own helper
                        rss[p.pid] = (role, p.memory_info().rss)
                        times = p.cpu_times()
                        cpu[p.pid] = times.user + times.system
        parts = {}
        for child in list(self.run.iterdir()) if self.run.is_dir() else []:
            with contextlib.suppress(OSError):
                parts[child.name] = _du(child)
        history = sum(parts.get(name, 0) for name in HISTORY)
        checkpoints = max((len(list(m.glob("step_*"))) for m in (self.run / "checkpoints").glob("*")), default=0)
        return Sample(time.time() - self.t0, self.step(), sum(parts.values()), history, rss, cpu, parts, checkpoints)

    # -- faults ----------------------------------------------------------------------------
    def fault(self, what: str) -> None:
        self.faults.append((time.time() - self.t0, what))
        if what in ("runner", "learner", "gateway"):
            path = {"runner": "runners/runner-a-0", "learner": "model.policy/learner",
                    "gateway": "model.policy/gateway"}[what]
            pid = self.ctl("pid", path)["pid"]
            if pid:
                os.kill(pid, signal.SIGKILL)
        elif what == "netcut":
            self.net.cut(self.a)
            time.sleep(CUT_S)
            self.net.restore(self.a)
        elif what == "head":
            with self.lock:
                with contextlib.suppress(Exception):
                    self.accounted += owed(self.status()["groups"])
                self.swarm.kill_host(self.head_host)
                self._head(self.port)

    def run_for(self, seconds: float, fault_every_s: float, sample_s: float = 10.0,
                faults_from_s: float | None = None, faults_until_s: float | None = None) -> None:
        """Train for ``seconds`` with a fault every ``fault_every_s``, from ``faults_from_s``
        (default: one gap in) until ``faults_until_s`` (default: half a gap before the end)."""
        rng = random.Random(self.seed)
        cycle: list[str] = []
        self.sampler = threading.Thread(target=self._sample_loop, args=(sample_s,), daemon=True)
        self.sampler.start()
        start = time.time()
        deadline = start + seconds
        next_fault = start + (fault_every_s if faults_from_s is None else faults_from_s)
        last_fault = start + (seconds - fault_every_s / 2 if faults_until_s is None else faults_until_s)
        while time.time() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.time())))
            if next_fault <= time.time() < last_fault:
                if not cycle:
                    cycle = list(FAULTS)
                    rng.shuffle(cycle)
                self.fault(cycle.pop())
                next_fault += fault_every_s          # (a slow fault, a head restart, eats into the gap)
        self.stop.set()
        self.sampler.join(timeout=30)
        self.samples.append(self.sample())

    # -- the figures -----------------------------------------------------------------------
    def report(self, warmup_s: float, window_s: float) -> dict:
        """Memory growth of each process from its own ``warmup_s`` on (judged if it lived a
        ``window_s`` past it); disk in the last ``window_s`` against its high before; step rate
        in the first and last ``window_s`` after the warm-up; false node losses; the books."""
        end = self.samples[-1].t
        growth = {}
        for pid in {pid for s in self.samples for pid in s.rss}:
            mine = [(s.t, *s.rss[pid]) for s in self.samples if pid in s.rss]
            after = [x for x in mine if x[0] >= mine[0][0] + warmup_s]      # past its own warm-up
            if len(after) < 3 or after[-1][0] - after[0][0] < window_s:
                continue             # too short-lived to judge (killed, or started late)
            base, last = after[0][2], max(x[2] for x in after[-max(1, len(after) // 10):])
            growth[f"{after[0][1]} ({pid})"] = {"rss_mb_at_warmup": base / 2 ** 20, "rss_mb_at_end": last / 2 ** 20,
                                                "growth": last / base - 1, "judged_s": after[-1][0] - after[0][0],
                                                "slope_mb_per_h": (last - base) / 2 ** 20 / max(1e-9, (end - after[0][0]) / 3600)}
        # what retention bounds by bytes; checkpoints it bounds by count (judged below): a
        # sample that catches one being written before the oldest goes holds one more, and
        # 3 s samples catch that moment by chance (a whole checkpoint: +12 MB, +17% here)
        state = [(s.t, s.disk_bytes - s.history_bytes - s.parts.get("checkpoints", 0)) for s in self.samples]
        # flat: the last window sets no new high (a bounded step earlier — keep_best's checkpoint
        # once one is scored — is not growth; a trend is)
        disk_mid = max((b for t, b in state if warmup_s <= t < end - window_s), default=0)
        disk_end = max((b for t, b in state if t >= end - window_s), default=0)
        # which parts of the run directory made the difference between those two highs
        at = {b: s.parts for (t, b), s in zip(state, self.samples)}
        mid_parts, end_parts = at.get(disk_mid, {}), at.get(disk_end, {})
        moved = {name: (mid_parts.get(name, 0) / 2 ** 20, end_parts.get(name, 0) / 2 ** 20)
                 for name in sorted(set(mid_parts) | set(end_parts)) if name not in HISTORY + ("checkpoints",)
                 and abs(end_parts.get(name, 0) - mid_parts.get(name, 0)) >= 2 ** 19}
        steps = max(1, _steps_between(self.samples, 0, end))
        history_per_1k_steps = (self.samples[-1].history_bytes - self.samples[0].history_bytes) / steps * 1000
        rate = lambda a, b: _steps_between(self.samples, a, b) / max(1e-9, b - a) * 60  # noqa: E731
        first, last = rate(warmup_s, warmup_s + window_s), rate(end - window_s, end)
        # the same windows per CPU-second the swarm spent: what a slower system costs, whatever
        # else the machine runs beside it (the suite's soak shares its two cores)
        per_cpu = lambda a, b: _steps_between(self.samples, a, b) / max(1e-9, _cpu_between(self.samples, a, b))  # noqa: E731
        cpu_first, cpu_last = per_cpu(warmup_s, warmup_s + window_s), per_cpu(end - window_s, end)
        return {"minutes": end / 60, "faults": self.faults, "processes": growth,
                "max_growth": max((g["growth"] for g in growth.values()), default=0.0),
                "disk_mb_before_last_window": disk_mid / 2 ** 20, "disk_mb_at_end": disk_end / 2 ** 20,
                "disk_mb_moved_by_part": moved,
                "checkpoints_at_once": max((s.checkpoints for s in self.samples), default=0),
                "history_mb_at_end": self.samples[-1].history_bytes / 2 ** 20,
                "history_kb_per_1k_steps": history_per_1k_steps / 2 ** 10, "steps": steps,
                "steps_per_min_first": first, "steps_per_min_last": last,
                "step_rate_change": last / first - 1 if first else None,
                "steps_per_cpu_s_first": cpu_first, "steps_per_cpu_s_last": cpu_last,
                "cpu_step_rate_change": cpu_last / cpu_first - 1 if cpu_first else None,
                "node_losses": self.node_losses(), **self.books(),
                "series": {"t": [s.t for s in self.samples], "step": [s.step for s in self.samples],
                           "disk_mb": [s.disk_bytes / 2 ** 20 for s in self.samples],
                           "history_mb": [s.history_bytes / 2 ** 20 for s in self.samples],
                           "rss_mb_by_role": _by_role(self.samples)}}

    def node_losses(self) -> dict:
        """Losses in the head's logs; one inside a network cut (+ the timeout) is expected."""
        cuts = [t for t, what in self.faults if what == "netcut"]
        true_, false_ = [], []
        for log in (self.run / "logs").rglob("actors.log*"):
            for line in log.read_text(errors="replace").splitlines():
                m = re.match(r"(\S+ \S+),\d+ \d+ WARNING node (\S+) lost: (.*)", line)
                if not m:
                    continue
                t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) - self.t0
                cut = m.group(2) == "a" and any(c - 1 <= t <= c + CUT_S + NODE_TIMEOUT_S + 5 for c in cuts)
                left = m.group(3).startswith("left (actorjet leave)")        # a node told us it leaves
                (true_ if cut or left else false_).append(f"{t:.0f}s {m.group(2)}: {m.group(3)}")
        return {"during_cuts_or_leaves": true_, "false": false_}     # (a convention drop counts: it must be in a cut)

    def books(self) -> dict:
        """Nothing lost, nothing twice: every group a registry issued is complete in the store
        (or retired by retention), dropped with a cause, or open when its head stopped; none has
        more members than its size.  (The registry keeps no count of finished groups: the
        store's word is the only one, so the check is against what the registries issued.)"""
        with contextlib.suppress(Exception):
            self.accounted += owed(self.status()["groups"])
        db = sqlite3.connect(self.run / "episodes-policy.sqlite")
        complete, trained = db.execute("SELECT COUNT(*), COUNT(trained_step) FROM groups "
                                       "WHERE complete_at IS NOT NULL").fetchone()
        retired = (db.execute("SELECT groups FROM retired").fetchone() or (0,))[0]
        (extra,) = db.execute("SELECT COALESCE(SUM(n - size), 0) FROM (SELECT g.size, COUNT(DISTINCT e.member) n "
                              "FROM groups g JOIN episodes e USING (group_id) WHERE g.complete_at IS NOT NULL "
                              "GROUP BY g.group_id) WHERE n > size").fetchone()
        per_step = db.execute("SELECT MAX(n) FROM (SELECT COUNT(*) n FROM groups WHERE trained_step IS NOT NULL "
                              "GROUP BY trained_step)").fetchone()[0] or 0
        return {"groups_issued_not_dropped_or_open": self.accounted, "groups_in_store_or_retired": complete + retired,
                "groups_lost": max(0, self.accounted - complete - retired),
                "episodes_duplicated": extra, "most_groups_in_one_step": per_step}


def owed(groups: dict) -> int:
    """Of one head's issued groups, those that must be complete in the store: all but the
    dropped and the still open (status's ``groups``)."""
    return groups["issued"] - groups["dropped"] - groups["groups_open"]


def verdicts(r: dict) -> list[tuple[str, str, str, bool]]:
    """(measure, result, target, met) rows: the soak's targets."""
    change, cpu_change = r["step_rate_change"], r.get("cpu_step_rate_change")
    worst = max(r["processes"].items(), key=lambda kv: kv[1]["growth"], default=("-", {"growth": 0.0}))
    disk_change = r["disk_mb_at_end"] / r["disk_mb_before_last_window"] - 1 if r["disk_mb_before_last_window"] else 0.0
    return [
        ("minutes, faults", f"{r['minutes']:.1f}, {len(r['faults'])}", "≥ 60, one per 5 min", True),
        ("largest memory growth after warm-up", f"{worst[1]['growth']:+.1%} ({worst[0]})", "≤ +10%",
         worst[1]["growth"] <= 0.10),
        ("checkpoints on disk at once, most", f"{r.get('checkpoints_at_once', 0)} (keep_last {KEEP_LAST} + "
         f"keep_best {KEEP_BEST} + 1 being written)", f"≤ {KEEP_LAST + KEEP_BEST + 1}",
         r.get("checkpoints_at_once", 0) <= KEEP_LAST + KEEP_BEST + 1),
        ("run-dir disk but its history and checkpoints: high before the last window → in it",
         f"{r['disk_mb_before_last_window']:.1f} → {r['disk_mb_at_end']:.1f} MB ({disk_change:+.0%}; by part: "
         + (", ".join(f"{k} {a:.1f} → {b:.1f}" for k, a, b in
                      ((k, *v) for k, v in r.get("disk_mb_moved_by_part", {}).items())) or "none moved 0.5 MB")
         + ")",
         "flat (≤ +10%)", disk_change <= 0.10),
        ("history (metrics.jsonl, groups.jsonl)", f"{r['history_mb_at_end']:.1f} MB, "
         f"{r['history_kb_per_1k_steps']:.0f} kB per 1,000 steps", "O(steps), by design", True),
        ("steps per minute, first → last window", f"{r['steps_per_min_first']:.1f} → {r['steps_per_min_last']:.1f}"
         + (f" ({change:+.0%})" if change is not None else ""), "within 15%", change is not None and abs(change) <= 0.15),
        ("steps per CPU-second of the swarm, first → last window (shown, not a target)",
         f"{r.get('steps_per_cpu_s_first', 0):.2f} → {r.get('steps_per_cpu_s_last', 0):.2f}"
         + (f" ({cpu_change:+.0%})" if cpu_change is not None else ""), "—", True),
        ("false node losses", str(len(r["node_losses"]["false"])), "0", not r["node_losses"]["false"]),
        ("groups lost / episodes doubled", f"{r['groups_lost']} / {r['episodes_duplicated']}", "0 / 0",
         r["groups_lost"] == 0 and r["episodes_duplicated"] == 0),
        *([("processes left after cleanup", str(r["leftover_processes"]), "0", r["leftover_processes"] == 0)]
          if "leftover_processes" in r else []),
    ]


def _role(cmdline: list[str], host: str) -> str:
    text = " ".join(cmdline)
    for key, role in (("actorjet.cli.main start", "cli start"), ("actorjet.cli.main join", "cli join"),
                      ("headctl", "headctl"), ("thespian", "admin"), ("forkserver", "forkserver")):
        if key in text:
            return f"{host}/{role}"
    return f"{host}/other"


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def _steps_between(samples: list[Sample], a: float, b: float) -> int:
    """Learner steps made between ``a`` and ``b`` (a head restart may rewind the count: only
    forward moves count)."""
    steps, prev = 0, None
    for s in samples:
        if a <= s.t <= b and s.step > 0:        # (0: a restarted head's learner not up yet)
            if prev is not None and s.step > prev:
                steps += s.step - prev
            prev = s.step
    return steps


def _cpu_between(samples: list[Sample], a: float, b: float) -> float:
    """CPU seconds the swarm's processes spent between ``a`` and ``b``: each process from its
    last sample at or before ``a`` (from 0 if it started later) to its last one at or before ``b``."""
    before = {pid: c for s in samples if s.t <= a for pid, c in s.cpu.items()}
    until = {pid: c for s in samples if s.t <= b for pid, c in s.cpu.items()}
    return sum(c - before.get(pid, 0.0) for pid, c in until.items())


def _by_role(samples: list[Sample]) -> dict[str, list]:
    roles = sorted({role for s in samples for role, _ in s.rss.values()})
    return {role: [sum(b for r, b in s.rss.values() if r == role) / 2 ** 20 for s in samples] for role in roles}
