"""An episode's KV cache kept between its calls: the CPU engine prefills only new tokens.

A long agent sends its whole context on every call; prefilling all of it again made a call at
turn 50 cost 117x one at turn 1 (bench/long_episodes.py, 32k tokens).  vLLM reuses KV blocks by
prefix (``enable_prefix_caching``); the transformers engine keeps, per conversation (the
gateway's episode and role), the KV cache of its last call and the ids it covers.  The next
call keeps the part of it its prompt shares and runs only the rest, in the same batch as every
other conversation (serving/kv_rows.py).

Bounded by a memory budget, least recently used first out.  An entry is used only with the
weights (version and adapter) that computed it: new weights make every entry stale.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

from actorjet.rl.calls import common_prefix
from actorjet.serving.kv_rows import RowKV, nbytes

MIN_TOKENS = 64          # prompts shorter than this are batched as before (nothing worth keeping)


@dataclass
class Entry:
    ids: bytes          # the tokens whose keys and values ``kv`` holds (int32)
    kv: RowKV           # per layer (keys, values) of those tokens
    version: int
    adapter: str
    nbytes: int


class PrefixCache:
    def __init__(self, budget_mb: float = 1024):
        self.budget = int(budget_mb * 1024 * 1024)
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.used = 0
        self.hits = self.misses = 0
        self.reused_tokens = 0

    def take(self, key: str, prompt: list[int], version: int, adapter: str):
        """(kv, n): a cache holding the first n tokens of ``prompt`` (n < len(prompt): at least
        one token is run to get the next logits), or (None, 0).  The entry leaves the cache;
        ``put`` gives it back after the call."""
        entry = self.entries.pop(key, None)
        if entry is None:
            self.misses += 1
            return None, 0
        self.used -= entry.nbytes
        if entry.version != version or entry.adapter != adapter:
            self.misses += 1
            return None, 0
        n = min(common_prefix(array("i", prompt).tobytes(), entry.ids), len(prompt) - 1)
        if n <= 0:
            self.misses += 1
            return None, 0
        self.hits += 1
        self.reused_tokens += n
        return [(k[:, :, :n], v[:, :, :n]) for k, v in entry.kv], n

    def put(self, key: str, ids: list[int], kv: RowKV, version: int, adapter: str) -> None:
        size = nbytes(kv)
        if size > self.budget:
            return
        self.entries[key] = Entry(array("i", ids).tobytes(), kv, version, adapter, size)
        self.used += size
        while self.used > self.budget:
            _, old = self.entries.popitem(last=False)
            self.used -= old.nbytes
