"""Ask a head from inside its own host (network namespace): tests and benches run this with
the host's ``ip netns exec`` prefix, since a head's admin port is that host's loopback.

    ACTORJET_TOKEN=T python tests/headctl.py PORT     then, one per line on stdin, one JSON line back:
        status            → the registry's status
        pid TREE/PATH     → {"pid": N} of that actor (null if absent)
        port TREE/PATH    → {"port": N}: the TCP port that actor listens on (null if absent)
    errors come back as {"error": "..."}; the handle re-attaches after a head restart.
"""
import json
import os
import sys

import actorjet  # noqa: F401  - convention timings before thespian loads
from actorjet.runtime import messages as m
from actorjet.runtime import system
from actorjet.runtime.head import attach_root, lookup, status


def answer(handle, words):
    asys, root = handle
    if words[0] == "status":
        return status(asys, root)
    if words[0] == "pid":
        address = lookup(asys, root, words[1], 5)
        reply = system.ask(asys, address, m.Ping(), m.Pong, 5) if address else None
        return {"pid": reply.pid if reply is not None else None}
    if words[0] == "port":
        address = lookup(asys, root, words[1], 5)
        return {"port": address.addressDetails.sockname[1] if address else None}
    return {"error": f"unknown verb {words[0]!r}"}


if __name__ == "__main__":
    port, handle = int(sys.argv[1]), None
    for line in sys.stdin:
        try:
            handle = handle or attach_root(port, os.environ["ACTORJET_TOKEN"])
            out = answer(handle, line.split())
        except Exception as e:  # noqa: BLE001 - reported to the asker, who retries
            handle, out = None, {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, default=str), flush=True)
