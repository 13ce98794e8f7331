"""Heterogeneous multi-model RL: two different trainable models (different tokenizers) as
the brains of one team, each trained only on its own calls with its own reward.  The head and
the runners' node each run on their own host (a network namespace)."""
import json

import pytest

from actorjet.rl.calls import prompt_ids
from actorjet.store.episode_store import EpisodeStore
from swarm import REPO, evaluated_rows, recorded_calls, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def start(swarm, network, run, tree, job):
    """Head on one host, two runner slots on another; returns status()."""
    head, worker = network.host("head"), network.host("worker")
    _, port, token = swarm.head(run, str(tree), host=head, extra=["--config", str(job)])
    swarm.join(port, token, "worker", slots=2, head_host=head.ip, host=worker)
    return lambda: swarm.ctl(head, "status", port)

STEPS = 30
TINY_VOCAB = 21          # tiny-arith's character tokenizer


@pytest.mark.long(minutes=3)
def test_two_models_train_on_their_own_calls_and_both_learn(swarm, network, tmp_path):
    job = (REPO / "agents" / "team.toml").read_text().replace("steps = 60", f"steps = {STEPS}").replace(
        "[train]", "[train]\nkeep_trajectories = true")          # retention archives what it deletes
    (tmp_path / "team.toml").write_text(job)
    run = tmp_path / "run"
    status = start(swarm, network, run, REPO / "supervisors" / "two_models.toml", tmp_path / "team.toml")
    wait_until(lambda: [m["learner_step"] for m in status()["models"]] == [STEPS, STEPS], 600, interval_s=1,
               what=f"{STEPS} steps of both learners")

    seen = {}
    for model in ("proposer", "verifier"):          # one episode store per model, with its own calls
        assert EpisodeStore(run / f"episodes-{model}.sqlite").counts()["trained"] >= STEPS
        for call in recorded_calls(run, model):
            assert call["model"] == model and call["role"] == model      # only its own calls
            seen.setdefault(model, set()).update(prompt_ids(call) + call["completion_ids"])
    assert max(seen["proposer"]) < TINY_VOCAB < max(seen["verifier"])        # two different tokenizers

    rows = evaluated_rows(run, ("proposer", "verifier"), STEPS)
    for model in ("proposer", "verifier"):
        rewards = [r["reward_mean"] for r in rows if r["kind"] == "train" and r["model"] == model]
        assert len(rewards) == STEPS
        print(f"{model}: reward {sum(rewards[:10]) / 10:.3f} → {sum(rewards[-10:]) / 10:.3f}")
    # Each learns from its own reward.  The proposer shows it in held-out greedy accuracy, far
    # less noisy than 10 steps of sampled reward; the verifier's greedy answer barely moves
    # while its sampling sharpens, so its sampled reward is the measure.  At 30 steps
    # (`python bench/spread.py team`, bench/results/spread_team*.json): the proposer gained
    # +29.3 … +33.2 points over 5 runs on a quiet machine and +25.4 … +32.8 over 2 beside a busy
    # process; the verifier's last 10 steps beat its first 10 by +0.029 … +0.070 in sampled
    # reward.  The bars below: +10 points, and > 0.
    evals = [r["accuracy"] for r in rows if r["kind"] == "eval" and r["model"] == "proposer"]
    assert evals[-1] > evals[0] + 0.1, evals
    verifier = [r["reward_mean"] for r in rows if r["kind"] == "train" and r["model"] == "verifier"]
    assert sum(verifier[-10:]) > sum(verifier[:10]), verifier


def test_a_frozen_model_is_served_not_trained_and_batch_sizes_are_per_model(swarm, network, tmp_path):
    job = (REPO / "agents" / "team.toml").read_text()
    job = job.replace('name = "verifier"', 'name = "verifier"\ntrainable = false')
    job = job.replace('name = "proposer"', 'name = "proposer"\ngroups_per_step = 4')
    (tmp_path / "team.toml").write_text(job)
    tree = (REPO / "supervisors" / "two_models.toml").read_text()
    head, _, rest = tree.partition('id = "model.verifier"')
    verifier, _, runners = rest.partition("[[children]]")
    verifier = verifier.replace('  [[children.children]]\n  id = "learner"\n  kind = "learner"\n', "")
    (tmp_path / "tree.toml").write_text(head + 'id = "model.verifier"' + verifier + "[[children]]" + runners)
    run = tmp_path / "run"
    status = start(swarm, network, run, tmp_path / "tree.toml", tmp_path / "team.toml")
    wait_until(lambda: status()["models"] and status()["models"][0]["learner_step"] >= 8, 300, interval_s=1,
               what="8 steps of the proposer")
    data = status()
    assert [m["name"] for m in data["models"]] == ["proposer"]          # one learner
    assert "gateway" in data["services"]["verifier"]                     # the judge is served
    assert sorted(p.name for p in run.glob("episodes-*.sqlite")) == ["episodes-proposer.sqlite"]   # a frozen
    # judge keeps no store: nothing trains on its calls
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert train and all(r["model"] == "proposer" and r["groups"] == 4 for r in train)


SHARED_STEPS = 20


def test_two_adapters_of_one_base_share_one_engine_and_learn_their_own_rewards(swarm, network, tmp_path):
    """agents/shared_base.toml: adder and rounder are two LoRA adapters of tiny-arith, served by
    one engine (adder's); each learner trains on its own calls and reward."""
    job = (REPO / "agents" / "shared_base.toml").read_text().replace("steps = 60", f"steps = {SHARED_STEPS}").replace(
        "[train]", "[train]\nkeep_trajectories = true")
    (tmp_path / "shared.toml").write_text(job)
    run = tmp_path / "run"
    status = start(swarm, network, run, REPO / "supervisors" / "shared_base.toml", tmp_path / "shared.toml")
    wait_until(lambda: [m["learner_step"] for m in status()["models"]] == [SHARED_STEPS] * 2, 600, interval_s=1,
               what=f"{SHARED_STEPS} steps of both learners")
    engines = [a["path"] for a in status()["actors"] if a["path"].endswith("/engine")]
    assert engines == ["root/model.adder/engine"]                  # one engine holds the base
    for model in ("adder", "rounder"):
        versions = set()
        for call in recorded_calls(run, model):
            assert call["model"] == model and call["role"] == model      # only its own calls
            versions.add(call["weight_version"])
        assert max(versions) >= SHARED_STEPS // 2, (model, sorted(versions))   # served by its own learner's versions
    rows = evaluated_rows(run, ("adder", "rounder"), SHARED_STEPS)
    for model in ("adder", "rounder"):
        train = [r for r in rows if r["kind"] == "train" and r["model"] == model]
        # every version is the adapter: 0.76 MB, against 4.2 MB for the whole of tiny-arith
        assert len(train) == SHARED_STEPS and all(r["publish_bytes"] < 1_000_000 for r in train)
        evals = [r["accuracy"] for r in rows if r["kind"] == "eval" and r["model"] == model]
        print(f"{model}: held-out {evals}")
    # Each is served by its own adapter: the engine's logprobs are its learner's (mean |ratio-1|
    # per token 0.00–0.17 a step).  Served with the other's adapter, the rounder's ran 0.15–3.9
    # (mean 0.8) while its held-out score still rose to 0.26: the score alone cannot tell.
    train = {m: [r for r in rows if r["kind"] == "train" and r["model"] == m] for m in ("adder", "rounder")}
    for model, steps in train.items():
        ratio_dev = [r["ratio_dev"] for r in steps if "ratio_dev" in r]
        assert sum(ratio_dev) / len(ratio_dev) < 0.15, (model, ratio_dev)
    # Each learns its own answer.  Margins from `python bench/spread.py shared_base` (20 steps,
    # 8 runs on a quiet machine and 4 beside a busy process, bench/results/spread_shared_base*.json):
    # the rounder, whose reward the base rarely earns (4.9%), gained +20.7 … +56.8 held-out points
    # at step 20; the adder −2.0 … +22.5.  One CI run's rounder peaked at step 10 (+18) and fell
    # back (+2 at step 20), so the rounder is judged by its best held-out score and by its
    # training reward (128 episodes a step: first 5 steps ~0.05, last 5 ~0.45 when it learns,
    # ~0.14 when served the adder's adapter), by a margin of 0.10: a CI run that learned (held-out
    # up) gained only +0.144 on it, so it shows learning, while ratio_dev above is what tells the
    # adapters apart.  The adder keeps its answer.
    evals = {m: [r["accuracy"] for r in rows if r["kind"] == "eval" and r["model"] == m] for m in ("adder", "rounder")}
    assert max(evals["rounder"][1:]) > evals["rounder"][0] + 0.10, evals
    reward = [r["reward_mean"] for r in train["rounder"]]
    assert sum(reward[-5:]) / 5 > sum(reward[:5]) / 5 + 0.10, reward
    assert evals["adder"][-1] > evals["adder"][0] - 0.10, evals

