"""What the gateway records for every LLM call, and where it keeps it until collected.

Tokens are the truth: a record holds the exact prompt and completion ids the engine saw
and produced, with the logprob of every sampled token and the weight version, so nothing
downstream ever re-tokenizes text (the classic multi-turn drift bug).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields


@dataclass
class CallRecord:
    episode_id: str
    model: str
    role: str
    call_index: int              # order of the call inside the episode (per gateway)
    choice: int                  # index among the n choices of one request
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    weight_version: int
    temperature: float
    messages: list = field(default_factory=list)
    tools: list | None = None
    params: dict = field(default_factory=dict)
    finish_reason: str = ""
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        # Shallow on purpose: records are never mutated after they are stored, and
        # dataclasses.asdict deep-copies every id list (a fifth of the gateway's CPU).
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(CallRecord))


class CallStore:
    """Calls per open episode; ``collect`` hands them over once and closes the episode."""

    def __init__(self, max_closed: int = 200_000):
        self._calls: dict[str, list[CallRecord]] = {}
        self._closed: dict[str, None] = {}
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()
        self.max_closed = max_closed

    def is_closed(self, episode_id: str) -> bool:
        return episode_id in self._closed

    def next_index(self, episode_id: str) -> int:
        with self._lock:
            n = self._counters.get(episode_id, 0)
            self._counters[episode_id] = n + 1
            return n

    def add(self, records: list[CallRecord]) -> None:
        with self._lock:
            for r in records:
                self._calls.setdefault(r.episode_id, []).append(r)

    def collect(self, episode_ids: list[str], close: bool = True, read: bool = True) -> dict[str, list[dict]]:
        """The episodes' calls (``read``), then forget them for good (``close``)."""
        with self._lock:
            out = {e: [r.to_dict() for r in self._calls.get(e, [])] for e in episode_ids} if read else {}
            if close:
                for e in episode_ids:
                    self._calls.pop(e, None)
                    self._counters.pop(e, None)
                    self._closed[e] = None
                while len(self._closed) > self.max_closed:     # bounded memory
                    self._closed.pop(next(iter(self._closed)))
            return out

    def open_episodes(self) -> int:
        return len(self._calls)
