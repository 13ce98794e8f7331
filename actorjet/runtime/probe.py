"""A minimal managed actor, used by tests and benchmarks of supervision.

It answers pings with its pid and the args its spec gave it, which is exactly what a
restart test needs to see: a new process that got its spec's state back.
"""
import time
from dataclasses import dataclass

from actorjet.runtime.child import ManagedActor


@dataclass
class Finish:
    """Tells a probe that its work is done: it ends normally (``stop_normally``)."""


@dataclass
class HoldStop:
    """Makes a probe's orderly stop take ``seconds`` (an actor whose stop waits for work in flight)."""
    seconds: float


class Probe(ManagedActor):
    hold_stop_s = 0.0

    def on_init(self) -> None:
        self.started = True

    def receiveMsg_HoldStop(self, msg: HoldStop, sender) -> None:
        self.hold_stop_s = msg.seconds
        self.send(sender, msg)

    def on_stop(self) -> None:
        time.sleep(self.hold_stop_s)

    def receiveMsg_Finish(self, msg: Finish, sender) -> None:
        self.stop_normally()
