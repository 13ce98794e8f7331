"""The store's long-episode record format (issue 30) trains exactly what the whole-prompt format
did: random multi-turn episodes with forks (n choices), rollbacks, retries, drifted re-renders,
a changed tool list and two roles, in GRPO groups whose members often sample the same answer,
are recorded through the store and packed from its references; the reference below packs the
same calls given whole, with the hash-based merging the project used before (kept here as the
oracle).  And a store of the old format is migrated on open."""
import json
import random
import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from actorjet.rl import pack
from actorjet.rl.drift import repair_drift
from actorjet.rl.batching import credit
from actorjet.rl.calls import full_len
from actorjet.rl.pack import _PackTrie, _hash, _linear, _terms, prefix_hashes
from actorjet.store.episode_store import EpisodeStore
from actorjet.store.records import CallRecord


# -- the oracle: the whole-prompt packing as it was (git 76ca5fa, rl/pack.py) -------------------
def old_full(call):
    return list(call["prompt_ids"]) + list(call["completion_ids"])


def old_pack_prefix(calls):
    groups = {}
    for call, adv in calls:
        groups.setdefault((call["model"], call["role"]), []).append((call, adv))
    out = []
    for group in groups.values():
        group.sort(key=lambda ca: (ca[0].get("episode_id", ""), ca[0].get("call_index", 0), ca[0].get("choice", 0)))
        chains, open_by_key = [], {}
        for call, adv in group:
            prompt, ids = list(call["prompt_ids"]), old_full(call)
            absorbed = []
            for pos, h in prefix_hashes(prompt):
                idx = open_by_key.get((pos, h))
                if idx is not None and chains[idx]["ids"] == prompt[:pos]:
                    absorbed.append(idx)
            terms = _terms(call, len(prompt), adv)
            for idx in absorbed:
                terms = chains[idx]["terms"] + terms
                open_by_key.pop(chains[idx]["key"], None)
                chains[idx]["closed"] = True
            key = (len(ids), _hash(ids))
            chains.append({"ids": ids, "terms": terms, "key": key, "closed": False})
            open_by_key[key] = len(chains) - 1
        out += [_linear(c["ids"], sorted(c["terms"])) for c in chains if not c["closed"]]
    return out


class OldTrie(_PackTrie):
    def add_whole(self, ids, prompt_len, terms):
        node, path = 0, []
        for tok in ids:
            node = self._extend(node, [tok])
            path.append(node)
        for (k, *rest) in terms:
            self.terms.setdefault(path[prompt_len + k], []).append(tuple(rest))


def old_pack(calls, mode):
    if mode == "none":
        return [_linear(old_full(c), _terms(c, len(c["prompt_ids"]), adv)) for c, adv in calls]
    if mode == "prefix":
        return old_pack_prefix(calls)
    trie = OldTrie()
    for call, adv in calls:
        trie.add_whole(old_full(call), len(call["prompt_ids"]), _terms(call, 0, adv))
    return trie.layouts(1 << 62)


def old_repair_drift(calls, decode):
    """rl/drift.py's rule on whole prompts, written plainly: B's prompt = the repaired prompt
    of the call whose recorded prompt is the longest prefix of B's (the latest of a length)
    + the rest of B's recorded prompt, with that call's drifted answer spliced back."""
    by_timeline, repairs = {}, 0
    for call, _ in calls:
        by_timeline.setdefault((call["model"], call["role"], call.get("episode_id", "")), []).append(call)
    for timeline in by_timeline.values():
        timeline.sort(key=lambda c: (c.get("call_index", 0), c.get("choice", 0)))
        recorded = [list(b["prompt_ids"]) for b in timeline]
        for i, b in enumerate(timeline):
            prompt = recorded[i]
            hits = [k for k in range(i) if prompt[:len(recorded[k])] == recorded[k]]
            if not hits:
                continue
            k = max(hits, key=lambda k: (len(recorded[k]), k))
            a = timeline[k]
            rest, sampled = prompt[len(recorded[k]):], a["completion_ids"]
            if rest[:len(sampled)] != sampled:
                text = decode(sampled)
                for j in range(0, min(len(rest), 2 * len(sampled) + 4) + 1):
                    if decode(rest[:j]) == text:
                        rest = list(sampled) + rest[j:]
                        repairs += 1
                        break
            b["prompt_ids"] = list(a["prompt_ids"]) + rest
    return repairs


def decode(ids):
    """A toy decode in which 9 and (7, 7) spell the same text: drift is repairable."""
    return "".join("77" if t == 9 else str(t) for t in ids)


# -- random episodes -------------------------------------------------------------------------
def answer(rng):
    return [rng.choice([1, 2, 3, 9]) for _ in range(rng.randint(1, 3))]


def episode_records(rng, episode_id, system):
    """One episode's calls, as the gateway would record them."""
    out, last, index = [], {}, 0
    for _ in range(rng.randint(1, 7)):
        role = rng.choice(["a", "a", "b"])
        prev = last.get(role) or last.get("a" if role == "b" else "b")
        kind = rng.random()
        if prev is None:
            prompt = system + [rng.randint(1, 5)]
        else:
            full = prev[0] + rng.choice(prev[1])
            if kind < 0.55:                    # the conversation goes on
                prompt = full + [rng.randint(4, 6) for _ in range(rng.randint(1, 3))]
            elif kind < 0.7:                   # rolled back to an earlier point
                prompt = full[:rng.randint(1, len(full))] + [rng.randint(4, 6)]
            elif kind < 0.8:                   # the answer re-rendered: 9 spelled as 7 7
                prompt = [x for t in full for x in ((7, 7) if t == 9 and rng.random() < 0.5 else (t,))] + [5]
            elif kind < 0.9:                   # the tool list changed: a new first token
                prompt = [8] + full + [6]
            else:                              # the same prompt again (a retry)
                prompt = list(prev[0])
        n = rng.choice([1, 1, 1, 2, 3])
        answers = [answer(rng) for _ in range(n)]
        msgs = [{"role": "user", "content": str(len(prompt))}]
        for k, completion in enumerate(answers):
            out.append(CallRecord(episode_id, "m", role, index, k, list(prompt), completion,
                                  [-rng.randint(1, 64) / 64 for _ in completion], rng.randint(0, 2),
                                  rng.choice([0.0, 1.0]), msgs, None))
        last[role] = (prompt, answers)
        index += 1
    return out


def groups_of(rng, store):
    groups = []
    for g in range(rng.randint(1, 3)):
        system = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
        episodes = [f"g{g}.{k}" for k in range(rng.randint(2, 4))]
        for e in episodes:
            store.add(episode_records(rng, e, system))
        groups.append(({"group_id": f"g{g}", "size": len(episodes), "task_name": "t", "behavior": "b", "version": 1},
                       [{"episode_id": e, "member": k, "reward": float(k % 2)} for k, e in enumerate(episodes)]))
    for group, episodes in groups:
        store.put_results(group, episodes)
    return [g["group_id"] for g, _ in groups]


def as_before(group: dict, whole: dict) -> dict:
    """The same group as the old store returned it: every call whole."""
    return dict(group, calls={e: [dict(c) for c in whole[e]] for e in group["calls"]})


def packs_like_whole_prompts(store, ids) -> list[dict]:
    """Pack the taken groups from the compact form and from whole prompts (old_pack,
    old_repair_drift), with and without drift repair, in every mode: they must agree.
    Returns the repaired compact calls (for checks on their form)."""
    taken = store.take({}, len(ids))
    whole = store.calls([e for g in taken for e in g["calls"]])
    for mode in ("none", "prefix", "tree"):
        for repair in (False, True):
            new_groups = [dict(g, calls={e: [dict(c) for c in cs] for e, cs in g["calls"].items()}) for g in taken]
            for g in new_groups:       # references point at the copies, as the store hands them out
                for cs in g["calls"].values():
                    index = {(c["call_index"], c["choice"]): c for c in cs}
                    for c in cs:
                        if c["ref"] is not None:
                            c["ref"] = index[(c["ref"]["call_index"], c["ref"]["choice"])]
            new_calls, _ = credit("m", new_groups)
            old_calls, _ = credit("m", [as_before(g, whole) for g in taken])
            if repair:
                assert repair_drift(new_calls, decode) == old_repair_drift(old_calls, decode)
            new = [p.to_dict() for p in pack.pack(new_calls, mode)]
            old = [p.to_dict() for p in old_pack(old_calls, mode)]
            assert new == old, (mode, repair)
    return [c for c, _ in new_calls]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10 ** 9))
def test_the_compact_format_packs_exactly_what_whole_prompts_did(seed):
    rng = random.Random(seed)
    store = EpisodeStore()
    packs_like_whole_prompts(store, groups_of(rng, store))


def long_agent_records(rng, episode_id, turns):
    """One role, many turns, each prompt = the last prompt + the answer *as the template
    re-rendered it* (9 may come back as 7 7) + a user message: drift in most turns."""
    out, prompt = [], [1, 2]
    for index in range(turns):
        completion = answer(rng)
        out.append(CallRecord(episode_id, "m", "a", index, 0, list(prompt), completion,
                              [-rng.randint(1, 64) / 64 for _ in completion], 0, 1.0,
                              [{"role": "user", "content": str(index)}], None))
        shown = [x for t in completion for x in ((7, 7) if t == 9 and rng.random() < 0.7 else (t,))]
        prompt = prompt + shown + [rng.randint(4, 6) for _ in range(rng.randint(1, 3))]
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10 ** 9))
def test_drift_in_every_turn_is_repaired_by_reference_without_reading_whole_prompts(seed):
    rng = random.Random(seed)
    store = EpisodeStore()
    episodes = [f"e{k}" for k in range(rng.randint(2, 3))]
    for e in episodes:
        store.add(long_agent_records(rng, e, rng.randint(2, 12)))
    store.put_results({"group_id": "g", "size": len(episodes), "task_name": "t", "behavior": "b", "version": 1},
                      [{"episode_id": e, "member": k, "reward": float(k % 2)} for k, e in enumerate(episodes)])
    calls = packs_like_whole_prompts(store, ["g"])
    assert all("prompt_ids" not in c for c in calls)             # never materialized
    for episode in {c["episode_id"] for c in calls}:              # repaired: each turn extends the last
        line = sorted((c for c in calls if c["episode_id"] == episode), key=lambda c: c["call_index"])
        assert all(c["ref"] is b and c["prefix_len"] == full_len(b) for b, c in zip(line, line[1:]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10 ** 9))
def test_every_call_reads_back_as_recorded(seed):
    rng = random.Random(seed)
    store = EpisodeStore()
    recorded = {}
    for k in range(3):
        records = episode_records(rng, f"e{k}", [1, 2])
        recorded[f"e{k}"] = records
        store.add(records)
    back = store.calls(list(recorded))
    for e, records in recorded.items():
        assert [(c["prompt_ids"], c["completion_ids"], c["messages"], c["role"]) for c in back[e]] == \
            [(r.prompt_ids, r.completion_ids, r.messages, r.role) for r in records]
        assert [c["logprobs"] for c in back[e]] == [r.logprobs for r in records]     # float32-exact values


def test_a_long_conversation_is_stored_once(tmp_path):
    """50 turns growing to ~10k tokens: the store keeps each token once (+ its text once)."""
    store = EpisodeStore(tmp_path / "s.sqlite")
    prompt, messages = [1] * 50, [{"role": "system", "content": "x" * 50}]
    for turn in range(50):
        messages = messages + [{"role": "user", "content": "u" * 200}]
        prompt = prompt + [2] * 200
        store.add([CallRecord("e", "m", "a", turn, 0, list(prompt), [3, 4], [-0.5, -0.5], 0, 1.0, messages)])
        prompt += [3, 4]
        messages = messages + [{"role": "assistant", "content": "ab"}]
    store.flush()
    with store.lock:
        stored = store.db.execute("SELECT SUM(LENGTH(new_ids)), COUNT(*), SUM(prefix_len > 0) FROM calls").fetchone()
        text = store.db.execute("SELECT SUM(LENGTH(new_messages)) FROM calls").fetchone()[0]
    assert stored == (4 * len(prompt[:-2]) - 4 * 2 * 49, 50, 49)   # every prompt id once; the answers in their calls
    assert text < 1.5 * (50 + 50 * 200 + 49 * 2)                    # every message once, as JSON
    assert store.calls(["e"])["e"][-1]["prompt_ids"] == prompt[:-2]


def test_a_store_of_the_old_format_is_migrated_on_open(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE calls (episode_id TEXT NOT NULL, call_index INTEGER NOT NULL, "
                     "choice INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY (episode_id, call_index, choice));")
    old = [CallRecord("e1", "m", "a", i, 0, [1, 2] + [3] * (4 * i), [3, 3, 3, 3], [-0.25] * 4, 0, 1.0,
                      [{"role": "user", "content": "q"}]).to_dict() for i in range(3)]
    db.executemany("INSERT INTO calls VALUES (?, ?, ?, ?)", [("e1", c["call_index"], 0, json.dumps(c)) for c in old])
    db.commit()
    db.close()
    store = EpisodeStore(path)
    back = store.calls(["e1"])["e1"]
    assert [c["prompt_ids"] for c in back] == [c["prompt_ids"] for c in old]
    assert [c["prefix"] for c in back] == [None, [0, 0, 6], [1, 0, 10]]     # references found while migrating
    assert store.next_index("e1") == 3
