"""The context tracker: an episode's recorded calls → the fewest training sequences.

Three modes, one output format (a *packed sample*):

    none    every call is its own sequence (prompt + completion).
    prefix  timeline merging: a call whose whole sequence (prompt + completion) is a prefix
            of a later call's prompt, same model and role, is absorbed into it; its
            completion becomes a trainable span inside the longer sequence, with its own
            recorded logprobs.  Found with prefix hashing in O(total tokens).
    tree    every call of the model goes into one token trie: shared prefixes (a multi-turn
            history, the prompt of a GRPO group, retries that roll back context, agents
            sharing a history) are stored and computed once.  The trie is laid out
            depth-first with a tree attention mask (a token sees only its ancestors) and
            position ids = depth, so each token's logits equal those of its own sequence.

A packed sample:
    input_ids, position_ids   the tokens, laid out
    parents                   index of each token's predecessor (-1 for a root); the logits
                              that predict token i sit at parents[i]
    terms                     one per sampled token of every call: (node, advantage,
                              old_logprob, temperature, version).  A node may carry several
                              terms (two GRPO samples that begin with the same token).
    linear                    True when parents[i] == i - 1 everywhere (plain causal mask)
Nothing trainable is lost or counted twice: every completion token of every call is
exactly one term.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MODES = ("none", "prefix", "tree")


@dataclass
class Packed:
    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    terms: list[tuple] = field(default_factory=list)   # (node, advantage, old_logprob, temperature, version)
    linear: bool = True

    def to_dict(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "parents": self.parents,
                "terms": self.terms, "linear": self.linear}


def _terms(call: dict, start: int, advantage: float) -> list[tuple]:
    temp = call["temperature"] if call["temperature"] > 0 else 1.0
    return [(start + k, advantage, lp, temp, call["weight_version"])
            for k, lp in enumerate(call["logprobs"])]


def _linear(ids: list[int], terms: list[tuple]) -> Packed:
    return Packed(list(ids), list(range(len(ids))), list(range(-1, len(ids) - 1)), terms, True)


def full_ids(call: dict) -> list[int]:
    return list(call["prompt_ids"]) + list(call["completion_ids"])


def pack_none(calls: list[tuple[dict, float]]) -> list[Packed]:
    return [_linear(full_ids(c), _terms(c, len(c["prompt_ids"]), adv)) for c, adv in calls]


def pack_prefix(calls: list[tuple[dict, float]]) -> list[Packed]:
    """Timeline merging with prefix hashing: O(total tokens), not pairwise comparisons.

    Calls are taken in their recorded order, per (model, role).  Each still-open call is
    indexed by (length, hash) of its whole sequence; a later call's prompt is hashed at
    every prefix length, and a hit (confirmed token by token) absorbs the open call."""
    groups: dict[tuple, list] = {}
    for call, adv in calls:
        groups.setdefault((call["model"], call["role"]), []).append((call, adv))
    out: list[Packed] = []
    for group in groups.values():
        group.sort(key=lambda ca: (ca[0].get("episode_id", ""), ca[0].get("call_index", 0), ca[0].get("choice", 0)))
        chains: list[dict] = []                    # each: {"ids": full ids of the tip, "terms": [...]}
        open_by_key: dict[tuple, int] = {}         # (len, hash) of a chain tip → chain index
        for call, adv in group:
            prompt, ids = list(call["prompt_ids"]), full_ids(call)
            absorbed: list[int] = []
            for pos, h in prefix_hashes(prompt):
                idx = open_by_key.get((pos, h))
                if idx is not None and chains[idx]["ids"] == prompt[:pos]:
                    absorbed.append(idx)
            terms = _terms(call, len(prompt), adv)
            for idx in absorbed:                   # keep their trainable spans, in this sequence
                terms = chains[idx]["terms"] + terms
                open_by_key.pop(chains[idx]["key"], None)
                chains[idx]["closed"] = True
            key = (len(ids), _hash(ids))
            chains.append({"ids": ids, "terms": terms, "key": key, "closed": False})
            open_by_key[key] = len(chains) - 1
        out += [_linear(c["ids"], sorted(c["terms"])) for c in chains if not c["closed"]]
    return out


def prefix_hashes(ids: list[int]):
    """(length, hash of ids[:length]) for every prefix, in one pass."""
    h = 0
    for pos, tok in enumerate(ids, start=1):
        h = (h * 1_000_003 + tok + 1) & 0xFFFFFFFFFFFF
        yield pos, h


def _hash(ids: list[int]) -> int:
    h = 0
    for _, h in prefix_hashes(ids):
        pass
    return h


def pack_tree(calls: list[tuple[dict, float]], max_tokens: int | None = None) -> list[Packed]:
    """All calls of one model in one trie (one packed sample per ``max_tokens`` of nodes)."""
    out: list[Packed] = []
    current = _Trie()
    for call, adv in calls:
        ids = full_ids(call)
        if max_tokens and current.size and current.size + len(ids) > max_tokens:
            out.append(current.layout())
            current = _Trie()
        current.add(ids, len(call["prompt_ids"]), _terms(call, 0, adv))
    if current.size:
        out.append(current.layout())
    return out


class _Trie:
    def __init__(self):
        self.children: list[dict[int, int]] = [{}]    # node 0 is a virtual root
        self.token: list[int] = [-1]
        self.parent: list[int] = [-1]
        self.terms: list[list[tuple]] = [[]]
        self.size = 0

    def add(self, ids: list[int], prompt_len: int, terms: list[tuple]) -> None:
        node = 0
        path = []
        for tok in ids:
            nxt = self.children[node].get(tok)
            if nxt is None:
                nxt = len(self.token)
                self.children[node][tok] = nxt
                self.children.append({})
                self.token.append(tok)
                self.parent.append(node)
                self.terms.append([])
                self.size += 1
            node = nxt
            path.append(node)
        for (k, adv, lp, temp, version) in terms:     # k counts completion tokens from 0
            self.terms[path[prompt_len + k]].append((adv, lp, temp, version))

    def layout(self) -> Packed:
        """Depth-first order: ancestors before descendants, each branch contiguous."""
        packed = Packed(linear=True)
        index: dict[int, int] = {}
        stack = [(child, 0) for child in reversed(list(self.children[0].values()))]
        roots = len(self.children[0])
        while stack:
            node, depth = stack.pop()
            i = len(packed.input_ids)
            index[node] = i
            parent = index.get(self.parent[node], -1) if self.parent[node] != 0 else -1
            packed.input_ids.append(self.token[node])
            packed.position_ids.append(depth)
            packed.parents.append(parent)
            if parent != i - 1:
                packed.linear = False
            for adv, lp, temp, version in self.terms[node]:
                packed.terms.append((i, adv, lp, temp, version))
            stack += [(child, depth + 1) for child in reversed(list(self.children[node].values()))]
        if roots > 1:
            packed.linear = False
        return packed


def repair_drift(calls: list[tuple[dict, float]], decode) -> int:
    """Splice sampled ids back where a later prompt re-encoded an earlier completion.

    Chat templates re-render the assistant's text, so a later prompt may hold other ids
    than were sampled (an end-of-turn token dropped, a word split differently).  For each
    call B, earlier calls A of the same model, role and episode whose prompt is a prefix of
    B's prompt are found by prefix hashing; if A's completion is not there as ids but the
    next tokens of B decode to exactly A's text, those tokens are replaced by A's sampled
    ids.  Then prefix merging absorbs A into B and trains exactly what was sampled.
    ``decode(ids)`` must drop special tokens.  Returns the number of repairs; modifies the
    calls' ``prompt_ids`` in place."""
    repairs = 0
    by_timeline: dict[tuple, list] = {}
    for call, _ in calls:
        key = (call["model"], call["role"], call.get("episode_id", ""))
        by_timeline.setdefault(key, []).append(call)
    for timeline in by_timeline.values():
        timeline.sort(key=lambda c: (c.get("call_index", 0), c.get("choice", 0)))
        prompts: dict[tuple, dict] = {}          # (len, hash) of an earlier prompt → its call
        for b in timeline:
            prompt, hits = b["prompt_ids"], []
            for pos, h in prefix_hashes(prompt):
                a = prompts.get((pos, h))
                if a is not None and a["prompt_ids"] == prompt[:pos]:
                    hits.append(a)
            for a in reversed(hits):             # the longest matching earlier prompt first
                start, sampled = len(a["prompt_ids"]), a["completion_ids"]
                if prompt[start:start + len(sampled)] == sampled:
                    break                        # no drift
                text = decode(sampled)
                for j in range(0, min(len(prompt) - start, 2 * len(sampled) + 4) + 1):
                    if decode(prompt[start:start + j]) == text:
                        b["prompt_ids"] = prompt[:start] + list(sampled) + prompt[start + j:]
                        repairs += 1
                        break
                break
            prompts[(len(b["prompt_ids"]), _hash(b["prompt_ids"]))] = b
    return repairs


def pack(calls: list[tuple[dict, float]], mode: str, max_tokens: int | None = None) -> list[Packed]:
    if mode == "none":
        return pack_none(calls)
    if mode == "prefix":
        return pack_prefix(calls)
    if mode == "tree":
        return pack_tree(calls, max_tokens)
    raise ValueError(f"context merge mode must be one of {MODES}, got {mode!r}")


def stats(calls: list[tuple[dict, float]], packed: list[Packed]) -> dict:
    before = sum(len(full_ids(c)) for c, _ in calls)
    after = sum(len(p.input_ids) for p in packed)
    return {"calls": len(calls), "sequences_before": len(calls), "sequences_after": len(packed),
            "tokens_before": before, "tokens_after": after, "token_ratio": before / max(1, after)}
