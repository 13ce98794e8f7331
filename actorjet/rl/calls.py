"""A recorded call as the learner sees it: tokens stored once per episode.

The episode store keeps a call's prompt as a *reference* — "the first ``prefix_len`` tokens of
call ``ref``'s prompt + completion" — plus only its ``new_ids``; its messages likewise as the
first ``msg_prefix`` messages of ``ref``'s plus its ``new_messages``.  An episode of T turns
whose context grows to C tokens is then O(C) tokens, not O(T·C), in the store, in memory and
in the learner's packing (rl/trie.py walks the references instead of re-reading prompts).

A call is a plain dict in one of two forms:

    compact       ref (the referenced call's dict, earlier in the same episode, or None),
                  prefix_len, new_ids, msg_prefix, new_messages, and the rest
    materialized  prompt_ids and messages as whole lists (hand-made calls in tests, calls the
                  repairs of rl/pack.py and rl/align.py must rewrite, evaluation)

Every reader goes through the functions below, so both forms work everywhere.
"""
from __future__ import annotations

from array import array


def prompt_len(call: dict) -> int:
    if "prompt_ids" in call:
        return len(call["prompt_ids"])
    return call["prefix_len"] + len(call["new_ids"])


def full_len(call: dict) -> int:
    return prompt_len(call) + len(call["completion_ids"])


def prompt_ids(call: dict) -> list[int]:
    """The call's whole prompt (O(its length): only where a whole prompt is the output)."""
    if "prompt_ids" in call:
        return list(call["prompt_ids"])
    pieces, need, ref = [call["new_ids"]], call["prefix_len"], call["ref"]
    while ref is not None and need > 0:           # the first ``need`` tokens of ref's sequence
        start = prompt_len(ref)
        if need > start:
            pieces.append(ref["completion_ids"][:need - start])
            need = start
        if "prompt_ids" in ref:
            pieces.append(ref["prompt_ids"][:need])
            break
        if need > ref["prefix_len"]:
            pieces.append(ref["new_ids"][:need - ref["prefix_len"]])
            need = ref["prefix_len"]
        ref = ref["ref"]
    out: list[int] = []
    for piece in reversed(pieces):
        out += piece
    return out


def full_ids(call: dict) -> list[int]:
    return prompt_ids(call) + list(call["completion_ids"])


def messages(call: dict) -> list:
    """The call's whole message list (the export and the tool-list repair need it)."""
    if "new_messages" not in call:
        return list(call.get("messages") or [])
    pieces, need, ref = [call["new_messages"]], call["msg_prefix"], call["ref"]
    while ref is not None and need > 0:
        if "new_messages" not in ref:
            pieces.append(list(ref.get("messages") or [])[:need])
            break
        if need > ref["msg_prefix"]:
            pieces.append(ref["new_messages"][:need - ref["msg_prefix"]])
            need = ref["msg_prefix"]
        ref = ref["ref"]
    out: list = []
    for piece in reversed(pieces):
        out += piece
    return out


def materialize(calls: list[dict]) -> None:
    """Give every call its whole ``prompt_ids`` and ``messages`` (computed first for all, so a
    call's reference is read before anything is rewritten).  After this a call stands alone:
    rewriting one prompt (a drift repair) leaves the others as recorded."""
    whole = [(prompt_ids(c), messages(c)) for c in calls]
    for call, (ids, msgs) in zip(calls, whole):
        call["prompt_ids"], call["messages"] = ids, msgs
        for key in ("ref", "prefix_len", "new_ids", "msg_prefix", "new_messages"):
            call.pop(key, None)


def by_episode(calls: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for call in calls:
        out.setdefault(call.get("episode_id", ""), []).append(call)
    return out


def timelines(calls: list[dict]) -> list[list[dict]]:
    """The calls of each (model, role, episode), in call order."""
    by_key: dict[tuple, list[dict]] = {}
    for call in calls:
        by_key.setdefault((call["model"], call["role"], call.get("episode_id", "")), []).append(call)
    for timeline in by_key.values():
        timeline.sort(key=lambda c: (c.get("call_index", 0), c.get("choice", 0)))
    return list(by_key.values())


def is_chain(timeline: list[dict]) -> bool:
    """Does every call of this timeline extend the one before it, token for token (one choice
    per call)?  Then its prompts hold every earlier answer as sampled: no drift to repair, no
    text to align; the repairs skip it without reading a prompt."""
    for before, call in zip(timeline, timeline[1:]):
        if "prompt_ids" in call or call["ref"] is not before or call["prefix_len"] != full_len(before):
            return False
    return True


def needs_prompts(calls: list[dict], every: bool = False) -> list[list[dict]]:
    """The timelines a repair must read prompt by prompt, their episodes' calls materialized
    (rl/calls.py).  A timeline whose calls each extend the one before (``is_chain``) holds
    every answer as sampled and is skipped unread, unless ``every``: that is the long
    episode's common case, and what keeps the learner's batch O(new tokens)."""
    out = []
    for episode in by_episode(calls).values():
        lines = timelines(episode)
        if every or not all(is_chain(t) for t in lines):
            materialize(episode)
            out += lines
    return out


def common_prefix(a: bytes, b: bytes) -> int:
    """How many int32 values two packed id strings share at their start: bytes comparisons
    (memcmp), never a Python loop over the ids."""
    n = min(len(a), len(b)) // 4 * 4
    if a.startswith(b if n == len(b) else b[:n]):
        return n // 4
    lo, hi = 0, n // 4                    # a[:lo] == b[:lo], a[:hi] != b[:hi] (in ids)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(b[4 * lo:4 * mid], 4 * lo):
            lo = mid
        else:
            hi = mid
    return lo


def recompact(calls: list[dict], window: int = 16) -> None:
    """Materialized calls back to references: each refers to the one of the ``window`` calls
    of its episode before it that it shares the most tokens with (ties: the latest).  After a
    repair rewrote some prompts, the trie is built in O(new tokens) again; the comparisons
    are memcmp, not Python loops.  Messages stay whole."""
    for episode in by_episode(calls).values():
        episode.sort(key=lambda c: (c.get("call_index", 0), c.get("choice", 0)))
        seen: list[tuple[dict, bytes]] = []
        for call in episode:
            if "prompt_ids" not in call:
                seen.append((call, array("i", full_ids(call)).tobytes()))
                continue
            prompt = array("i", call["prompt_ids"]).tobytes()
            best, shared = None, 0
            for other, ids in seen[-window:]:
                n = common_prefix(prompt, ids)
                if n >= shared and n > 0:
                    best, shared = other, n
            call["ref"], call["prefix_len"], call["new_ids"] = best, shared, call["prompt_ids"][shared:]
            del call["prompt_ids"]
            seen.append((call, prompt + array("i", call["completion_ids"]).tobytes()))
