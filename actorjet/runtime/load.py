"""How busy a node is, for status and `actorjet top`: CPU and memory of the whole machine.

psutil's ``cpu_percent(None)`` compares with its previous call, so a heartbeat a second
apart gives the CPU use over that second at no cost (no sampling sleep)."""
from __future__ import annotations

import psutil


def here() -> dict:
    return {"cpu_percent": psutil.cpu_percent(None), "memory_percent": psutil.virtual_memory().percent}
