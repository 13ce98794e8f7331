"""Node verbs: start (head), join, leave, stop, status."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from actorjet.errors import UserError
from actorjet.runtime import endpoints
from actorjet.runtime import messages as m

DEFAULT_RUN_DIR = "runs/default"


class _Stop:
    """SIGTERM/SIGINT set a flag; the foreground loops check it between polls."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, *_):
        self.requested = True


def _say(text: str) -> None:
    print(text, flush=True)


# -- start -----------------------------------------------------------------------------

def add_start(sub) -> None:
    p = sub.add_parser("start", help="start the head node (convention leader) and the supervisor tree",
                       description="Start the head: registry, models and the runners' supervisor, as "
                       "declared in the supervisor tree.  Prints the exact `actorjet join` command "
                       "for other machines.  Starting again on the same --run-dir resumes the run "
                       "(same join token; members rejoin by themselves).")
    p.add_argument("--config", help="job config (TOML): models, tasks, training settings")
    p.add_argument("--tree", help="supervisor tree (TOML); default: supervisors/default.toml")
    p.add_argument("--host", default="127.0.0.1",
                   help="address of this machine that the head and its HTTP services (gateways, engines) "
                   "listen on; other machines must be able to reach it (default %(default)s: this machine "
                   "only). 0.0.0.0 listens everywhere")
    p.add_argument("--advertise", default=None, metavar="ADDRESS",
                   help="address other machines reach this head at, when it differs from --host "
                   "(port forwarding, NAT, --host 0.0.0.0); URLs in `status` and the join command use it")
    p.add_argument("--port", type=int, default=1900, help="convention port (default %(default)s)")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, help="run directory (default %(default)s)")
    p.add_argument("--slots", type=int, default=0, help="runner slots on the head itself (default 0)")
    p.add_argument("--door-port", type=int, default=None,
                   help="HTTP port of the door that outbound-only nodes (join --outbound) lease work from "
                   "(default: --port + 1)")
    p.add_argument("--node-timeout", type=float, default=6.0,
                   help="seconds without heartbeat before a node counts as lost (default %(default)s)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="the cluster token to use, read from FILE (or set ACTORJET_TOKEN); default: the "
                   "run directory's, else a new random one. It is the cluster key (docs/security.md)")
    add_tls_options(p, serve_help="the gateways on this machine serve HTTPS with this certificate (PEM)")
    p.set_defaults(func=cmd_start)


def cmd_start(args) -> int:
    from actorjet.config import load_job, normalize, tree_path
    from actorjet.models.prepare import prepare
    from actorjet.runtime.head import Head
    from actorjet.runtime.tree_spec import load_tree

    # the job first: its mistakes are the common ones, and checking it imports no torch (the
    # tree's actor kinds do: ~3 s before a one-line error)
    job = prepare(load_job(args.config) if args.config else normalize({}))
    tree = load_tree(args.tree or tree_path("default.toml"))
    if args.node_timeout <= 0:
        raise UserError("--node-timeout must be > 0")
    endpoints.set_tls(args.tls_cert, args.tls_key, None)
    stop = _Stop()
    head = Head(Path(args.run_dir), tree, job, host=args.host, port=args.port, slots=args.slots,
                node_timeout_s=args.node_timeout, heartbeat_s=min(1.0, args.node_timeout / 4),
                advertise=args.advertise, door_port=args.door_port, token=given_token(args))
    head.start()
    for note in head.notes:
        _say(f"note: {note}")
    _say(f"ActorJet head running (epoch {head.epoch}), run directory: {head.run_dir.resolve()}")
    _say("join other machines with:")
    _say(f"  {head.join_command()} --slots 4")
    _say("machines that accept no inbound connections (NAT, laptops, firewalls) join with:")
    _say(f"  {head.outbound_join_command()} --slots 4")
    code = 0
    try:
        while not stop.requested:
            msg = head.poll(0.5)
            if isinstance(msg, m.Escalated):
                if msg.path == "root":
                    print(f"actorjet start: the root supervisor gave up: {msg.reason}", file=sys.stderr)
                    code = 3
                    break
                _say(f"warning: {msg.path} escalated: {msg.reason}")
    finally:
        head.stop()
        _say("head stopped")
    return code


# -- join / leave ----------------------------------------------------------------------

def add_join(sub) -> None:
    p = sub.add_parser("join", help="add this machine to a swarm as a runner node",
                       description="Join the head at HOST:PORT.  The node runs agent runners in "
                       "--slots slots.  Exits non-zero with a clear message if the head cannot be "
                       "reached or refuses the node (wrong token, name taken).  The head must be "
                       "able to connect to this machine; one that accepts no inbound connections "
                       "(NAT, a laptop, a firewall) joins with --outbound and the door URL that "
                       "`actorjet start` prints.")
    p.add_argument("head", metavar="HOST:PORT", help="the head's address; with --outbound, its door URL")
    p.add_argument("--token", default=None, help="the token printed by `actorjet start` (visible in `ps`; "
                   "--token-file or ACTORJET_TOKEN keep it out of the process list)")
    p.add_argument("--token-file", default=None, metavar="FILE", help="read the token from FILE")
    p.add_argument("--slots", type=int, default=1, help="concurrent runners on this node (default 1)")
    p.add_argument("--trials", type=int, default=0, metavar="N",
                   help="also host up to N research trials at once, each an embedded head of its own on "
                   "this machine, for `actorjet research run --head` (default 0: none; docs/research.md)")
    p.add_argument("--name", default=None, help="node name (default: this host's name)")
    p.add_argument("--port", type=int, default=None, help="this node's own admin port (default: a free one)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for admission (default %(default)s)")
    p.add_argument("--state-dir", default=None, help="where this node keeps its logs (default ~/.actorjet/nodes/NAME)")
    p.add_argument("--advertise", default=None, metavar="ADDRESS",
                   help="address the head reaches this node at, when it is not the address this machine "
                   "uses towards the head (port forwarding); a node that accepts no inbound "
                   "connections at all (NAT, laptops) uses --outbound instead")
    p.add_argument("--outbound", action="store_true",
                   help="connect out only: lease episodes from the head's door over HTTP (for NAT, laptops, "
                   "firewalls); no pushed upgrades, canaries or process isolation on such a node")
    p.add_argument("--concurrency", type=int, default=16,
                   help="with --outbound: episodes in flight per slot (default %(default)s)")
    add_tls_options(p, serve_help="gateways placed on this node serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-ca", default=None, metavar="PEM",
                   help="trust this certificate for the gateways' HTTPS (a self-signed gateway "
                   "certificate: pass the certificate itself); default: the system's roots")
    p.set_defaults(func=cmd_join)


def cmd_join(args) -> int:
    import socket

    from actorjet.runtime.member import Member

    name = args.name or socket.gethostname()
    endpoints.set_tls(args.tls_cert, args.tls_key, args.tls_ca)
    args.token = given_token(args)
    if not args.token:
        raise UserError("joining needs the cluster token that `actorjet start` printed: "
                        "--token T, --token-file FILE or ACTORJET_TOKEN")
    if args.outbound:
        if args.trials:
            raise UserError("--trials needs a joined node the head can reach (the trial host is an actor "
                            "placed there); an --outbound node runs episodes only")
        return _join_outbound(args, name)
    member = Member(args.head, args.token, name, slots=args.slots, trials=args.trials, port=args.port,
                    state_dir=args.state_dir, timeout_s=args.timeout, advertise=args.advertise)
    stop = _Stop()
    member.join()
    _say(f"joined {args.head} as {name} ({member.node_id}) with {args.slots} slots"
         f"{f' and {args.trials} trial slots' if args.trials else ''}; "
         f"logs in {member.state_dir / 'logs'}")
    try:
        while not stop.requested:
            msg = member.next_event(0.5)
            if isinstance(msg, m.Admission):
                _say(("re-admitted by the head" if msg.admitted else f"refused: {msg.reason}")
                     + f" (admission {msg.admission})")
    finally:
        member.leave()
        _say("left the swarm")
    return 0


def _join_outbound(args, name: str) -> int:
    from actorjet.runner.outbound import OutboundNode

    node = OutboundNode(args.head, args.token, name, slots=args.slots, concurrency=args.concurrency, say=_say)
    node.check()
    _say(f"joined {node.url} as {name} ({node.runner_id}), outbound only, "
         f"{args.slots} slots x {args.concurrency} episodes")
    stop = _Stop()
    try:
        node.run(lambda: stop.requested)
    finally:
        node.close()
        _say(f"left the swarm after {node.episodes_done} episodes")
    return 0


def add_leave(sub) -> None:
    p = sub.add_parser("leave", help="take a joined node out of the swarm gracefully",
                       description="Stop the `actorjet join` process of node NAME on this machine; "
                       "the head re-places its runners at once.")
    p.add_argument("--name", default=None, help="node name (default: this host's name)")
    p.add_argument("--state-dir", default=None)
    p.set_defaults(func=cmd_leave)


def cmd_leave(args) -> int:
    import socket

    from actorjet.runtime.member import default_state_dir

    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(args.name or socket.gethostname())
    info = _read_json(state_dir / "join.json", "no joined node found there")
    _terminate(info["pid"], "join process")
    _say(f"node {info['node_id']} left")
    return 0


# -- stop / status ---------------------------------------------------------------------

def add_stop(sub) -> None:
    p = sub.add_parser("stop", help="stop the head of a run (or a stale actor system on a port)")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR)
    p.add_argument("--port", type=int, default=None, help="stop whatever ActorJet system listens on this port")
    p.set_defaults(func=cmd_stop)


def cmd_stop(args) -> int:
    from actorjet.runtime import system

    head_file = Path(args.run_dir) / "head.json"
    port, stopped_head, token = args.port, False, None
    if head_file.exists() and port is None:
        info = _read_json(head_file, "")
        port, token = info["port"], info.get("token")
        if info.get("head_pid") and psutil.pid_exists(info["head_pid"]):
            _terminate(info["head_pid"], "head process", 45.0)   # it stops its own system: ≤ 10 s tree, 10 s admin, 10 s reap
            stopped_head = True
            _say(f"stopped the head (pid {info['head_pid']}) of {args.run_dir} on port {port}")
    if port is None:
        raise UserError(f"no head.json in {args.run_dir}; pass --run-dir or --port")
    if system.shutdown_system(port, token=token):
        _say(f"stopped {'what was left of ' if stopped_head else ''}the actor system on port {port}")
    elif not stopped_head:
        _say(f"nothing is running on port {port}")
    return 0


def add_status(sub) -> None:
    p = sub.add_parser("status", help="nodes, runners, models, behaviors and episode counts",
                       description="Ask the registry of a head on this machine.")
    add_head_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--actors", action="store_true",
                   help="also list every actor of the tree with its node, host and PID (to act on a fault)")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    from actorjet.runtime.head import attach_root, status

    asys, root = attach_root(*head_address(args))   # a client handle: never shut it down (that stops the head)
    data = status(asys, root)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        from actorjet.cli.tables import print_status
        print_status(data, show_actors=args.actors)
    return 0


# -- helpers ---------------------------------------------------------------------------

def add_head_options(p) -> None:
    """--head / --token / --run-dir: how every command that talks to a head finds it, the same way."""
    p.add_argument("--head", default=None, help="HOST:PORT of a head running on this machine "
                   "(default: from --run-dir, else 127.0.0.1:1900)")
    p.add_argument("--token", default=None, help="cluster token (default: --token-file, $ACTORJET_TOKEN, "
                   "else read from --run-dir/head.json)")
    p.add_argument("--token-file", default=None, metavar="FILE", help="read the cluster token from FILE")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, help="the head's run directory (default %(default)s)")


def head_port(args) -> int:
    if args.head:
        port_text = args.head.rpartition(":")[2]
        if not port_text.isdigit():
            raise UserError(f"--head must look like HOST:PORT, got {args.head!r}")
        return int(port_text)
    if (Path(args.run_dir) / "head.json").exists():
        return _read_json(Path(args.run_dir) / "head.json", "")["port"]
    return 1900


def add_tls_options(p, serve_help: str) -> None:
    p.add_argument("--tls-cert", default=None, metavar="PEM", help=serve_help)
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")


def given_token(args) -> str | None:
    """The token the user gave: --token, else --token-file, else $ACTORJET_TOKEN (None: none).
    A file or the environment keeps the secret out of the process list."""
    if getattr(args, "token", None):
        return args.token
    if getattr(args, "token_file", None):
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as e:
            raise UserError(f"--token-file {args.token_file}: {e.strerror}") from None
        if not token:
            raise UserError(f"--token-file {args.token_file} is empty")
        return token
    return os.environ.get("ACTORJET_TOKEN") or None


def head_address(args) -> tuple[int, str]:
    """(port, token) of the head a command talks to; a port nobody listens on is reported
    before a missing token (the more useful message)."""
    from actorjet.runtime import system

    port = head_port(args)
    if not system.port_in_use("127.0.0.1", port):
        raise UserError(f"no ActorJet system is listening on port {port}")
    return port, head_token(args)


def head_token(args) -> str:
    """The cluster secret: as given (``given_token``), else the head's run dir (head.json is
    readable only by the user who started the head)."""
    token = given_token(args)
    if token:
        return token
    info = _read_json(Path(args.run_dir) / "head.json", "pass --token (printed by `actorjet start`) or --run-dir")
    return info["token"]


def _read_json(path: Path, missing: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} not found{': ' + missing if missing else ''}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is unreadable: {e}") from None


def _terminate(pid: int, what: str, timeout_s: float = 20.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout_s
    while time.time() < deadline and psutil.pid_exists(pid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.2)
    if psutil.pid_exists(pid):
        raise UserError(f"the {what} (pid {pid}) did not stop within {timeout_s:g} s")
