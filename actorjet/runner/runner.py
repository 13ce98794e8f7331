"""The agent runner actor: lives on a node slot, pulls episode leases, runs behaviors.

Placed by the runner supervisor with ``{"node_id": ...}`` requirements.  On start it
tells the node agent which admission placed it, so a runner left behind by a head that
restarted (or by a network cut) is stopped instead of running twice.
"""
from __future__ import annotations

import logging

from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.node import NODE_AGENT_NAME, NodeAgent, on_node

log = logging.getLogger("actorjet")


class AgentRunner(ManagedActor):
    @staticmethod
    def actorSystemCapabilityCheck(capabilities, requirements):
        return on_node(capabilities, requirements)

    def on_init(self) -> None:
        self.runner_id = self.args["runner_id"]
        self.node_id = self.args["node_id"]
        agent = self.createActor(NodeAgent, globalName=NODE_AGENT_NAME)
        self.send(agent, m.RunnerHello(self.args.get("admission", ""), self.runner_id))

    def info(self) -> dict:
        return {"path": self.path, "runner_id": self.runner_id, "node_id": self.node_id}
