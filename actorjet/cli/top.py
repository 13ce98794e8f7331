"""`actorjet top`: a whole swarm at a glance, refreshed about once a second.

It polls the head's door (``GET /v1/actorjet/status``, cluster token), which answers from a
status at most one second old however many watchers there are: watching never slows
training.  Rates (episodes/s, restarts in the last minute) come from the difference between
polls.  Keys: 0 overview, 1 models, 2 nodes, 3 runners, 4 tasks, 5 supervision, q quit.
A head that does not answer is one line on the screen; the view comes back by itself.
"""
from __future__ import annotations

import os
import select
import sys
import time
from collections import deque

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from actorjet.cli.tables import hardware_cell, ranks_cell
from actorjet.runtime import http_json

PANELS = {"0": "overview", "1": "models", "2": "nodes", "3": "runners", "4": "tasks", "5": "supervision"}
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], lo: float = 0.0, hi: float = 1.0) -> str:
    span = (hi - lo) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int((v - lo) / span * (len(SPARK) - 1) + 0.5)))]
                   for v in values if v is not None)


class Poller:
    """Fetches the door's status and keeps what rates need: the previous polls."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url.rstrip("/") + "/v1/actorjet/status", token
        self.history: deque = deque(maxlen=120)           # (time, status) of the last polls
        self.error = ""

    def poll(self) -> dict | None:
        try:
            answer = http_json.get(self.url, self.token, timeout=3)
        except http_json.HttpError as e:
            self.error = f"the head's door answered {e.status}" + (": wrong token?" if e.status == 401 else "")
            return None
        except http_json.Unreachable as e:
            self.error = f"the head at {self.url.rsplit('/v1', 1)[0]} is unreachable ({e.reason})"
            return None
        self.error = ""
        self.history.append((time.time(), answer["status"]))
        return answer

    def rate(self, pick, seconds: float = 10.0) -> float:
        """Per-second change of ``pick(status)`` over about the last ``seconds``."""
        if len(self.history) < 2:
            return 0.0
        now, last = self.history[-1]
        then, first = next(((t, s) for t, s in self.history if now - t <= seconds), self.history[0])
        return (pick(last) - pick(first)) / (now - then) if now > then else 0.0

    def restarts_last_minute(self) -> dict[str, int]:
        if not self.history:
            return {}
        now, last = self.history[-1]
        _, first = next(((t, s) for t, s in self.history if now - t <= 60), self.history[0])
        before = first.get("restarts", {})
        return {k: v - before.get(k, 0) for k, v in last.get("restarts", {}).items() if v - before.get(k, 0) > 0}


def models_table(status: dict) -> Table:
    t = Table(title="models", expand=True)
    for col in ("model", "step", "version", "reward", "reward (last 60 steps)", "accuracy",
                "batch wait / train / publish s", "staleness", "tokens/s", "token ratio", "engine replicas", "learner ranks (step s)", "devices (KV MB)"):
        t.add_column(col)
    for mdl in status.get("models", []):
        recent = mdl.get("recent") or [{}]
        last = recent[-1]
        rewards = [r.get("reward_mean") for r in recent if r.get("reward_mean") is not None]
        acc = ", ".join(f"{task or 'eval'} {a:.1%}" for task, a in mdl.get("accuracy", {}).items() if a is not None)
        split = "/".join(f"{last.get(k, 0) or 0:.2f}" for k in ("batch_wait_s", "train_s", "publish_s"))
        tps = (last.get("tokens") or 0) / last["train_s"] if last.get("train_s") else 0
        t.add_row(mdl["name"], str(mdl["learner_step"]), str(mdl["weight_version"]),
                  f"{rewards[-1]:.2f}" if rewards else "-", sparkline(rewards), acc or "-", split,
                  f"{last.get('staleness_mean', 0) or 0:.2f}", f"{tps:.0f}",
                  f"{last['token_ratio']:.2f}" if last.get("token_ratio") else "-", replicas_cell(mdl), ranks_cell(mdl),
                  hardware_cell(mdl))
    return t


def replicas_cell(mdl: dict) -> str:
    """Per engine replica: calls served / outstanding, and "out" while the gateway routes around it."""
    return " ".join(f"{name.replace('engine', 'e') or 'e'}:{r['served']}/{r['outstanding']}" + (" out" if r["out"] else "")
                    for name, r in (mdl.get("engine_replicas") or {}).items()) or "-"


def nodes_table(status: dict) -> Table:
    t = Table(title="nodes", expand=True)
    for col in ("node", "alive", "slots", "cpu %", "memory %", "runners", "rejected frames"):
        t.add_column(col)
    for n in status.get("nodes", []):
        on_it = sum(1 for r in status.get("runners", []) if r.get("node_id") == n["node_id"])
        t.add_row(n["name"], "yes" if n["alive"] else f"[red]lost[/red] {n.get('lost_reason', '')}", str(n["slots"]),
                  f"{n.get('cpu_percent', 0):.0f}", f"{n.get('memory_percent', 0):.0f}", str(on_it),
                  str(n.get("rejected_frames", 0)))
    return t


def runners_table(status: dict, poller: Poller) -> Table:
    t = Table(title="runners", expand=True)
    for col in ("runner", "state", "behaviors", "episodes/s", "restarts"):
        t.add_column(col)
    restarts = status.get("restarts", {})
    for r in status.get("runners", []):
        rid = r["id"]
        rate = poller.rate(lambda s, rid=rid: next((x.get("completed", 0) for x in s.get("runners", [])
                                                    if x["id"] == rid), 0))
        n = sum(v for k, v in restarts.items() if k.endswith("/" + rid))
        t.add_row(rid, r.get("state", ""), ", ".join(f"{k}@v{v}" for k, v in r.get("behaviors", {}).items()) or "-",
                  f"{rate:.1f}", str(n))
    return t


def tasks_table(status: dict) -> Table:
    t = Table(title="tasks", expand=True)
    for col in ("task", "weight", "state", "share of last batches", "issued", "completed", "aborted by cause"):
        t.add_column(col)
    groups: dict[str, int] = {}
    for mdl in status.get("models", []):
        for r in (mdl.get("recent") or [])[-10:]:
            for task, v in (r.get("by_task") or {}).items():
                groups[task] = groups.get(task, 0) + v.get("groups", 0)
    total = sum(groups.values()) or 1
    for name, task in status.get("tasks", {}).items():
        aborted = ", ".join(f"{k} {v}" for k, v in task.get("aborted_by_cause", {}).items()) or "0"
        t.add_row(name, f"{task.get('weight', 1):g}", task.get("state", ""), f"{groups.get(name, 0) / total:.0%}",
                  str(task.get("issued", 0)), str(task.get("completed", 0)), aborted)
    return t


def supervision_panel(status: dict, poller: Poller, errors: list[str]) -> Group:
    t = Table(title="restarts in the last minute", expand=True)
    t.add_column("child")
    t.add_column("restarts")
    for child, n in sorted(poller.restarts_last_minute().items()):
        t.add_row(child, str(n))
    lines = Text("\n".join(errors[-5:]) or "no errors in the head's log", style="red" if errors else "dim")
    return Group(t, Text(f"nodes lost: {status.get('nodes_lost', 0)}   stalls found/healed: "
                         f"{status.get('stalls_detected', 0)}/{status.get('stalls_healed', 0)}"),
                 Panel(lines, title="last errors (head)"))


def screen(answer: dict | None, poller: Poller, panel: str) -> Group:
    keys = Text("keys: " + "  ".join(f"{k} {v}" for k, v in PANELS.items()) + "  q quit", style="dim")
    if answer is None:
        return Group(Text(poller.error + "; retrying every second", style="bold red"), keys)
    status = answer["status"]
    eps = status.get("episodes", {})
    head = Text(f"{status.get('watchdog', '')}   episodes/s "
                f"{poller.rate(lambda s: s.get('episodes', {}).get('completed', 0)):.1f}   completed "
                f"{eps.get('completed', 0)}  in flight {eps.get('in_flight', 0)}  trained {eps.get('trained', 0)}  "
                f"aborted {eps.get('aborted', 0)}   groups finished/s "
                f"{poller.rate(lambda s: s.get('groups', {}).get('finished', 0)):.2f}", style="bold")
    parts = {"models": lambda: models_table(status), "nodes": lambda: nodes_table(status),
             "runners": lambda: runners_table(status, poller), "tasks": lambda: tasks_table(status),
             "supervision": lambda: supervision_panel(status, poller, answer.get("errors", []))}
    shown = ["models", "nodes", "supervision"] if panel == "overview" else [panel]
    return Group(head, *[parts[p]() for p in shown], keys)


def read_key() -> str | None:
    if not sys.stdin.isatty():
        return None
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return os.read(sys.stdin.fileno(), 1).decode(errors="ignore") if ready else None


def run(url: str, token: str, interval_s: float) -> int:
    import termios
    import tty

    poller, panel = Poller(url, token), "overview"
    saved = termios.tcgetattr(sys.stdin) if sys.stdin.isatty() else None
    try:
        if saved is not None:
            tty.setcbreak(sys.stdin.fileno())
        with Live(screen(None, poller, panel), screen=True, auto_refresh=False) as live:
            while True:
                answer = poller.poll()
                live.update(screen(answer, poller, panel), refresh=True)
                deadline = time.time() + interval_s
                while time.time() < deadline:
                    key = read_key()
                    if key == "q":
                        return 0
                    if key in PANELS:
                        panel = PANELS[key]
                        live.update(screen(answer, poller, panel), refresh=True)
                    time.sleep(0.05)
    except KeyboardInterrupt:
        return 0
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
