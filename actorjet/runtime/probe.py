"""A minimal managed actor, used by tests and benchmarks of supervision.

It answers pings with its pid and the args its spec gave it, which is exactly what a
restart test needs to see: a new process that got its spec's state back.
"""
from actorjet.runtime.child import ManagedActor


class Probe(ManagedActor):
    def on_init(self) -> None:
        self.started = True
