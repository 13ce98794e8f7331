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

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from actorjet.rl.calls import full_ids, full_len, prompt_len
from actorjet.rl.trie import Trie

MODES = ("none", "prefix", "tree")
SHARE_MIN = 0.1     # tree packing keeps a subtree together when that saves >= 10% of its tokens


class Term(NamedTuple):
    """One sampled token's share of the loss: where it sits in its packed sample (``node``: the
    index of the token it was sampled as), what the loss needs of its sampling, and where it
    sits in its episode (``call``, ``traj``: indices in the batch; ``turn``: the call's place in
    the episode; ``k``: the token's place in the call; ``reward``: what was earned at this
    token, for per-token credit: rl/token_credit.py)."""
    node: int
    advantage: float
    old_logprob: float
    temperature: float
    version: int
    call: int = -1
    k: int = 0
    traj: int = -1
    turn: int = 0
    reward: float = 0.0


class Credit(NamedTuple):
    """What rl/batching.py ``credit`` gives a call: its episode's advantage, and (for per-token
    credit) its indices in the batch and the reward earned at its last token."""
    advantage: float
    call: int = -1
    traj: int = -1
    turn: int = 0
    reward: float = 0.0


@dataclass
class Packed:
    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    linear: bool = True

    def to_dict(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "parents": self.parents,
                "terms": self.terms, "linear": self.linear}


def _terms(call: dict, start: int, credit: Credit | float) -> list[Term]:
    c = credit if isinstance(credit, Credit) else Credit(float(credit))
    temp = call["temperature"] if call["temperature"] > 0 else 1.0
    last = len(call["logprobs"]) - 1
    return [Term(start + k, c.advantage, lp, temp, call["weight_version"], c.call, k, c.traj, c.turn,
                 c.reward if k == last else 0.0)
            for k, lp in enumerate(call["logprobs"])]


def _linear(ids: list[int], terms: list[Term]) -> Packed:
    return Packed(list(ids), list(range(len(ids))), list(range(-1, len(ids) - 1)), terms, True)


def pack_none(calls: list[tuple[dict, float]]) -> list[Packed]:
    return [_linear(full_ids(c), _terms(c, prompt_len(c), adv)) for c, adv in calls]


def call_sample(call: dict, advantage: float) -> dict:
    """One recorded call as one training sample (no merging): what tests and benches hand
    the learner's step directly."""
    return pack_none([(call, advantage)])[0].to_dict()


def pack_prefix(calls: list[tuple[dict, float]]) -> list[Packed]:
    """Timeline merging: O(new tokens), from the store's references.

    Calls are taken in their recorded order, per (model, role).  A still-open call (a chain
    tip) is absorbed by the first later call whose prompt starts with its whole sequence: in
    the trie of the model's calls, by a later call whose prompt ends at or below the tip.  A
    call's prompt is found in the trie through its reference (rl/trie.py); the open tips above
    it are found by walking up from its prompt's end only as far as the first node an earlier
    walk of the same (model, role) passed (above it, every tip was absorbed then), plus any tip
    added since at a node already passed (an answer identical to an earlier one), tested with
    the trie's depth-first numbering.  Of two open calls with the same sequence only the later
    can be absorbed."""
    groups: dict[tuple, list] = {}
    for call, adv in calls:
        groups.setdefault((call["model"], call["role"]), []).append((call, adv))
    tries: dict[str, Trie] = {}
    for (model, _), group in groups.items():
        group.sort(key=lambda ca: (ca[0].get("episode_id", ""), ca[0].get("call_index", 0), ca[0].get("choice", 0)))
        trie = tries.setdefault(model, Trie())
        for call, _ in group:
            trie.add(call, [])
    order = {model: trie.euler() for model, trie in tries.items()}
    out: list[Packed] = []
    for (model, _), group in groups.items():
        trie, (tin, tout) = tries[model], order[model]
        chains: list[dict] = []                    # each: {"tip": node, "terms": [...], "closed": bool}
        open_at: dict[int, int] = {}               # node → the open chain whose tip it is (the latest)
        walked: set[int] = set()                   # nodes some walk passed: no open tip above them then
        late: set[int] = set()                     # open tips added at walked nodes
        for call, adv in group:
            absorbed, node = [], trie.prompt_end(call)
            passed = []
            while node > 0:
                if node in open_at:
                    absorbed.append(open_at[node])
                if node in walked:
                    absorbed += [open_at[t] for t in late if t != node and t in open_at
                                 and tin[t] <= tin[node] <= tout[t]]
                    break
                passed.append(node)
                node = trie.parent[node]
            walked.update(passed)
            terms = _terms(call, prompt_len(call), adv)
            for idx in absorbed:                   # keep their trainable spans, in this sequence
                terms = chains[idx]["terms"] + terms
                open_at.pop(chains[idx]["tip"], None)
                late.discard(chains[idx]["tip"])
                chains[idx]["closed"] = True
            tip = trie.tips[id(call)]
            chains.append({"tip": tip, "terms": terms, "closed": False})
            open_at[tip] = len(chains) - 1
            if tip in walked:
                late.add(tip)
        out += [_linear(trie.path(c["tip"]), sorted(c["terms"])) for c in chains if not c["closed"]]
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
    """All calls of one model in one trie, laid out as one packed sample per subtree.

    Unrelated subtrees (different episodes that share no first token) become separate
    samples: packing them together would only add attention between tokens that must not
    see each other, which costs O(n²) for nothing.  A subtree larger than ``max_tokens`` is
    split at its branches, each part repeating the shared path above it."""
    trie = _PackTrie()
    for call, adv in calls:
        trie.add(call, [t[1:] for t in _terms(call, 0, adv)])
    return trie.layouts(max_tokens or 1 << 62)


def lower_bound(calls: list[tuple[dict, float]]) -> int:
    """Tokens in the trie of all calls: no packing can train on fewer."""
    trie = Trie()
    for call, _ in calls:
        trie.add(call, [])
    return trie.size


class _PackTrie(Trie):
    """The trie laid out as packed samples."""

    def layouts(self, max_tokens: int) -> list[Packed]:
        """Choose the subtrees that become samples.  A node that is split passes its own
        terms (and those it carries) to its first child's sample, so every term is in
        exactly one sample even when its token is repeated as a shared path.

        One tree-masked sample is better than one linear sample per branch only when sharing
        saves a real share of the tokens (>= SHARE_MIN of the subtree): a tree sample is padded
        to its full width in a batch and needs a dense 4D mask, so sharing one or two tokens
        between otherwise unrelated sequences costs more than it saves.  What each subtree
        saves is summed bottom-up once, and a subtree without a branch is one linear sample
        at once: a 32k-token episode is not walked node by node (that was O(n²))."""
        depth, size = [0] * len(self.token), [1] * len(self.token)
        saved = [0] * len(self.token)                 # tokens sharing saves in each subtree
        order = range(1, len(self.token))            # nodes are numbered parents first
        for n in order:
            depth[n] = depth[self.parent[n]] + 1
        for n in reversed(order):
            if len(self.children[n]) > 1:
                saved[n] += depth[n] * (len(self.children[n]) - 1)
            if self.parent[n] > 0:
                size[self.parent[n]] += size[n]
                saved[self.parent[n]] += saved[n]
        out: list[Packed] = []
        stack = [(child, None) for child in reversed(list(self.children[0].values()))]
        while stack:
            node, carried = stack.pop()                # carried: (node, carried) links, or None
            whole = depth[node] - 1 + size[node]
            if not saved[node] or (whole <= max_tokens and saved[node] >= SHARE_MIN * whole):
                out.append(self._layout(node, carried, depth[node] - 1, depth))
                continue
            kids = list(self.children[node].values())
            stack += [(kid, (node, carried) if k == 0 else None) for k, kid in reversed(list(enumerate(kids)))]
        return out

    def _layout(self, top: int, carried: tuple | None, above: int, depth: list[int]) -> Packed:
        """The path above ``top`` (linear), then ``top``'s subtree depth-first: ancestors
        before descendants, each branch contiguous, position = depth."""
        packed = Packed(linear=True)
        path, n = [], self.parent[top]
        while n > 0:
            path.append(n)
            n = self.parent[n]
        path.reverse()
        token, terms = self.token, self.terms
        packed.input_ids = [token[n] for n in path]
        packed.position_ids = list(range(len(path)))
        packed.parents = list(range(-1, len(path) - 1))
        while carried is not None:                   # carried nodes sit on the path, at depth - 1
            node, carried = carried
            packed.terms += [Term(depth[node] - 1, *t) for t in terms.get(node, ())]
        stack = [(top, above, len(path) - 1)]        # (node, its depth - 1, its parent's index)
        while stack:                                 # a run of single children at a time
            node, d, parent = stack.pop()
            run, kids = [node], self.children[node]
            while len(kids) == 1:
                node = next(iter(kids.values()))
                run.append(node)
                kids = self.children[node]
            i = len(packed.input_ids)
            if parent != i - 1:
                packed.linear = False
            packed.input_ids += [token[n] for n in run]
            packed.position_ids += range(d, d + len(run))
            packed.parents.append(parent)
            packed.parents += range(i, i + len(run) - 1)
            for k in [k for k, n in enumerate(run) if n in terms]:
                packed.terms += [Term(i + k, *t) for t in terms[run[k]]]
            stack += [(child, d + len(run), i + len(run) - 1) for child in reversed(list(kids.values()))]
        packed.terms.sort()
        return packed


def pack(calls: list[tuple[dict, float]], mode: str, max_tokens: int | None = None) -> list[Packed]:
    if mode not in MODES:
        raise ValueError(f"context merge mode must be one of {MODES}, got {mode!r}")
    with gc_paused():
        if mode == "none":
            return pack_none(calls)
        if mode == "prefix":
            return pack_prefix(calls)
        return pack_tree(calls, max_tokens)


@contextmanager
def gc_paused():
    """The trie holds a dict per token: the cyclic garbage collector, triggered by those
    allocations, walked them all again and again (the same 32k tokens packed in 0.07 s or
    0.27 s depending on when it ran).  Packing and the repairs make no reference cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def stats(calls: list[tuple[dict, float]], packed: list[Packed]) -> dict:
    before = sum(full_len(c) for c, _ in calls)
    after = sum(len(p.input_ids) for p in packed)
    return {"calls": len(calls), "sequences_before": len(calls), "sequences_after": len(packed),
            "tokens_before": before, "tokens_after": after, "token_ratio": before / max(1, after)}
