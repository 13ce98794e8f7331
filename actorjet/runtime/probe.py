"""A minimal managed actor, used by tests and benchmarks of supervision.

It answers pings with its pid and the args its spec gave it, which is exactly what a
restart test needs to see: a new process that got its spec's state back.
"""
from dataclasses import dataclass

from actorjet.runtime.child import ManagedActor


@dataclass
class Finish:
    """Tells a probe that its work is done: it ends normally (``stop_normally``)."""


class Probe(ManagedActor):
    def on_init(self) -> None:
        self.started = True

    def receiveMsg_Finish(self, msg: Finish, sender) -> None:
        self.stop_normally()
