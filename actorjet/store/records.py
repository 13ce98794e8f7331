"""What the gateway records for every LLM call, and how the episode store keeps it.

Tokens are the truth: a record holds the exact prompt and completion ids the engine saw
and produced, with the logprob of every sampled token and the weight version, so nothing
downstream ever re-tokenizes text (the classic multi-turn drift bug).

Stored, a call costs O(its new tokens), not O(its context) (issue 30: an episode of T turns
whose context grows to C tokens stored T·C/2 ids as JSON text, ~44 bytes per token of the
final context).  Per episode the store remembers its latest calls (``Tails``); a new call is
kept as a reference to the recorded call it shares the longest token prefix with — (call,
choice, how many of that call's prompt + completion tokens) — plus only its new prompt ids;
ids as packed int32, logprobs as float32; its messages as "the first k messages of that call's"
plus the new ones (JSON), its tool list only when it changed.  The learner reads the rows back
in the compact form of rl/calls.py, and the context tracker follows the references (rl/trie.py)
instead of rediscovering the shared prefixes.

Why keep messages at all: the learner's ``ignore_tools`` repair re-renders a call from its
messages, and ``actorjet export-data`` gives them to people who fine-tune on the trajectories.
Stored once per episode (as new messages), they cost about one more copy of the text.
"""
from __future__ import annotations

import json
import sys
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field, fields

from actorjet.rl.calls import common_prefix, messages, prompt_ids

assert sys.byteorder == "little", "the episode store packs ids as little-endian int32"

ROW_COLUMNS = ("episode_id", "call_index", "choice", "role", "ref_index", "ref_choice", "prefix_len",
               "new_ids", "completion_ids", "logprobs", "weight_version", "temperature", "msg_prefix",
               "new_messages", "tools", "meta")
TAILS_PER_EPISODE = 16          # recent calls an episode's next call may extend (roles, n choices)
TAIL_TOKENS = 64_000_000        # tokens the tails of all open episodes may hold (~256 MB as int32)


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


@dataclass
class Tail:
    """A recorded call an episode's next call may extend: its ids packed as int32 bytes, so
    finding the shared prefix is a memcmp."""
    call_index: int
    choice: int
    prompt: bytes                   # shared by the choices of one request
    completion: bytes
    messages: list
    tools: list | None

    def shared(self, ids: bytes) -> int:
        """How many tokens ``ids`` shares with this call's prompt + completion."""
        if ids.startswith(self.prompt):
            n = len(self.prompt)
            if ids.startswith(self.completion, n):
                return (n + len(self.completion)) // 4
            return n // 4 + common_prefix(ids[n:n + len(self.completion)], self.completion)
        return common_prefix(ids, self.prompt)

    def size(self) -> int:
        return (len(self.prompt) + len(self.completion)) // 4


class Tails:
    """Per open episode, its latest calls (at most TAILS_PER_EPISODE), least recently used
    episodes forgotten beyond TAIL_TOKENS.  A forgotten episode's next call is stored whole:
    correct, only larger."""

    def __init__(self, budget: int = TAIL_TOKENS):
        self.episodes: OrderedDict[str, list[Tail]] = OrderedDict()
        self.tokens, self.budget = 0, budget

    def get(self, episode_id: str) -> list[Tail]:
        tails = self.episodes.get(episode_id)
        if tails is not None:
            self.episodes.move_to_end(episode_id)
        return tails or []

    def push(self, episode_id: str, tail: Tail) -> None:
        tails = self.episodes.setdefault(episode_id, [])
        self.episodes.move_to_end(episode_id)
        tails.append(tail)
        self.tokens += tail.size()
        if len(tails) > TAILS_PER_EPISODE:
            self.tokens -= tails.pop(0).size()
        while self.tokens > self.budget and len(self.episodes) > 1:
            _, old = self.episodes.popitem(last=False)
            self.tokens -= sum(t.size() for t in old)

    def forget(self, episode_id: str) -> None:
        self.tokens -= sum(t.size() for t in self.episodes.pop(episode_id, []))


def encode(record: CallRecord, tails: Tails) -> tuple:
    """The record as a row of the store's ``calls`` table, referring to the recorded call of
    its episode it shares the most prompt tokens with (ties: the latest)."""
    ids = record.prompt_ids
    prompt = (ids if isinstance(ids, array) else array("i", ids)).tobytes()
    best, shared = None, 0
    for tail in tails.get(record.episode_id):
        n = tail.shared(prompt)
        if n >= shared and n > 0:
            best, shared = tail, n
    messages, tools = record.messages, record.tools
    msg_prefix = 0
    if best is not None:
        limit = min(len(best.messages), len(messages))
        while msg_prefix < limit and best.messages[msg_prefix] == messages[msg_prefix]:
            msg_prefix += 1
    if best is not None and len(prompt) == len(best.prompt) and shared == len(prompt):
        prompt = best.prompt            # n choices of one request share their prompt's array
    completion = array("i", record.completion_ids).tobytes()
    tails.push(record.episode_id, Tail(record.call_index, record.choice, prompt, completion, messages, tools))
    same_tools = best is not None and tools == best.tools
    meta = {"model": record.model, "params": record.params, "finish_reason": record.finish_reason,
            "created": record.created}
    return (record.episode_id, record.call_index, record.choice, record.role,
            best.call_index if best else None, best.choice if best else None, shared,
            prompt[4 * shared:], completion,
            array("f", record.logprobs).tobytes(), record.weight_version, record.temperature, msg_prefix,
            json.dumps(messages[msg_prefix:], ensure_ascii=False), None if same_tools else json.dumps(tools),
            json.dumps(meta))


def decode(rows: list[tuple]) -> list[dict]:
    """One episode's rows (in call order) → its calls in the compact form of rl/calls.py.
    A reference to a row that is not there is an error (the group is quarantined)."""
    out: dict[tuple[int, int], dict] = {}
    for (episode_id, index, choice, role, ref_index, ref_choice, prefix_len, new_ids, completion, logprobs,
         version, temperature, msg_prefix, new_messages, tools, meta) in rows:
        ref = None
        if ref_index is not None:
            ref = out.get((ref_index, ref_choice))
            if ref is None:
                raise ValueError(f"episode {episode_id}: call {index} refers to call {ref_index}.{ref_choice}, "
                                 "which is not stored")
        info = json.loads(meta)
        out[(index, choice)] = {
            "episode_id": episode_id, "model": info["model"], "role": role, "call_index": index, "choice": choice,
            "ref": ref, "prefix_len": prefix_len, "new_ids": array("i", new_ids).tolist(),
            "completion_ids": array("i", completion).tolist(), "logprobs": array("f", logprobs).tolist(),
            "weight_version": version, "temperature": temperature, "msg_prefix": msg_prefix,
            "new_messages": json.loads(new_messages),
            "tools": json.loads(tools) if tools is not None else (ref["tools"] if ref else None),
            "params": info["params"], "finish_reason": info["finish_reason"], "created": info["created"]}
    return list(out.values())


def whole(call: dict) -> dict:
    """A compact call (rl/calls.py) as a CallRecord's fields, prompt and messages whole, plus
    ``prefix``: [call, choice, tokens] it was stored against.  O(its context): for people,
    tests and exports, never on the training path."""
    ref = call.get("ref")
    return {"episode_id": call["episode_id"], "model": call["model"], "role": call["role"],
            "call_index": call["call_index"], "choice": call["choice"], "prompt_ids": prompt_ids(call),
            "completion_ids": list(call["completion_ids"]), "logprobs": list(call["logprobs"]),
            "weight_version": call["weight_version"], "temperature": call["temperature"],
            "messages": messages(call), "tools": call.get("tools"), "params": call.get("params", {}),
            "finish_reason": call.get("finish_reason", ""), "created": call.get("created"),
            "prefix": [ref["call_index"], ref["choice"], call["prefix_len"]] if ref else None}


def portable(call: dict) -> dict:
    """A compact call as plain JSON: its reference as [call_index, choice] (for archives)."""
    out = {k: v for k, v in call.items() if k != "ref"}
    ref = call.get("ref")
    out["ref"] = [ref["call_index"], ref["choice"]] if ref else None
    return out


def from_portable(calls: list[dict]) -> list[dict]:
    """``portable`` undone for one episode's calls (in call order)."""
    seen: dict[tuple, dict] = {}
    out = []
    for call in calls:
        call = dict(call)
        ref = call.get("ref")
        call["ref"] = seen[tuple(ref)] if ref else None
        seen[(call["call_index"], call["choice"])] = call
        out.append(call)
    return out
