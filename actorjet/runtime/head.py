"""The head node: the convention leader that runs the root supervisor.

The head's durable identity lives in ``RUN_DIR/head.json`` (join token, epoch, ports), so
`actorjet start` on the same run directory after a crash keeps the token — members
re-register with the restarted leader on their own and are re-admitted — and bumps the
epoch, which makes members stop the orphaned runners of the previous head.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import psutil

from actorjet.errors import UserError
from actorjet.runtime import kinds, owner_watch
from actorjet.runtime import messages as m
from actorjet.runtime import system
from actorjet.runtime.tree_spec import ChildSpec
from actorjet.runtime.supervisor import Supervisor
from actorjet.runtime.gpus import gpu_count

ROOT_NAME = "actorjet-root"


def refuse_cuda_before_fork(job: dict) -> None:
    """A head started from a process that already ran CUDA work (a notebook, a benchmark)
    would fork engines and learners that fail at their first CUDA call: say so up front."""
    torch = sys.modules.get("torch")
    on_gpu = [mc["name"] for mc in job.get("models", [])
              if str(mc.get("device", "auto")).startswith("cuda") or mc.get("device", "auto") == "auto" and gpu_count()]
    if on_gpu and torch is not None and torch.cuda.is_initialized():
        raise UserError(f"this process has already used CUDA, and the head's actors (model {on_gpu[0]!r} "
                        "on cuda among them) are forked from it: a forked process cannot use CUDA. "
                        "Start the head before any CUDA work, or in its own process (`actorjet start`).")


def refuse_engines_of_adapters(tree: ChildSpec, job: dict) -> None:
    """A model with ``base = "other"`` is served by the other model's engine: an engine in its
    own subtree would load a second copy of the base and serve nothing."""
    bases = {mc["name"]: mc["base"] for mc in job.get("models", []) if mc.get("base")}

    def walk(spec: ChildSpec, model: str | None) -> None:
        model = spec.args.get("model", model)
        if spec.kind == "engine" and model in bases:
            raise UserError(f"model {model!r} is an adapter served by the engine of {bases[model]!r} (base = "
                            f"{bases[model]!r}): remove the engine from its subtree in the tree file")
        for child in spec.children:
            walk(child, model)
    walk(tree, None)


def _expand(tree: ChildSpec, job: dict, expand) -> ChildSpec:
    """The tree with some children replaced: ``expand(child, its model's job entry)`` returns
    the children that take its place, or None to keep it (and look inside it).  A child's
    model is its own ``model`` arg or the nearest ancestor's."""
    by_name = {mc["name"]: mc for mc in job.get("models", [])}

    def walk(spec: ChildSpec, model: str | None) -> ChildSpec:
        model = spec.args.get("model", model)
        children = []
        for child in spec.children:
            made = expand(child, by_name.get(child.args.get("model", model), {}))
            children += [walk(child, model)] if made is None else made
        return replace(spec, children=children)
    return walk(tree, None)


def with_engine_replicas(tree: ChildSpec, job: dict) -> ChildSpec:
    """``engines = N`` in a model's entry: its subtree's engine child becomes N children,
    ``engine`` (replica 0) and ``engine.1`` … ``engine.N-1``, each announcing its own service
    (actors/engine.py) and placed by ``engine_placement`` when given."""
    def expand(child: ChildSpec, entry: dict) -> list | None:
        n = entry.get("engines", 1)
        if child.kind != "engine" or (n == 1 and not entry.get("engine_placement")):
            return None
        places = entry.get("engine_placement") or [child.placement] * n
        return [replace(child, id=child.id if k == 0 else f"{child.id}.{k}", args={**child.args, "replica": k},
                        placement=dict(places[k])) for k in range(n)]
    return _expand(tree, job, expand)


def with_learner_ranks(tree: ChildSpec, job: dict) -> ChildSpec:
    """``learner = { ranks = N }`` in a model's entry: its subtree's learner child becomes a
    one_for_all supervisor ``learners`` of N ranks, ``learner`` (rank 0, actors/learner.py)
    and ``learner.1`` … (actors/learner_rank.py), placed by ``learner.placement`` when given.
    One_for_all: a rank's death stops the group's collectives, so every rank restarts and
    rank 0 resumes from its checkpoint."""
    def expand(child: ChildSpec, entry: dict) -> list | None:
        world = entry.get("learner", {}).get("ranks", 1)
        if child.kind != "learner" or world == 1:
            return None
        places = entry["learner"].get("placement") or [child.placement] * world
        ranks = [replace(child, id=child.id if k == 0 else f"{child.id}.{k}", kind="learner" if k == 0 else "learner_rank",
                         args={**child.args, "rank": k, "world": world}, placement=dict(places[k])) for k in range(world)]
        return [ChildSpec(id=f"{child.id}s", kind="supervisor", strategy="one_for_all", max_restarts=5, period_s=60.0,
                          args=dict(child.args), children=ranks)]
    return _expand(tree, job, expand)


def read_head_file(run_dir: Path) -> dict:
    path = run_dir / "head.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is unreadable ({e}); move it away to start a new run there") from None


def write_head_file(run_dir: Path, data: dict) -> None:
    path = run_dir / "head.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.chmod(tmp, 0o600)      # it holds the cluster secret
    tmp.replace(path)


class Head:
    def __init__(self, run_dir: Path, tree: ChildSpec, job: dict | None = None, host: str = "127.0.0.1",
                 port: int = 1900, slots: int = 0, node_timeout_s: float = 6.0,
                 heartbeat_s: float = 1.0, advertise: str | None = None, door_port: int | None = None,
                 token: str | None = None):
        self.run_dir, self.tree, self.job = Path(run_dir), tree, job or {}
        self.host, self.port, self.slots = host, port, slots
        self.advertise = advertise or (host if host not in ("0.0.0.0", "") else socket.gethostname())
        self.node_timeout_s, self.heartbeat_s = node_timeout_s, heartbeat_s
        self.door_port = door_port if door_port is not None else port + 1   # outbound nodes' door (HTTP)
        self.given_token = token                 # --token-file / $ACTORJET_TOKEN; else the run's, else new
        self.asys = None
        self.root = None
        self.root_pid = 0
        self.notes: list[str] = []

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        refuse_cuda_before_fork(self.job)
        refuse_engines_of_adapters(self.tree, self.job)
        self.tree = with_learner_ranks(with_engine_replicas(self.tree, self.job), self.job)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = read_head_file(self.run_dir)
        self._clean_stale(state)
        self.token = self.given_token or state.get("token") or secrets.token_hex(16)   # hex: never starts with "-"
        if self.given_token and state.get("token") and state["token"] != self.given_token:
            self.notes.append("this run had another token: nodes joined with the old one must join again")
        self.epoch = int(state.get("epoch", 0)) + 1
        self.run_id = state.get("run_id") or uuid.uuid4().hex[:12]   # names this run's files on other nodes
        caps = {"Admin Port": self.port, "Convention Address.IPv4": (self.advertise, self.port),
                "actorjet_role": "head", "node_id": f"head-{uuid.uuid4().hex[:8]}", "name": "head",
                "slots": self.slots, "cpus": os.cpu_count() or 1, "gpus": gpu_count()}
        os.environ["ACTORJET_TOKEN"] = self.token      # local runners check behaviors with it
        self.asys = system.start_actor_system(caps, self.run_dir / "logs" / "head", self.advertise, self.token,
                                              bind_ip=self.host, node_dir=self.run_dir,
                                              preload=lambda: kinds.preload(self.tree.kinds(), self.job))
        context = {"token": self.token, "head_epoch": self.epoch, "run_dir": str(self.run_dir), "run_id": self.run_id,
                   "head_caps": {k: v for k, v in caps.items() if " " not in k},
                   "node_timeout_s": self.node_timeout_s, "heartbeat_s": self.heartbeat_s,
                   "job": self.job, "head": f"{self.advertise}:{self.port}", "door_port": self.door_port}
        admin = system.admin_pid(self.port)
        write_head_file(self.run_dir, {"token": self.token, "epoch": self.epoch, "run_id": self.run_id,
                                       "host": self.advertise,
                                       "port": self.port, "door_port": self.door_port, "head_pid": os.getpid(),
                                       "admin_pid": admin, "admin_started": owner_watch.started(admin) if admin else 0.0})
        self.root = self.asys.createActor(Supervisor, globalName=ROOT_NAME)
        reply = self.asys.ask(self.root, m.Init("root", "root", {"spec": self.tree.to_dict()},
                                                context, None), timeout_s)
        self.root_pid = reply.pid if isinstance(reply, m.Started) else 0
        if not isinstance(reply, m.Started):
            self.stop()
            raise UserError(f"the supervisor tree did not start within {timeout_s:g} s; "
                            f"see {self.run_dir / 'logs' / 'head'}")

    def _clean_stale(self, state: dict) -> None:
        """A head that crashed leaves its daemonized admin on the port: stop it if it is ours."""
        if not system.port_in_use(self.host, self.port):
            return
        pid = state.get("head_pid")
        ours = state.get("port") == self.port and pid and not psutil.pid_exists(pid)
        if not ours:
            return    # start_actor_system reports the port as taken
        system.shutdown_system(self.port, token=state.get("token"))
        self.notes.append(f"stopped a stale actor system left on port {self.port} by head pid {pid}")

    def join_command(self) -> str:
        return f"actorjet join {self.advertise}:{self.port} --token {self.token}"

    def outbound_join_command(self) -> str:
        """For machines that accept no inbound connections (NAT, firewalls): leases over HTTP."""
        return f"actorjet join --outbound http://{self.advertise}:{self.door_port} --token {self.token}"

    def poll(self, timeout_s: float):
        """The next message the root sends the head (an ``Escalated``), or None."""
        return system.listen(self.asys, timeout_s)

    def stop(self) -> None:
        """Stop the tree, then the actor system; whatever of it is still running 10 s later
        (thespian gives up on an admin that does not answer its shutdown) is killed, so a
        head never leaves a daemonized system behind on its port.

        A root that is gone never answers StopTree, so its process ending ends the wait: when
        a service manager or ``pkill`` signals every process at once, the root dies with the
        rest, and waiting the full 10 s for it kept the head's front alive 11.6 s after SIGTERM."""
        if self.asys is None:
            return
        procs = system.system_processes(self.port)
        try:
            if self.root is not None:
                system.ask(self.asys, self.root, m.StopTree(), m.Stopped, 10,
                           give_up=self._root_gone if self.root_pid else None)
        finally:
            self.asys.shutdown()
            self.asys = None
            killed = system.reap(procs, 10.0)
            if killed:
                self.notes.append(f"killed {killed} actor processes that did not stop")

    def _root_gone(self) -> bool:
        try:
            return not system.still_running(psutil.Process(self.root_pid))
        except psutil.NoSuchProcess:
            return True

    # -- asking the tree ---------------------------------------------------------------
    def lookup(self, path: str, timeout_s: float = 5.0):
        return lookup(self.asys, self.root, path, timeout_s)

    def status(self, timeout_s: float = 5.0) -> dict:
        return status(self.asys, self.root, timeout_s)


def lookup(asys, root, path: str, timeout_s: float = 5.0):
    reply = system.ask(asys, root, m.Lookup(path), m.LookupResult, timeout_s)
    return reply.address if reply is not None else None


def status(asys, root, timeout_s: float = 5.0) -> dict:
    registry = lookup(asys, root, "registry", timeout_s)
    if registry is None:
        raise UserError("the registry is not answering (restarting?); try again")
    reply = system.ask(asys, registry, m.GetStatus(), m.Status, timeout_s)
    if reply is None:
        raise UserError("the registry did not answer within the timeout")
    return reply.data


def attach_root(port: int, token: str | None = None):
    """(client system, root address) for a head on this machine's ``port``; ``token``: its
    cluster token (needed once per process: actor frames are signed with its key)."""
    asys = system.attach(port, token)
    return asys, asys.createActor(Supervisor, globalName=ROOT_NAME)
