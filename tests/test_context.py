"""The context tracker is exact: merged/packed sequences give the same per-token logprobs
and the same gradient as training on every call separately, and each sampled token is
trained exactly once.  Random episodes come from hypothesis."""
import random

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from actorjet.rl.calls import prompt_ids, prompt_len
from actorjet.rl.drift import repair_drift
from actorjet.rl.critic import Critic
from actorjet.rl.pack import Credit, full_ids, pack
from actorjet.rl import exact_attention
from actorjet.models import zoo
from actorjet.rl.algorithms import Algorithm
from actorjet.rl.grpo import MIN_ROWS, ancestors, collate, grpo_step, term_logprobs

VOCAB = range(4, 21)
# The learner's layout-independent attention (`attention = "exact"`): with it, packed and
# unmerged calls agree bit for bit (0.0 on 1000 random episodes); merging errors would be 0.1+.
ATTN = exact_attention.register()
TOLERANCE = 1e-5          # the bound, float32 weights and activations
# Stock float32 attention sums over rows of other lengths and orders when packed: up to
# ~1.7e-5 on 1500 random episodes, from rounding alone.
STOCK_TOLERANCE = 5e-5


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0), attn_implementation=ATTN).eval()


@pytest.fixture(scope="module")
def stock_model():
    return AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0), attn_implementation="eager").eval()


def call(prompt, completion, role="a", model="m", episode="e", index=0, temperature=1.0, version=0, rng=None):
    rng = rng or random.Random(len(prompt))
    return {"model": model, "role": role, "episode_id": episode, "call_index": index, "choice": 0,
            "prompt_ids": list(prompt), "completion_ids": list(completion), "temperature": temperature,
            "weight_version": version, "logprobs": [-rng.random() for _ in completion]}


@st.composite
def episodes(draw):
    """Multi-turn chains, retries that drop context, forks, interleaved roles, two models."""
    rng = random.Random(draw(st.integers(0, 10 ** 6)))
    tok = lambda n: [rng.choice(VOCAB) for _ in range(n)]  # noqa: E731
    calls, index = [], 0
    for _ in range(draw(st.integers(1, 3))):                      # agents / models
        role, mdl = rng.choice("ab"), rng.choice(["m", "m2"])
        history = tok(rng.randint(1, 6))
        for _ in range(draw(st.integers(1, 4))):                  # turns
            kind = rng.choice(["turn", "turn", "retry", "fork"])
            completion = tok(rng.randint(1, 4))
            calls.append(call(history, completion, role, mdl, index=index, temperature=rng.choice([1.0, 0.7]),
                              rng=rng))
            index += 1
            if kind == "turn":        # the next prompt continues this timeline
                history = history + completion + tok(rng.randint(0, 3))
            elif kind == "fork":      # a sibling sample from the same prompt
                calls.append(call(history, tok(rng.randint(1, 4)), role, mdl, index=index, rng=rng))
                index += 1
            # retry: context rolled back, the next call reuses `history` unchanged
    return [(c, rng.uniform(-1, 1)) for c in calls]


def by_model(calls):
    out = {}
    for c, adv in calls:
        out.setdefault(c["model"], []).append((c, adv))
    return out


def reference_terms(model_, calls):
    """Each call alone: the logprob of each of its completion tokens, keyed by identity.

    Right-padded (masked) to MIN_ROWS tokens, as the learner pads: the same math, but a call
    of up to ~5 tokens would otherwise go through the BLAS small-matrix kernel, whose rounding
    differs by ~1e-5 from every larger matrix, merged or not."""
    out = {}
    for c, _ in calls:
        ids = full_ids(c)
        pad = max(0, MIN_ROWS - len(ids))
        with torch.no_grad():
            logits = model_(input_ids=torch.tensor([ids + [0] * pad]),
                            attention_mask=torch.tensor([[1] * len(ids) + [0] * pad])).logits[0]
        n = prompt_len(c)
        for k, tok in enumerate(c["completion_ids"]):
            lp = torch.log_softmax(logits[n + k - 1] / c["temperature"], -1)[tok]
            out[(id(c), k)] = float(lp)
    return out


def packed_for(group, mode):
    """``tree-split``: tree packing with a tiny size limit, so subtrees are split at their
    branches and shared paths are repeated (the terms of a repeated token counted once)."""
    if mode == "tree-split":
        return [p.to_dict() for p in pack(group, "tree", max_tokens=10)]
    return [p.to_dict() for p in pack(group, mode)]


def test_a_tree_mask_row_holds_the_token_and_exactly_its_ancestors():
    """rl/grpo.py ``ancestors`` (chain by chain) against walking each token's parents one
    by one, on random forests: chains, bushes, several roots, a single token."""
    rng = random.Random(7)
    for n in [1, 2, 3, 17, 64, 200] + [rng.randint(1, 120) for _ in range(30)]:
        shape = rng.choice(["chain", "bush", "random"])
        parents = [-1]
        for i in range(1, n):
            if shape == "chain":
                parents.append(i - 1)
            elif shape == "bush":
                parents.append(rng.choice([-1, 0]))
            else:
                parents.append(rng.randint(-1, i - 1))
        want = torch.zeros((n, n), dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                want[i, j] = True
                j = parents[j]
        assert torch.equal(ancestors(parents), want), (shape, parents)


@pytest.mark.parametrize("mode", ["prefix", "tree", "tree-split"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=episodes())
def test_packed_logprobs_equal_unmerged_and_every_token_counts_once(model, mode, calls):
    for group in by_model(calls).values():
        packed = packed_for(group, mode)
        assert sum(len(p["terms"]) for p in packed) == sum(len(c["completion_ids"]) for c, _ in group)
        assert sum(len(p["input_ids"]) for p in packed) <= sum(len(full_ids(c)) for c, _ in group)
        with torch.no_grad():
            got = sorted(float(x) for p in packed for x in term_logprobs(model, collate([p], 0)))
        want = sorted(reference_terms(model, group).values())
        assert max(abs(a - b) for a, b in zip(got, want)) <= TOLERANCE
        # the recorded logprobs and advantages travel with their tokens
        assert sorted((t[1], t[2]) for p in packed for t in p["terms"]) == \
            sorted((adv, lp) for c, adv in group for lp in c["logprobs"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=episodes())
def test_stock_float32_attention_differs_only_by_rounding(stock_model, calls):
    """Models keep their own attention kernel by default; packing then changes logprobs only
    at float32 rounding level."""
    for group in by_model(calls).values():
        with torch.no_grad():
            got = sorted(float(x) for p in packed_for(group, "tree") for x in term_logprobs(stock_model, collate([p], 0)))
        want = sorted(reference_terms(stock_model, group).values())
        assert max(abs(a - b) for a, b in zip(got, want)) <= STOCK_TOLERANCE


def gradient(model_dir, samples, algo=Algorithm(grad_clip=1e9)):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=ATTN)
    critic = None
    if algo.name == "ppo":               # a critic on the trunk, its head random so values differ
        torch.manual_seed(1)
        critic = Critic(model.config.hidden_size)
        torch.nn.init.normal_(critic.head.weight, std=0.05)
    grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.0), samples, algo, 0, critic=critic)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def credited(group):
    """The hypothesis episodes' calls as rl/batching.py credits them: each (role, model) chain one
    trajectory, its calls its turns, each call's advantage also its reward at its last token."""
    trajs, out = {}, []
    for i, (c, adv) in enumerate(group):
        traj = trajs.setdefault((c["role"], c["model"]), [len(trajs), 0])
        out.append((c, Credit(adv, i, traj[0], traj[1], adv)))
        traj[1] += 1
    return out


ALGORITHMS = [Algorithm("dr_grpo", loss_agg="seq-mean-token-sum", grad_clip=1e9),
              Algorithm("gspo", clip_low=0.2, clip_high=0.28, loss_agg="seq-mean-token-mean", grad_clip=1e9),
              Algorithm("rloo", tis_cap=2.0, grad_clip=1e9),
              Algorithm("reinforce_pp", gamma=0.9, grad_clip=1e9),
              Algorithm("ppo", lam=0.9, grad_clip=1e9)]


# Hypothesis found it: three forks of one prompt, two beginning with the same token (sampled at
# two temperatures), and a call extending one of them.  Tree-split carries the shared token's
# term of the second fork into the first fork's sample, and micro-batching then put that sample
# in another pass than the rest of the call: GSPO's per-call ratio, taken per pass, was wrong.
SPLIT_CALL = [({'model': 'm','role': 'a','episode_id': 'e','call_index': 0,'choice': 0,'prompt_ids': [10, 6, 17, 16],'completion_ids': [13, 11, 11, 15],'temperature': 0.7,'weight_version': 0,'logprobs': [-0.4622833084693295,-0.5221784525906269,-0.5713267763065046,-0.2691793983969296]},-0.030841845603561513),({'model': 'm','role': 'a','episode_id': 'e','call_index': 1,'choice': 0,'prompt_ids': [10, 6, 17, 16],'completion_ids': [15, 18, 18],'temperature': 1.0,'weight_version': 0,'logprobs': [-0.9515337881170133,-0.16807728429428304,-0.8420698385634163]},0.2746705284315323),({'model': 'm','role': 'a','episode_id': 'e','call_index': 2,'choice': 0,'prompt_ids': [10, 6, 17, 16],'completion_ids': [13, 8, 15, 14],'temperature': 1.0,'weight_version': 0,'logprobs': [-0.671090278438177,-0.2581153306594747,-0.25444896863489586,-0.21688883995740937]},0.7624660837595687),({'model': 'm','role': 'a','episode_id': 'e','call_index': 3,'choice': 0,'prompt_ids': [10, 6, 17, 16, 13, 8, 15, 14, 20, 10, 5],'completion_ids': [18, 15, 9, 8],'temperature': 0.7,'weight_version': 0,'logprobs': [-0.37509170251840185,-0.2805794523608741,-0.871668866658294,-0.9989660071627169]},0.9324273352695396)]


@pytest.mark.parametrize("algo", ALGORITHMS, ids=[a.name for a in ALGORITHMS])
@settings(max_examples=3, deadline=None)
@given(calls=episodes())
@example(calls=SPLIT_CALL)
def test_every_algorithm_gets_the_same_gradient_packed_or_not(algo, calls):
    """Sequence ratios, sequence weights, importance weights, per-token returns and the
    critic's values (PPO) all follow their tokens into packed samples."""
    model_dir = zoo.tiny_arith(0)
    group = credited(next(iter(by_model(calls).values())))
    grads = {mode: gradient(model_dir, packed_for(group, mode), algo) for mode in ("none", "prefix", "tree-split")}
    for mode in ("prefix", "tree-split"):
        assert (grads[mode] - grads["none"]).abs().max() <= TOLERANCE, mode


@settings(max_examples=8, deadline=None)
@given(calls=episodes())
def test_gradient_is_the_same_for_none_prefix_and_tree(calls):
    model_dir = zoo.tiny_arith(0)
    group = by_model(calls)["m"] if "m" in by_model(calls) else next(iter(by_model(calls).values()))
    grads = {mode: gradient(model_dir, packed_for(group, mode)) for mode in ("none", "prefix", "tree", "tree-split")}
    for mode in ("prefix", "tree", "tree-split"):
        assert (grads[mode] - grads["none"]).abs().max() <= TOLERANCE, mode


def test_a_multi_turn_chain_collapses_to_one_sequence_and_a_group_shares_its_prompt():
    turn1 = call([5, 6, 7], [8, 9], index=0)
    turn2 = call([5, 6, 7, 8, 9, 10], [11], index=1)
    turn3 = call([5, 6, 7, 8, 9, 10, 11, 12], [13, 14], index=2)
    chain = [(turn1, 1.0), (turn2, 1.0), (turn3, 1.0)]
    prefix = pack(chain, "prefix")
    assert len(prefix) == 1 and prefix[0].input_ids == full_ids(turn3) and len(prefix[0].terms) == 5
    group = [(call([5, 6, 7, 8], [9 + k, 10]), float(k)) for k in range(8)]
    tree = pack(group, "tree")
    assert len(tree) == 1 and len(tree[0].input_ids) == 4 + 8 * 2 and not tree[0].linear
    assert len(pack(group, "prefix")) == 8      # siblings are not prefixes of each other


def test_prefix_merging_respects_model_and_role():
    a = call([5, 6], [7], role="a")
    b = call([5, 6, 7, 8], [9], role="b")
    assert len(pack([(a, 1.0), (b, 1.0)], "prefix")) == 2
    b_same = call([5, 6, 7, 8], [9], role="a", index=1)
    assert len(pack([(a, 1.0), (b_same, 1.0)], "prefix")) == 1


def test_drift_repair_splices_the_sampled_ids_back_then_prefix_merging_succeeds():
    # turn 1 sampled "4","2",<eos>; the template re-rendered only the text "42" in turn 2
    eos, four, two, plus, one, eq = 2, 8, 6, 14, 5, 17
    first = call([4, 5, eq], [four, two, eos], index=0)
    second = call([4, 5, eq, four, two, plus, one, eq], [7], index=1)
    names = {eos: "", four: "4", two: "2", plus: "+", one: "1", eq: "="}
    decode = lambda ids: "".join(names.get(i, "x") for i in ids)  # noqa: E731
    calls = [(first, 1.0), (second, 1.0)]
    assert len(pack(calls, "prefix")) == 2                   # drift: no merge
    assert repair_drift(calls, decode) == 1
    assert prompt_ids(second) == [4, 5, eq, four, two, eos, plus, one, eq]
    assert second["ref"] is first and second["prefix_len"] == 6     # now it extends the first call
    merged = pack(calls, "prefix")
    assert len(merged) == 1 and len(merged[0].terms) == 4    # both calls' sampled tokens, once each


def test_real_multi_turn_episodes_through_the_gateway_merge_exactly(model):
    """agents/multiturn.py (openai SDK, 3 turns) against the real gateway and engine: the
    recorded calls merge (drift repaired where the template re-encodes an answer) into fewer
    sequences whose logprobs equal each call's own, and every sampled token is trained once."""
    from actorjet import signing
    from actorjet.serving.transformers_engine import TransformersEngine
    from actorjet.serving.gateway_app import GatewayApp, local_backend
    from actorjet.serving.serve import AppServer
    from actorjet.runner.llm import LLM
    from actorjet_agents import multiturn

    engine = TransformersEngine(zoo.tiny_arith(0), seed=0)
    gw = GatewayApp("m", engine.tokenizer, local_backend(engine), "test", engine.max_len)
    server = AppServer(gw.app())
    try:
        for e in range(4):
            multiturn.behavior(next(multiturn.tasks(e)), LLM({"m": server.url + "/v1"}, signing.mint_key("test", f"r{e}")))
        recorded = gw.store.calls([f"r{e}" for e in range(4)])
    finally:
        server.stop()
        engine.close()
    calls = [(c, random.Random(i).uniform(-1, 1)) for i, c in enumerate(x for v in recorded.values() for x in v)]
    assert len(calls) == 12
    repair_drift(calls, lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True))
    want = sorted(reference_terms(model, calls).values())
    for mode in ("prefix", "tree"):
        packed = packed_for(calls, mode)
        assert len(packed) < len(calls)                        # turns were merged
        with torch.no_grad():
            got = sorted(float(x) for p in packed for x in term_logprobs(model, collate([p], 0)))
        assert len(got) == sum(len(c["completion_ids"]) for c, _ in calls)
        assert max(abs(a - b) for a, b in zip(got, want)) <= TOLERANCE, mode
