"""The token trie of a batch's calls, built from the store's references in O(new tokens).

Every call's sequence (prompt + completion) is a path from the root; a shared prefix is one
path.  A call recorded as "``prefix_len`` tokens of call ``ref``, then ``new_ids``" (rl/calls.py)
is inserted by finding the node at depth ``prefix_len`` on ``ref``'s path — ``ref`` was inserted
before it, so that is a walk up from ``ref``'s tip by the few tokens ``ref`` has beyond the
shared prefix (none when the call extends ``ref``) — and adding only ``new_ids`` and the
completion.  A referenced call that is not in the batch (its role earned no reward for this
model) has just the part of its path that the call shares inserted, with no terms: the trie
holds exactly the batch's sequences, as if every prompt had been walked from the root.

Node numbers follow creation order, so two batches of the same sequences inserted in the same
order give the same trie, whichever form (compact or materialized) their calls came in.
"""
from __future__ import annotations

from actorjet.rl.calls import full_len, prompt_len


class Trie:
    def __init__(self):
        self.children: list[dict[int, int]] = [{}]    # node 0 is a virtual root
        self.token: list[int] = [-1]
        self.parent: list[int] = [-1]
        self.terms: dict[int, list[tuple]] = {}      # node → its terms (completion tokens only)
        self.tips: dict[int, int] = {}                # id(call) → the node its sequence ends at
        self.size = 0

    # -- building ----------------------------------------------------------------------
    def _extend(self, node: int, tokens) -> int:
        """Walk ``tokens`` down from ``node``; where the path ends, the rest becomes one new
        chain in a few list operations (a long episode's new tokens are mostly such a chain)."""
        tokens = list(tokens)
        for k, tok in enumerate(tokens):
            nxt = self.children[node].get(tok)
            if nxt is None:
                return self._chain(node, tokens[k:])
            node = nxt
        return node

    def _chain(self, node: int, tokens: list[int]) -> int:
        first = len(self.token)
        self.children[node][tokens[0]] = first
        self.children += [{tok: first + k + 1} for k, tok in enumerate(tokens[1:])]
        self.children.append({})
        self.token += tokens
        self.parent.append(node)
        self.parent += range(first, first + len(tokens) - 1)
        self.size += len(tokens)
        return first + len(tokens) - 1

    def up(self, node: int, steps: int) -> int:
        for _ in range(steps):
            node = self.parent[node]
        return node

    def node_at(self, call: dict, depth: int) -> int:
        """The node at ``depth`` on ``call``'s path, inserting the part of it that is missing."""
        pending: list[tuple[dict, int]] = []          # calls whose tokens past their prefix are needed
        node, c, d = 0, call, depth
        while d > 0:
            tip = self.tips.get(id(c))
            if tip is not None:
                node = self.up(tip, full_len(c) - d)
                break
            if "prompt_ids" in c or c.get("ref") is None:
                ids = list(c["prompt_ids"]) if "prompt_ids" in c else list(c["new_ids"])
                node = self._extend(0, (ids + list(c["completion_ids"]))[:d])
                break
            if d > c["prefix_len"]:
                pending.append((c, d))
                d = c["prefix_len"]
            c = c["ref"]
        for c, d in reversed(pending):
            rest = list(c["new_ids"]) + list(c["completion_ids"])
            node = self._extend(node, rest[:d - c["prefix_len"]])
        return node

    def add(self, call: dict, terms: list[tuple]) -> int:
        """Insert a call; ``terms`` (one per completion token, in order) go on its completion's
        nodes.  Returns its tip."""
        tip = self.node_at(call, full_len(call))
        self.tips[id(call)] = tip
        if terms:
            nodes, node = [], tip
            for _ in range(len(call["completion_ids"])):
                nodes.append(node)
                node = self.parent[node]
            nodes.reverse()
            for node, term in zip(nodes, terms):
                self.terms.setdefault(node, []).append(term)
        return tip

    def prompt_end(self, call: dict) -> int:
        """The node where an inserted call's prompt ends (its root for an empty prompt)."""
        return self.up(self.tips[id(call)], len(call["completion_ids"])) if prompt_len(call) else 0

    def path(self, node: int) -> list[int]:
        """The tokens from the root to ``node``."""
        out = []
        while node > 0:
            out.append(self.token[node])
            node = self.parent[node]
        out.reverse()
        return out

    def euler(self) -> tuple[list[int], list[int]]:
        """Entry and exit numbers of a depth-first walk: a is an ancestor of b (or b itself)
        when tin[a] <= tin[b] <= tout[a]."""
        tin, tout = [0] * len(self.token), [0] * len(self.token)
        clock, stack = 0, [(0, False)]
        while stack:
            node, done = stack.pop()
            if done:
                tout[node] = clock
                continue
            clock += 1
            tin[node] = clock
            stack.append((node, True))
            stack += [(child, False) for child in self.children[node].values()]
        return tin, tout
