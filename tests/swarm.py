"""Helpers for tests that run real heads and nodes as separate processes on 127.0.0.1.

Every process a test starts is tracked here and killed at teardown, with the actor
systems it left behind (found by their admin port), even when the test fails.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from actorjet.runtime import frames, system

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    return system.free_port()


def die_with_parent() -> None:
    """(preexec_fn) SIGTERM this child when the process that started it dies, however it
    dies: a bench or test killed without its cleanup (SIGKILL, or SIGTERM before it handled
    it) left its heads and nodes running, each a whole actor system.  Linux's
    PR_SET_PDEATHSIG; it follows the thread that started the child, so start them from the
    main thread."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # 1: PR_SET_PDEATHSIG


class Proc:
    """A CLI process whose output is collected line by line in the background."""

    def __init__(self, args: list[str], env: dict, prefix: list[str] | None = None):
        self.args = args
        self.popen = subprocess.Popen((prefix or []) + [sys.executable, "-m", "actorjet.cli.main"] + args,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=env, start_new_session=True, cwd=REPO, preexec_fn=die_with_parent)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = 60.0) -> re.Match:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match
            if self.popen.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not seen from {self.args}; output:\n{self.output}")

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        code = self.popen.wait(timeout_s)
        self._reader.join(5)
        return code


class Swarm:
    """Starts heads and nodes; ``cleanup()`` kills every process and system they made."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.ports: list[int] = []
        self.env = dict(os.environ, ACTORJET_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1")
        self.ctls: dict[tuple, subprocess.Popen] = {}     # (namespace, port) → headctl.py
        self.tokens: dict[int, str] = {}                   # head port → its cluster token
        self.told = False                                  # its post-mortem was printed

    def env_of(self, host=None) -> dict:
        """A host in its own namespace also gets its own ACTORJET_HOME (hosts share nothing)."""
        return self.env if host is None else dict(self.env, ACTORJET_HOME=str(self.tmp / f"home-{host.name}"))

    def head(self, run_dir: Path, tree: str, port: int | None = None, slots: int = 0,
             node_timeout: float = 3.0, extra: list[str] | None = None, host=None) -> tuple[Proc, int, str]:
        """A head; with ``host`` (tests/hosts.py) it runs in that namespace on its address."""
        port = port or free_port()
        self.ports.append(port)
        where = ["--host", host.ip] if host is not None else []
        proc = Proc(["start", "--tree", tree, "--port", str(port), "--run-dir", str(run_dir),
                     "--slots", str(slots), "--node-timeout", str(node_timeout)] + where + (extra or []),
                    self.env_of(host), prefix=host.prefix if host is not None else None)
        self.procs.append(proc)
        # The first head of a fresh machine builds the zoo models it needs (~1 min on 2 busy cores).
        token = proc.wait_for(r"--token (\S+)", timeout_s=300).group(1)
        self.tokens[port] = token
        frames.install(token)       # this process's actor frames (status, lookups) are signed with it
        return proc, port, token

    def join(self, port: int, token: str, name: str, slots: int = 1, head_host: str = "127.0.0.1",
             node_port: int | None = None, prefix: list[str] | None = None, wait: bool = True,
             host=None, extra: list[str] | None = None, env: dict | None = None) -> tuple[Proc, int]:
        """A joined node; with ``host`` it runs in that namespace (``env``: more variables)."""
        node_port = node_port or free_port()
        self.ports.append(node_port)
        if host is not None:
            prefix = host.prefix
        proc = Proc(["join", f"{head_host}:{port}", "--token", token, "--name", name,
                     "--slots", str(slots), "--port", str(node_port), "--timeout", "15"] + (extra or []),
                    dict(self.env_of(host), **(env or {})), prefix=prefix)
        self.procs.append(proc)
        if wait:
            proc.wait_for(r"^joined ")
        return proc, node_port

    def outbound(self, door: str, token: str, name: str, slots: int = 1, host=None, concurrency: int = 16,
                 env: dict | None = None) -> Proc:
        """An outbound-only node (`join --outbound`), optionally on ``host`` (``env``: more variables)."""
        proc = Proc(["join", "--outbound", door, "--token", token, "--name", name, "--slots", str(slots),
                     "--concurrency", str(concurrency)],
                    dict(self.env_of(host), **(env or {})), prefix=host.prefix if host is not None else None)
        self.procs.append(proc)
        proc.wait_for(r"^joined ")
        return proc

    def host_processes(self, host) -> list[psutil.Process]:
        """The live processes running "on" ``host`` (those carrying its ACTORJET_HOME)."""
        home = self.env_of(host)["ACTORJET_HOME"]
        procs = []
        for p in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if p.environ().get("ACTORJET_HOME") == home and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
        return procs

    def kill_host(self, host) -> list[int]:
        """SIGKILL every process running "on" ``host`` (its ACTORJET_HOME): a machine that dies."""
        procs = self.host_processes(host)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        system.reap(procs, 5)           # gone, or a zombie its PID 1 has not reaped yet
        return [p.pid for p in procs]

    def kill_system(self, port: int, proc: Proc | None = None) -> list[int]:
        """SIGKILL an actor system (admin + all its actors) and, optionally, its CLI process."""
        pids = [p.pid for p in system.system_processes(port)]
        if proc is not None:
            pids.append(proc.popen.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.popen.wait(10)
        system.reap(existing(pids), 5)
        return pids

    def cleanup(self) -> None:
        for ctl in self.ctls.values():
            with contextlib.suppress(Exception):
                ctl.kill()
                ctl.wait(5)
        # The test is over: nothing of its swarm needs to stop gracefully (a graceful stop took
        # ~3 s per test, 15 s for a head whose member was cut off).  Process groups first, then
        # the daemonized actor systems by port, then anything else started with this test's home.
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(5)
        for port in self.ports:
            for p in system.system_processes(port):
                with contextlib.suppress(psutil.Error):
                    p.kill()
        left = self.leftovers()         # e.g. systems inside a network namespace
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        system.reap(left, 5)            # gone (or zombies) before anyone counts what is left

    def post_mortem(self, lines: int = 25) -> str:
        """What a failed test's swarm said: each head's status (asked while it still runs),
        the tail of each CLI process's output, and the warnings and errors its actors logged."""
        parts = []
        for (ns, port), proc in list(self.ctls.items()):
            if proc.poll() is None:
                with contextlib.suppress(Exception):
                    proc.stdin.write("status\n")
                    proc.stdin.flush()
                    parts.append(f"--- status of the head on {ns or 'this host'}:{port}\n"
                                 + proc.stdout.readline().strip())
        for proc in self.procs:
            parts.append(f"--- {' '.join(proc.args[:2])} (last {lines} lines)\n" + "\n".join(proc.lines[-lines:]))
        for log in sorted(self.tmp.rglob("actors.log")):
            noted = [x for x in log.read_text(errors="replace").splitlines() if " WARNING " in x or " ERROR " in x]
            parts.append(f"--- {log.relative_to(self.tmp)}: {len(noted)} warnings and errors, the last {lines}\n"
                         + "\n".join(noted[-lines:]))
        return "\n".join(parts)

    def leftovers(self) -> list[psutil.Process]:
        """Processes whose ACTORJET_HOME lies in this test's directory: only ones it started."""
        mine = []
        for p in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                home = p.environ().get("ACTORJET_HOME", "")
                if p.pid != os.getpid() and home.startswith(str(self.tmp) + os.sep) and system.still_running(p):
                    mine.append(p)
        return mine

    def ctl(self, host, verb: str, port: int, *args) -> dict:
        """Ask the head on ``host`` (its admin answers on its own host only) through a
        tests/headctl.py process kept running there: ``status`` or ``pid TREE/PATH``."""
        key = (host.ns, port)
        proc = self.ctls.get(key)
        if proc is None or proc.poll() is not None:
            proc = self.ctls[key] = subprocess.Popen(
                host.prefix + [sys.executable, str(REPO / "tests" / "headctl.py"), str(port)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
                env=dict(self.env_of(host), ACTORJET_TOKEN=self.tokens[port]))
        proc.stdin.write(" ".join([verb, *map(str, args)]) + "\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline() or '{"error": "headctl exited"}')
        if isinstance(out, dict) and "error" in out and len(out) == 1:
            raise RuntimeError(f"headctl {verb} on {host.name}: {out['error']}")
        return out


def existing(pids) -> list[psutil.Process]:
    """The processes of ``pids`` that still exist (one may be reaped between any two calls)."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    return procs


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1, what: str = "condition"):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        with contextlib.suppress(Exception):
            last = predicate()
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


def evaluated_rows(run: Path, models, step: int, timeout_s: float = 120) -> list[dict]:
    """RUN/metrics.jsonl's rows once every model's held-out evaluation at ``step`` is in it.
    The last evaluation runs beside training (it never holds a step up), so a test that reads
    the rows when the last step is trained may miss it and judge an earlier one."""
    from actorjet.monitor.metrics import read      # (a line being written is left for the next read)

    def rows() -> list[dict]:
        return read(run)
    wait_until(lambda: {r.get("model") for r in rows() if r.get("kind") == "eval" and r.get("step") == step}
               >= set(models), timeout_s, interval_s=1, what=f"the evaluations of {sorted(models)} at step {step}")
    return rows()


def pid_of(port: int, path: str) -> int | None:
    """The pid of the actor at ``path`` in the tree of the head on ``port`` (None if absent)."""
    from actorjet.runtime import messages as m
    from actorjet.runtime.head import attach_root, lookup

    asys, root = attach_root(port)
    address = lookup(asys, root, path, 5)
    reply = system.ask(asys, address, m.Ping(), m.Pong, 5) if address else None
    return reply.pid if reply is not None else None


def recorded_calls(run: Path, model: str) -> list[dict]:
    """Every finished episode's calls a run recorded for ``model``: still in its episode store,
    or archived by retention (the job needs ``keep_trajectories = true``).  Compact calls
    (actorjet/rl/calls.py): whole prompts through ``calls.prompt_ids``."""
    from actorjet.store.trajectories import archived, stored

    out = []
    for path, read in ((run / "trajectories" / f"{model}.jsonl", archived), (run / f"episodes-{model}.sqlite", stored)):
        if path.exists():
            for _, calls in read(path):
                out += calls
    return out


def complete_groups(run: Path, model: str) -> set[str]:
    """The groups complete in ``model``'s episode store, retired ones (archived: the job needs
    ``keep_trajectories = true``) included."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(run / f"episodes-{model}.sqlite", timeout=30)) as db:
        out = {g for (g,) in db.execute("SELECT group_id FROM groups WHERE complete_at IS NOT NULL")}
    archive = run / "trajectories" / f"{model}.jsonl"
    if archive.exists():
        out |= {json.loads(line)["group_id"] for line in archive.read_text().splitlines() if line.strip()}
    return out
