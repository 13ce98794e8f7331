"""Training verbs: quickstart."""
from __future__ import annotations


def add_quickstart(sub) -> None:
    p = sub.add_parser("quickstart", help="train the tiny arithmetic model on this machine")
    p.set_defaults(func=cmd_quickstart)


def cmd_quickstart(args) -> int:
    from actorjet.errors import UserError
    raise UserError("quickstart is not built yet")
