"""What another thread hands to an actor.

A thespian actor runs its handlers one at a time in its own thread and cannot be woken by
another thread of its process (an HTTP server's, a prefetcher's).  So that thread puts items
here and the actor takes them all on its next wakeup (``wakeupAfter``): the poll interval is
the latency, and nothing is ever handled outside the actor's thread.
"""
from __future__ import annotations

import queue


class Inbox:
    def __init__(self) -> None:
        self._items: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item) -> None:
        """From any thread."""
        self._items.put(item)

    def drain(self) -> list:
        """Everything put so far, oldest first (in the actor's thread)."""
        items = []
        while True:
            try:
                items.append(self._items.get_nowait())
            except queue.Empty:
                return items
