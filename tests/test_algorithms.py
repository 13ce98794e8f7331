"""The algorithms of rl/algorithms.py against hand-computed values: each estimator, each loss
aggregation, clip-higher, GSPO's sequence ratio, truncated importance sampling, the KL
estimators, REINFORCE++'s and PPO's per-token credit; per-turn rewards and dynamic sampling
through the real episode store; the critic's checkpoint; the job's one-line errors.  Packed vs
unpacked gradients for every algorithm are in test_context.py."""
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from actorjet.config import normalize
from actorjet.errors import UserError
from actorjet.models import zoo
from actorjet.rl import critic as critic_mod
from actorjet.rl.algorithms import Algorithm, episode_advantages, from_config, kl_estimate
from actorjet.rl.batching import BatchConfig, credit, next_batch
from actorjet.rl.grpo import collate, grpo_step, policy_loss, term_logprobs, term_weights
from actorjet.rl.pack import Credit, Term, pack
from actorjet.rl.rewards import bad_reward, total
from actorjet.rl.token_credit import assign
from actorjet.store.episode_store import EpisodeStore
from swarm import REPO
from tests.test_store import finish, record

REWARDS = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}


def test_each_estimator_matches_its_definition():
    grpo = episode_advantages(Algorithm("grpo"), REWARDS)
    assert grpo["a"] == pytest.approx(1.0, abs=1e-5) and grpo["b"] == pytest.approx(-1.0, abs=1e-5)   # (r-.5)/.5
    assert episode_advantages(Algorithm("dr_grpo"), REWARDS) == {"a": 0.5, "b": -0.5, "c": -0.5, "d": 0.5}
    rloo = episode_advantages(Algorithm("rloo"), REWARDS)      # r - mean of the other three
    assert rloo["a"] == pytest.approx(1 - 1 / 3) and rloo["b"] == pytest.approx(0 - 2 / 3)
    assert episode_advantages(Algorithm("gspo"), REWARDS) == grpo
    for name in ("reinforce_pp", "ppo"):                      # per-token: the rewards as they are
        assert episode_advantages(Algorithm(name), REWARDS) == REWARDS
        assert episode_advantages(Algorithm(name), {"a": 1.0, "b": 1.0}) == {"a": 1.0, "b": 1.0}
    for name in ("grpo", "dr_grpo", "rloo", "gspo"):          # no signal in an all-equal group
        assert episode_advantages(Algorithm(name), {"a": 1.0, "b": 1.0}) is None


def test_kl_estimators():
    new, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    lr = new - ref                                             # [0.5, -1.0]
    assert kl_estimate(new, ref, "k1").tolist() == pytest.approx(lr.tolist())
    assert kl_estimate(new, ref, "k2").tolist() == pytest.approx((0.5 * lr ** 2).tolist())
    assert kl_estimate(new, ref, "k3").tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1])
    assert (kl_estimate(new, ref, "k3") >= 0).all()


def terms(n, call, traj=0, turn=0, adv=1.0, rewards=None):
    rewards = rewards or [0.0] * n
    return [Term(k, adv, -1.0, 1.0, 0, call, k, traj, turn, rewards[k]) for k in range(n)]


def sample(ts, **extra):
    n = max(t.node for t in ts) + 2
    return {"input_ids": list(range(4, 4 + n)), "position_ids": list(range(n)), "parents": list(range(-1, n - 1)),
            "terms": [t._replace(node=t.node + 1) for t in ts], "linear": True, **extra}


def test_loss_aggregations_weight_terms_as_defined():
    samples = [sample(terms(1, call=0)), sample(terms(3, call=1))]      # a 1-token and a 3-token call
    weights = lambda agg: [w for s in term_weights(samples, agg) for w in s["weights"]]  # noqa: E731
    assert weights("token-mean") == [0.25] * 4
    assert weights("seq-mean-token-sum") == [0.5] * 4
    assert weights("seq-mean-token-mean") == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0)).eval()


def batch_with_ratios(model, log_ratios, adv=1.0, call_of=None, agg="token-mean"):
    """A one-sample batch whose terms have the given log π/π_old (old logprobs set from the model's own)."""
    n = len(log_ratios)
    s = sample([Term(k, adv, 0.0, 1.0, 0, (call_of or [0] * n)[k], k) for k in range(n)])
    with torch.no_grad():
        new = term_logprobs(model, collate([s], 0)).tolist()
    s["terms"] = [t._replace(old_logprob=lp - r) for t, lp, r in zip(s["terms"], new, log_ratios)]
    return collate(term_weights([s], agg), 0)


def test_clip_higher_clips_each_side_at_its_own_bound(model):
    algo = Algorithm(clip_low=0.2, clip_high=0.28)
    up = batch_with_ratios(model, [math.log(1.5)], adv=1.0)         # ratio 1.5, positive advantage
    loss, info = policy_loss(model, up, algo)
    assert float(loss.detach()) == pytest.approx(-1.28, abs=1e-5) and info["clipped"] == 1
    down = batch_with_ratios(model, [math.log(0.5)], adv=-1.0)      # ratio 0.5, negative advantage
    loss, _ = policy_loss(model, down, algo)
    assert float(loss.detach()) == pytest.approx(0.8, abs=1e-5)
    inside = batch_with_ratios(model, [math.log(1.25)], adv=1.0)    # inside [0.8, 1.28]: not clipped
    assert float(policy_loss(model, inside, algo)[0].detach()) == pytest.approx(-1.25, abs=1e-5)


def test_gspo_uses_one_length_normalized_ratio_per_call_and_its_gradient(model):
    ratios = [0.1, 0.3, -0.2]                   # call 0: two tokens (mean 0.2), call 1: one token
    batch = batch_with_ratios(model, ratios, call_of=[0, 0, 1], agg="seq-mean-token-mean")
    algo = Algorithm("gspo", clip_low=0.99, clip_high=10.0, loss_agg="seq-mean-token-mean")
    model.zero_grad()
    loss, _ = policy_loss(model, batch, algo)
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    assert float(loss.detach()) == pytest.approx(-(math.exp(0.2) + math.exp(-0.2)) / 2, abs=1e-5)
    model.zero_grad()                           # the definition: -mean_i s_i A_i, s_i = exp(mean log ratio)
    new = term_logprobs(model, batch)
    lr = new - batch["old_logprobs"]
    (-(torch.exp(lr[:2].mean()) + torch.exp(lr[2:].mean())) / 2).backward()
    want = [p.grad.clone() for p in model.parameters()]
    assert max((a - b).abs().max().item() for a, b in zip(got, want)) < 1e-5


def test_truncated_importance_sampling_weights_by_recompute_over_engine_capped(model):
    batch = batch_with_ratios(model, [math.log(1.0)] * 2, adv=1.0)
    batch["prox"] = batch["old_logprobs"] + torch.tensor([math.log(3.0), math.log(0.5)])  # recompute vs engine
    loss, info = policy_loss(model, batch, Algorithm(tis_cap=2.0))
    new = term_logprobs(model, batch)
    ratio = torch.exp(new - batch["prox"])          # against the recompute now: 1/3 and 2
    clipped = torch.minimum(ratio, torch.clamp(ratio, 0.8, 1.2))
    want = -(clipped * torch.tensor([2.0, 0.5])).mean()      # IS weights min(3, 2) = 2 and 0.5
    assert float(loss.detach()) == pytest.approx(float(want), abs=1e-5)
    assert info["tis_weight"] == pytest.approx(2.5) and info["mismatch"] == pytest.approx(math.log(3) + math.log(2))


def test_the_mismatch_counts_only_tokens_sampled_at_the_weights_being_trained(model):
    """A token one version stale differs from the recompute by the last step as well: CI saw
    0.10 right after the first step, which is not the engine's error.  keep_fresh stamps the
    version a sample is trained at; the mismatch is measured on that version's tokens."""
    from actorjet.rl.step import keep_fresh
    s = sample([Term(k, 1.0, -1.0, 1.0, version) for k, version in enumerate([3, 2, 3])])
    fresh = keep_fresh([s], version=3, max_staleness=1)
    assert fresh.samples[0]["trained_at"] == 3
    batch = collate(term_weights(fresh.samples, "token-mean"), 0)
    batch["prox"] = batch["old_logprobs"] + torch.tensor([0.1, 0.5, -0.2])
    _, info = policy_loss(model, batch, Algorithm(tis_cap=2.0))
    assert batch["term_current"].tolist() == [True, False, True]
    assert info["mismatch"] == pytest.approx(0.3) and info["mismatch_n"] == 2     # the stale 0.5 is not in it


def test_reinforce_pp_shapes_rewards_with_the_kl_to_go_and_normalizes_over_the_batch():
    s = sample(terms(3, call=0, rewards=[0.0, 0.0, 1.0]))
    ref = [[t.old_logprob - d for t, d in zip(s["terms"], [0.1, 0.2, 0.3])]]   # k1 = 0.1, 0.2, 0.3
    algo = Algorithm("reinforce_pp", kl=0.5, kl_in="reward", kl_estimator="k1")
    out = assign([s], algo, {"ref": ref})
    raw = [1 - 0.5 * 0.6, 1 - 0.5 * 0.5, 1 - 0.5 * 0.3]          # return to go of r_t - β·kl_t
    mu = sum(raw) / 3
    sd = (sum((x - mu) ** 2 for x in raw) / 3) ** 0.5
    assert [t.advantage for t in out[0]["terms"]] == pytest.approx([(x - mu) / (sd + 1e-8) for x in raw])


def test_ppo_gae_over_turns_in_order_with_rewards_where_earned():
    """Two turns of one episode, packed in two samples and out of order: GAE follows (turn, k)."""
    first = sample(terms(2, call=0, turn=0, rewards=[0.0, 0.5]))         # turn 0 earns 0.5 at its end
    second = sample(terms(1, call=1, turn=1, rewards=[1.0]))             # the final reward
    values = {"values": [[0.4], [0.2, 0.3]]}
    algo = Algorithm("ppo", gamma=1.0, lam=0.5)
    out = assign([second, first], algo, values)
    v, r = [0.2, 0.3, 0.4], [0.0, 0.5, 1.0]
    delta = [r[0] + v[1] - v[0], r[1] + v[2] - v[1], r[2] - v[2]]
    a2 = delta[2]
    a1 = delta[1] + 0.5 * a2
    a0 = delta[0] + 0.5 * a1
    assert out[1]["returns"] + out[0]["returns"] == pytest.approx([a0 + v[0], a1 + v[1], a2 + v[2]])
    adv = [a0, a1, a2]
    mu = sum(adv) / 3
    sd = (sum((x - mu) ** 2 for x in adv) / 3) ** 0.5
    got = [t.advantage for t in out[1]["terms"]] + [t.advantage for t in out[0]["terms"]]
    assert got == pytest.approx([(x - mu) / (sd + 1e-8) for x in adv])


def test_kl_in_the_reward_for_a_group_estimator_subtracts_the_kl_to_go():
    s = sample(terms(2, call=0, adv=0.7))
    ref = [[t.old_logprob - 0.2 for t in s["terms"]]]
    out = assign([s], Algorithm("grpo", kl=1.0, kl_in="reward", kl_estimator="k1"), {"ref": ref})
    assert [t.advantage for t in out[0]["terms"]] == pytest.approx([0.7 - 0.4, 0.7 - 0.2])


def test_per_turn_rewards_are_checked_folded_and_placed_on_their_turns():
    assert bad_reward({"turns": [0.1, 0.2], "final": 1.0}) == ""
    assert bad_reward({"solver": {"turns": [0.5]}}) == ""
    assert "turns[1] must be a finite number" in bad_reward({"turns": [0.1, float("nan")]})
    assert "'final' must be a finite number" in bad_reward({"turns": [], "final": "x"})
    assert "'turns' must be a list" in bad_reward({"turns": 3})
    assert total({"turns": [0.1, 0.2], "final": 1.0}) == pytest.approx(1.3)
    calls = [dict(c, role="default", model="policy", temperature=1.0, weight_version=0) for c in
             ({"prompt_ids": [5], "completion_ids": [6, 7], "logprobs": [-1, -1]},
              {"prompt_ids": [5, 6, 7, 8], "completion_ids": [9], "logprobs": [-1]})]
    group = {"group_id": "g", "task_name": "t", "behavior": "b", "version": 1,
             "rewards": {"e0": {"turns": [0.25, 0.5], "final": 1.0}, "e1": 0.0},
             "calls": {"e0": calls, "e1": [dict(c) for c in calls]}}
    credited, stats = credit("policy", [group], Algorithm("ppo"))
    assert stats["rewards"] == [1.75, 0.0]
    assert [c.reward for _, c in credited] == [0.25, 1.5, 0.0, 0.0]      # e0: 0.25, 0.5 + final; e1: 0 at its end
    assert [(c.traj, c.turn) for _, c in credited] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    packed = pack(credited, "prefix")
    assert sorted(t.reward for p in packed for t in p.terms) == [0.0] * 4 + [0.25, 1.5]
    group["rewards"]["e0"] = {"turns": [0.1, 0.2, 0.3]}
    with pytest.raises(ValueError, match="3 per-turn rewards for 2 turns"):
        credit("policy", [group], Algorithm("ppo"))


def test_a_per_turn_list_longer_than_the_episode_is_quarantined_with_its_cause(tmp_path):
    store = EpisodeStore(tmp_path / "s.sqlite")
    finish(store, "good", [0.0, 1.0])
    finish(store, "long", [{"turns": [0.1, 0.2]}, 0.0])        # one call per episode, two turns rewarded
    out = next_batch(store, BatchConfig("policy", 2, algo=Algorithm("ppo")))
    assert out["samples"] is None and [g for g, _ in out["quarantined"]] == ["long"]
    assert "2 per-turn rewards for 1 turns" in out["quarantined"][0][1]


def test_dynamic_sampling_skips_groups_without_signal_and_refills_from_the_store(tmp_path):
    store = EpisodeStore(tmp_path / "s.sqlite")
    finish(store, "flat0", [1.0, 1.0])
    finish(store, "varied0", [0.0, 1.0])
    cfg = BatchConfig("policy", 2, algo=Algorithm(dynamic_sampling=True))
    assert next_batch(store, cfg) is None                       # one group with signal: wait
    assert store.counts()["pending"] == 2                       # and nothing was kept taken
    assert next_batch(store, cfg) is None                       # nothing new: not even scanned
    finish(store, "flat1", [0.0, 0.0])
    finish(store, "varied1", [1.0, 0.0])
    out = next_batch(store, cfg)
    assert sorted(out["group_ids"]) == ["flat0", "flat1", "varied0", "varied1"]     # consumed, all of them
    assert out["stats"]["filtered_groups"] == 2 and out["stats"]["zero_variance_groups"] == 0
    assert out["stats"]["episodes"] == 4                        # only the two trained groups' episodes
    plain = EpisodeStore(tmp_path / "p.sqlite")
    finish(plain, "flat", [1.0, 1.0])
    finish(plain, "varied", [0.0, 1.0])
    assert next_batch(plain, BatchConfig("policy", 2))["stats"]["zero_variance_groups"] == 1


@pytest.mark.parametrize("kind", ["trunk", "separate"])
def test_the_critic_is_trained_by_the_step_and_resumes_from_its_checkpoint(tmp_path, kind):
    cfg = {**normalize({"models": [{"algorithm": "ppo", "critic_lr": 1e-2, "critic": kind}]})["models"][0],
           "path": zoo.tiny_arith(0)}
    algo = from_config(cfg)
    model = AutoModelForCausalLM.from_pretrained(cfg["path"])
    critic = critic_mod.build(model, cfg, algo)
    store = EpisodeStore(tmp_path / "s.sqlite")
    for g in range(2):
        store.add([record(store, f"g{g}.{k}", prompt=(5, 6, 7 + k)) for k in range(2)])    # told apart
        store.put_results({"group_id": f"g{g}", "size": 2, "task_name": "t", "behavior": "t", "version": 1},
                          [{"episode_id": f"g{g}.{k}", "member": str(k), "reward": float(k)} for k in range(2)])
    batch = next_batch(store, BatchConfig("policy", 2, algo=algo))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = [grpo_step(model, opt, batch["samples"], algo, 0, critic=critic) for _ in range(10)]
    losses = [s["value_loss"] for s in steps]
    assert losses[-1] < 0.75 * losses[0]                        # the value loss falls (0.24 → 0.12 measured)
    assert steps[0]["value_explained"] == 0.0 < steps[-1]["value_explained"]     # V = 0 explains nothing
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name, obj in critic_mod.checkpoint_files(critic).items():
        torch.save(obj, folder / name)
    again = critic_mod.build(model, cfg, algo, folder)
    assert torch.equal(again.head.weight, critic.head.weight) and again.optimizer.state_dict()["state"]
    if kind == "separate":       # its own trunk, trained by the value loss, saved and restored with it
        mine = dict(critic.trunk.named_parameters())
        assert all(p is not mine[n] for n, p in model.model.named_parameters())
        assert any(not torch.equal(p, q) for p, q in zip(critic.trunk.parameters(), model.model.parameters()))
        assert all(torch.equal(p, q) for p, q in zip(again.trunk.parameters(), critic.trunk.parameters()))
    assert critic_mod.build(model, {**cfg, "algorithm": "grpo"}, from_config({**cfg, "algorithm": "grpo"})) is None


@pytest.mark.parametrize("fields, error", [
    ({"algorithm": "ppo2"}, "algorithm must be one of grpo, dr_grpo, rloo, reinforce_pp, gspo, ppo"),
    ({"clip_low": 0.3, "clip_high": 0.2}, "clip_high (0.2) must be >= clip_low (0.3)"),
    ({"loss_agg": "mean"}, "loss_agg must be one of"),
    ({"kl_estimator": "k4"}, "kl_estimator must be k1, k2 or k3"),
    ({"kl_in": "both"}, "kl_in must be loss or reward"),
    ({"tis_cap": -1.0}, "tis_cap must be >= 0"),
    ({"lam": 1.5}, "lam must be from 0 to 1"),
    ({"critic": "big"}, "critic must be trunk"),
    ({"dynamic_sampling": 1}, "field 'dynamic_sampling' must be bool"),
    ({"algorithm": "ppo", "learner": {"ranks": 2}}, "one learner rank only"),
])
def test_bad_algorithm_settings_get_one_line_errors(fields, error):
    with pytest.raises(UserError, match=None) as caught:
        normalize({"models": [fields]})
    assert error in str(caught.value) and "\n" not in str(caught.value)


def test_defaults_come_from_each_paper_unless_set():
    gspo = from_config(normalize({"models": [{"algorithm": "gspo"}]})["models"][0])
    assert (gspo.clip_low, gspo.clip_high, gspo.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    dr = from_config(normalize({"models": [{"algorithm": "dr_grpo", "clip_high": 0.28}]})["models"][0])
    assert (dr.loss_agg, dr.clip_low, dr.clip_high) == ("seq-mean-token-sum", 0.2, 0.28)
    assert from_config(normalize({"models": [{"algorithm": "ppo"}]})["models"][0]).lam == 0.95
    assert Credit(0.5).call == -1          # a plain float advantage still packs (tests, benches)


def test_the_shipped_algorithm_study_offers_every_algorithm_and_each_trial_job_is_valid():
    from actorjet.research.study_spec import apply, load_study
    from actorjet.rl.algorithms import ALGORITHMS

    study = load_study(REPO / "agents" / "studies" / "algorithms.toml")
    knob = study["knobs"]["models.policy.algorithm"]
    assert knob["kind"] == "choice" and sorted(knob["values"]) == sorted(ALGORITHMS)
    for name in ALGORITHMS:
        job = normalize(apply(study["base_job"], {"models.policy.algorithm": name}))
        assert job["models"][0]["algorithm"] == name and job["models"][0]["lora"]
