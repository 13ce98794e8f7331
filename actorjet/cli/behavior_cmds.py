"""Behavior verbs: `actorjet upgrade` and `actorjet rollback` — new agent code, no restart.

The file is imported here, on the user's machine, so a syntax error or a missing function
is reported before anything is sent.  Its module is pickled *by value*: nodes do not need
the file (modules it imports by name must be installed on the nodes).
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import time
import traceback
from pathlib import Path

from actorjet.errors import UserError
from actorjet.runtime import messages as m
from actorjet.runtime import system
from actorjet.registry import protocol as proto

EXAMPLES = """\
examples:
  actorjet upgrade arithmetic agents/arithmetic_v2.py:behavior
  actorjet upgrade arithmetic my_agent.py:behavior --canary 4      try 4 episodes on one runner first
  actorjet rollback arithmetic                                     back to the version before
  actorjet rollback arithmetic --to 1
NAME is a task name from the job config's [[tasks]]; `actorjet status` lists them with their versions.
"""


def add_upgrade(sub) -> None:
    from actorjet.cli.node_cmds import add_head_options

    p = sub.add_parser("upgrade", help="ship new agent code to every runner while training runs",
                       epilog=EXAMPLES, formatter_class=_raw(),
                       description="Pickle FILE.py:FUNCTION by value, sign it with the cluster token and "
                       "send it to the registry, which stores it as a new version and pushes it to every "
                       "live runner.  Runners swap between episodes.  Returns once all live runners run "
                       "it, or names the ones that did not.")
    p.add_argument("name", metavar="NAME", help="the task whose behavior is replaced")
    p.add_argument("ref", metavar="FILE.py:FUNCTION", help="the new behavior(task, llm) -> reward")
    p.add_argument("--canary", type=int, default=0, metavar="N",
                   help="first run N episodes of the new code on one runner (not trained); if the code "
                   "fails to load or an episode raises, refuse the upgrade (default 0: no canary)")
    p.add_argument("--policy", choices=("finish", "abort"), default="finish",
                   help="episodes in flight on the old code: finish them (default) or abort them")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the canary and "
                   "for all runners (default %(default)s)")
    add_head_options(p)
    p.set_defaults(func=cmd_upgrade)


def add_rollback(sub) -> None:
    from actorjet.cli.node_cmds import add_head_options

    p = sub.add_parser("rollback", help="make an earlier version of a behavior current again",
                       epilog=EXAMPLES, formatter_class=_raw(),
                       description="Every version ever uploaded is kept in the run directory; rollback "
                       "re-activates one (default: the version that was current before this one).")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--to", type=int, default=None, metavar="V", help="the version to go back to")
    p.add_argument("--policy", choices=("finish", "abort"), default="finish")
    p.add_argument("--timeout", type=float, default=60.0)
    add_head_options(p)
    p.set_defaults(func=cmd_rollback)


def _raw():
    import argparse
    return argparse.RawDescriptionHelpFormatter


# -- the file ----------------------------------------------------------------------------

def pickle_behavior(ref: str) -> tuple[bytes, str]:
    """(cloudpickled function, a description of where it came from) or a UserError."""
    from actorjet import behaviors

    path_text, sep, fn_name = ref.rpartition(":")
    if not sep or not path_text.endswith(".py") or not fn_name:
        raise UserError(f"expected FILE.py:FUNCTION, got {ref!r}")
    path = Path(path_text).resolve()
    if not path.is_file():
        raise UserError(f"{path_text}: no such file")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    module_name = f"actorjet_behavior_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file may fail in any way
        frames = "".join(traceback.format_exception(e, limit=-4))
        raise UserError(f"{path_text} failed to import:\n{frames.rstrip()}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UserError(f"{path_text} has no function {fn_name!r}")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise UserError(f"{fn_name}{inspect.signature(fn)} must take (task, llm)") from None
    try:
        blob = behaviors.pickle_function(module, fn)
    except behaviors.Unshippable as e:
        raise UserError(str(e)) from None
    return blob, f"{path}:{fn_name} sha256:{digest}"


# -- talking to the head -----------------------------------------------------------------

def _registry(port: int, token: str):
    from actorjet.runtime.head import attach_root, lookup

    asys, root = attach_root(port, token)
    registry = lookup(asys, root, "registry")
    if registry is None:
        raise UserError("the registry is not answering (restarting?); try again")
    return asys, registry


def wait_for_runners(asys, registry, name: str, version: int, timeout_s: float) -> tuple[float, list[str]]:
    """Poll the registry until every live runner runs ``version``: (seconds, runners not on it)."""
    t0 = time.perf_counter()
    behind: list[str] = []
    while True:
        reply = system.ask(asys, registry, m.GetStatus(), m.Status, 5)
        if reply is not None:
            placed = [r for r in reply.data["runners"] if r.get("node_id") is not None]   # not "waiting for a node"
            behind = [r["id"] for r in placed if r.get("behaviors", {}).get(name) != version]
            if not behind:
                return time.perf_counter() - t0, []
        if time.perf_counter() - t0 > timeout_s:
            return time.perf_counter() - t0, behind
        time.sleep(0.05)


def send(port: int, token: str, msg, timeout_s: float, wait_s: float) -> tuple[proto.UpgradeReply, float, list[str]]:
    """Send an Upgrade/Rollback; (reply, seconds until all runners ran it, runners behind)."""
    asys, registry = _registry(port, token)
    reply = system.ask(asys, registry, msg, proto.UpgradeReply, timeout_s)
    if reply is None:
        raise UserError(f"the registry did not answer within {timeout_s:g} s")
    if not reply.ok:
        return reply, 0.0, []
    took, behind = wait_for_runners(asys, registry, reply.name, reply.version, wait_s)
    return reply, took, behind


def _report(reply: proto.UpgradeReply, took: float, behind: list[str], what: str) -> int:
    if not reply.ok:
        if reply.traceback:
            print(reply.traceback.rstrip(), file=sys.stderr)
        raise UserError(f"{what} refused: {reply.error}")
    n = len(reply.runners)
    if behind:
        raise UserError(f"{reply.name} v{reply.version} is current, but after {took:.1f} s these runners do "
                        f"not run it yet: {', '.join(behind)} (see `actorjet status` for load errors)")
    print(f"{reply.name} v{reply.version} is live on {n} runner{'s' * (n != 1)} ({took:.2f} s)", flush=True)
    return 0


def cmd_upgrade(args) -> int:
    from actorjet.cli.node_cmds import head_address, head_token
    from actorjet.behaviors import sign_upload

    if args.canary < 0:
        raise UserError("--canary must be >= 0")
    blob, source = pickle_behavior(args.ref)
    upload = sign_upload(head_token(args), args.name, blob, source)
    if args.canary:
        print(f"running {args.canary} canary episode{'s' * (args.canary != 1)} of the new code…", flush=True)
    msg = proto.Upgrade(upload, args.canary, args.policy, args.timeout)
    reply, took, behind = send(*head_address(args), msg, args.timeout + 10, args.timeout)
    return _report(reply, took, behind, "upgrade")


def cmd_rollback(args) -> int:
    from actorjet.cli.node_cmds import head_address

    reply, took, behind = send(*head_address(args), proto.Rollback(args.name, args.to, args.policy), 15, args.timeout)
    return _report(reply, took, behind, "rollback")
