"""Before merging: make calls comparable when their token ids cannot be compared as they are.

Prefix merging (pack.py) compares token ids.  Two situations break that, and each has an
opt-in step here that rewrites later prompts so the id comparison succeeds again:

``match = "text"``   engines that re-tokenize text (a remote OpenAI-style server, or an agent
    framework that sends the conversation as a string): an earlier call's whole text may
    come back inside a later prompt as *other* ids, anywhere, not only in the completion
    (which rl/drift.py already handles).  An earlier call whose decoded prompt +
    completion is a prefix of a later prompt's decoded text is found by hashing text
    prefixes (O(total characters)); the later prompt's ids up to the token boundary where
    that text ends are replaced by the earlier call's exact ids.  Training then uses what
    was sampled; the later call's own completion is scored in the spliced context, which
    decodes to the same text.  If the boundary falls inside a token, nothing is changed.

``ignore_tools``   agents whose tool list changes between turns: the tool definitions are
    rendered at the top of the prompt, so nothing after a change shares a prefix.  Every
    call of a timeline is re-rendered from its recorded messages with the tool list of the
    timeline's last call.  This is an approximation the user opts into: earlier calls are
    trained in a context that lists other tools than they saw (their recorded logprobs keep
    the PPO ratio honest; the clip bounds the rest).

A timeline is the calls of one (model, role, episode), in call order.
"""
from __future__ import annotations

from actorjet.rl.calls import by_episode, full_ids, materialize, needs_prompts, timelines
from actorjet.rl.pack import prefix_hashes


def _text_hash(text: str) -> int:
    h = 0
    for _, h in prefix_hashes([ord(ch) for ch in text]):
        pass
    return h


def _boundary(ids: list[int], text: str, decode) -> int | None:
    """The j with decode(ids[:j]) == text, found by bisection on decoded length; None if
    the text ends inside a token."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) < len(text):
            lo = mid + 1
        else:
            hi = mid
    return lo if decode(ids[:lo]) == text else None


def align_text(calls: list[tuple[dict, float]], decode) -> int:
    """Splice earlier calls' exact ids into later prompts that re-tokenized them.
    ``decode`` must keep special tokens (the chat template's markers are text too).
    Modifies ``prompt_ids`` in place; returns the number of prompts changed."""
    aligned = 0
    for timeline in needs_prompts([c for c, _ in calls], every=True):
        seen: dict[tuple[int, int], tuple[dict, str]] = {}     # (len, hash) of a call's full text
        for b in timeline:
            prompt_text = decode(b["prompt_ids"])
            best = None
            for pos, h in prefix_hashes([ord(ch) for ch in prompt_text]):
                hit = seen.get((pos, h))
                if hit is not None and prompt_text[:pos] == hit[1]:
                    best = hit                                   # the longest one wins
            if best is not None:
                a, a_text = best
                a_ids = full_ids(a)
                if b["prompt_ids"][:len(a_ids)] != a_ids:
                    j = _boundary(b["prompt_ids"], a_text, decode)
                    if j is not None:
                        b["prompt_ids"] = a_ids + list(b["prompt_ids"][j:])
                        aligned += 1
            text = decode(full_ids(b))
            seen[(len(text), _text_hash(text))] = (b, text)
    return aligned


def unify_tools(calls: list[tuple[dict, float]], render) -> int:
    """Re-render every call whose tool list differs from its timeline's last call's.
    ``render(messages, tools) -> prompt ids`` must be the gateway's own rendering.
    Returns the number of prompts re-rendered."""
    changed = 0
    for episode in by_episode([c for c, _ in calls]).values():
        lines = timelines(episode)
        if all(c.get("tools") == t[-1].get("tools") for t in lines for c in t):
            continue                      # one tool list per timeline: nothing to re-render
        materialize(episode)
        for timeline in lines:
            tools = timeline[-1].get("tools")
            for call in timeline[:-1]:
                if call.get("tools") != tools:
                    call["prompt_ids"] = list(render(call["messages"], tools))
                    call["tools"] = tools
                    changed += 1
    return changed
