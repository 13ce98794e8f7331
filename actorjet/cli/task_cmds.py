"""`actorjet task add | pause | resume | remove`: change the cocktail while training runs."""
from __future__ import annotations

from actorjet.errors import UserError
from actorjet.registry import protocol as proto
from actorjet.runtime import system

EXAMPLES = """\
examples:
  actorjet task add terse --source actorjet_agents.arithmetic --behavior actorjet_agents.arithmetic_v2:behavior --weight 0.5
  actorjet task pause terse            no new groups; the ones in flight finish and train
  actorjet task resume terse
  actorjet task remove terse
The source module must be importable on the head; the behavior is shipped to the nodes.
"""


def add_task(sub) -> None:
    import argparse

    from actorjet.cli.node_cmds import add_head_options

    p = sub.add_parser("task", help="add, pause, resume or remove a task of a running job",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Batches mix the active tasks by their weights ([train] mix = strict | fill).")
    p.add_argument("action", choices=("add", "pause", "resume", "remove"))
    p.add_argument("name", metavar="NAME")
    p.add_argument("--source", help="add: module with tasks(seed) (and optionally an eval set)")
    p.add_argument("--behavior", help="add: MODULE:FUNCTION, the agent behavior")
    p.add_argument("--weight", type=float, default=1.0, help="add: mixing weight (default 1)")
    add_head_options(p)
    p.set_defaults(func=cmd_task)


def cmd_task(args) -> int:
    from actorjet.cli.behavior_cmds import _registry
    from actorjet.cli.node_cmds import head_address

    config = {}
    if args.action == "add":
        if not args.source or not args.behavior:
            raise UserError("task add needs --source MODULE and --behavior MODULE:FUNCTION")
        if args.weight <= 0:
            raise UserError("--weight must be > 0")
        config = {"source": args.source, "behavior": args.behavior, "weight": args.weight}
    asys, registry = _registry(*head_address(args))
    reply = system.ask(asys, registry, proto.TaskCommand(args.action, args.name, config), proto.TaskReply, 30)
    if reply is None:
        raise UserError("the registry did not answer within 30 s")
    if not reply.ok:
        raise UserError(reply.error)
    for name, t in reply.tasks.items():
        print(f"{name:<20} weight {t['weight']:<6g} {t['state']:<7} groups issued {t['issued']}")
    return 0
