"""Ask a head from inside its own host (network namespace): tests run this with the
host's ``ip netns exec`` prefix, since a head's admin port is that host's loopback.

    python tests/headctl.py status PORT          → the registry's status, JSON
    python tests/headctl.py pid PORT TREE/PATH   → {"pid": N} of that actor (null if absent)
"""
import json
import sys

import actorjet  # noqa: F401  - convention timings before thespian loads
from actorjet.runtime import messages as m
from actorjet.runtime.head import attach_root, lookup, status

if __name__ == "__main__":
    verb, port = sys.argv[1], int(sys.argv[2])
    asys, root = attach_root(port)
    if verb == "status":
        print(json.dumps(status(asys, root), default=str))
    elif verb == "pid":
        address = lookup(asys, root, sys.argv[3], 5)
        reply = asys.ask(address, m.Ping(), 5) if address else None
        print(json.dumps({"pid": reply.pid if isinstance(reply, m.Pong) else None}))
