"""Drift repair: splice sampled ids back where a later prompt re-encoded an earlier answer.

Chat templates re-render the assistant's text, so a later prompt may hold other ids than
were sampled (an end-of-turn token dropped, a word split differently).  Then the earlier
call is not a prefix of the later one and timeline merging (rl/pack.py) cannot absorb it.

The rule, for each call B of a timeline (one model, role and episode, in call order):
  * A is the earlier call whose *recorded* prompt is the longest prefix of B's recorded
    prompt (the latest of equal length);
  * B's prompt becomes A's prompt *as repaired* + the rest of B's recorded prompt, so a
    repair made in an earlier turn holds in every later turn (each repair keeps the text:
    the prompt decodes as before);
  * if A's sampled completion is not next in that rest but some of its next tokens decode
    to exactly A's text, those tokens are replaced by A's sampled ids.
Then B extends A token for token, prefix merging absorbs A, and training sees what was
sampled.  B's own completion is scored in the spliced context, which decodes to the text
it was sampled after.

Two ways to apply the rule, with one result (tests/test_records.py checks them against a
whole-prompt reference on random episodes):
  * **by reference**, O(new tokens): when every call of an episode refers to the call before
    it in its timeline (the store's compact form, rl/calls.py) and its prompt extends that
    call's prompt — the long agent's common case, drift or not — A is that call, and a
    repair only moves B's ``prefix_len`` and trims its ``new_ids``;
  * **by whole prompts**, for the rest (rollbacks, a role that starts from another's
    history): the episode is materialized, repaired, and turned back into references.
"""
from __future__ import annotations

from actorjet.rl.calls import by_episode, full_len, materialize, prompt_len, recompact, timelines


def repair_drift(calls: list[tuple[dict, float]], decode) -> int:
    """Apply the rule above to every timeline of ``calls``.  ``decode(ids)`` must drop special
    tokens.  Modifies the calls in place; returns the number of splices made."""
    repairs, whole = 0, []
    for episode in by_episode([c for c, _ in calls]).values():
        lines = timelines(episode)
        if all(_extends_the_call_before(t) for t in lines):
            repairs += sum(_repair_by_reference(t, decode) for t in lines)
        else:
            materialize(episode)
            repairs += sum(_repair_whole(t, decode) for t in lines)
            whole += episode
    recompact(whole)
    return repairs


def _extends_the_call_before(timeline: list[dict]) -> bool:
    if "prompt_ids" in timeline[0] or timeline[0]["ref"] is not None:
        return False
    for before, call in zip(timeline, timeline[1:]):
        if "prompt_ids" in call or call["ref"] is not before:
            return False
        if not prompt_len(before) <= call["prefix_len"] <= full_len(before):
            return False
    return True


def _splice_at(rest: list[int], sampled: list[int], decode) -> int | None:
    """How many tokens at the start of ``rest`` decode to exactly ``sampled``'s text (None:
    no such count, or ``rest`` already starts with ``sampled``: nothing to repair)."""
    if rest[:len(sampled)] == list(sampled):
        return None
    text = decode(sampled)
    for j in range(0, min(len(rest), 2 * len(sampled) + 4) + 1):
        if decode(rest[:j]) == text:
            return j
    return None


def _repair_by_reference(timeline: list[dict], decode) -> int:
    repairs, moved = 0, 0          # moved: how far the call before's prompt length moved
    for before, call in zip(timeline, timeline[1:]):
        call["prefix_len"] += moved
        start, sampled = prompt_len(before), before["completion_ids"]
        had = call["prefix_len"] - start                 # sampled tokens call's prompt keeps
        if had == len(sampled):
            continue
        was = prompt_len(call)
        # the tokens after before's prompt: sampled[:had] + new_ids; read only as far as needed
        reach = 2 * len(sampled) + 4 - had
        rest = list(sampled[:had]) + list(call["new_ids"][:max(0, reach)])
        j = _splice_at(rest, sampled, decode)
        if j is not None:
            tail = list(call["new_ids"][j - had:]) if j >= had else list(sampled[j:had]) + list(call["new_ids"])
            call["prefix_len"], call["new_ids"] = full_len(before), tail
            repairs += 1
        moved = prompt_len(call) - was + moved
    return repairs


def _repair_whole(timeline: list[dict], decode) -> int:
    repairs, recorded = 0, []      # recorded: (prompt as recorded, call), earliest first
    for call in timeline:
        prompt = call["prompt_ids"]
        a = None
        for other_prompt, other in recorded:             # the longest, the latest of a length
            if len(other_prompt) <= len(prompt) and prompt[:len(other_prompt)] == other_prompt:
                if a is None or len(other_prompt) >= len(a[0]):
                    a = (other_prompt, other)
        recorded.append((list(prompt), call))
        if a is None:
            continue
        a_prompt, a_call = a
        rest = list(prompt[len(a_prompt):])
        j = _splice_at(rest, a_call["completion_ids"], decode)
        if j is not None:
            rest = list(a_call["completion_ids"]) + rest[j:]
            repairs += 1
        call["prompt_ids"] = list(a_call["prompt_ids"]) + rest
    return repairs
