"""Heterogeneous multi-model RL: two different trainable models (different tokenizers) as
the brains of one team, each trained only on its own calls with its own reward.  The head and
the runners' node each run on their own host (a network namespace)."""
import json

import pytest

from actorjet.monitor import metrics
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
JUDGED_AT = (20, STEPS)      # judged at the first of these steps where both models have shown it
TINY_VOCAB = 21          # tiny-arith's character tokenizer


def learned(rows: list[dict], step: int) -> tuple[bool, list[float], list[float]]:
    """Has each model learned from its own reward by ``step``?  (yes or no, the proposer's
    held-out accuracies, the verifier's sampled rewards.)  The proposer shows it in held-out
    greedy accuracy, far less noisy than 10 steps of sampled reward; the verifier's greedy
    answer barely moves while its sampling sharpens, so its sampled reward is the measure.  At
    30 steps (`python bench/spread.py team`, bench/results/spread_team*.json): the proposer
    gained +29.3 … +33.2 points over 5 runs on a quiet machine and +25.4 … +32.8 over 2 beside
    a busy process; the verifier's last 10 steps beat its first 10 by +0.029 … +0.070 in
    sampled reward.  The bars: +10 points, and > 0."""
    evals = [r["accuracy"] for r in rows if r["kind"] == "eval" and r["model"] == "proposer" and r["step"] <= step]
    verifier = [r["reward_mean"] for r in rows
                if r["kind"] == "train" and r["model"] == "verifier" and r["step"] <= step]
    return evals[-1] > evals[0] + 0.1 and sum(verifier[-10:]) > sum(verifier[:10]), evals, verifier


@pytest.mark.long(minutes=3)
def test_two_models_train_on_their_own_calls_and_both_learn(swarm, network, tmp_path):
    """Trained until both have learned, judged at step 20 and, if not yet, at STEPS (the old
    fixed length): a run that never learns still fails there."""
    job = (REPO / "agents" / "team.toml").read_text().replace("steps = 60", f"steps = {STEPS}").replace(
        "[train]", "[train]\nkeep_trajectories = true")          # retention archives what it deletes
    (tmp_path / "team.toml").write_text(job)
    run = tmp_path / "run"
    status = start(swarm, network, run, REPO / "supervisors" / "two_models.toml", tmp_path / "team.toml")
    for step in JUDGED_AT:
        wait_until(lambda: sorted(m["learner_step"] >= step for m in status()["models"]) == [True, True],
                   600, interval_s=1, what=f"{step} steps of both learners")
        rows = evaluated_rows(run, ("proposer", "verifier"), step)
        shown, evals, verifier = learned(rows, step)
        print(f"step {step}: proposer held-out {evals}, verifier's sampled reward "
              f"{sum(verifier[:10]) / 10:.3f} → {sum(verifier[-10:]) / 10:.3f}")
        if shown:
            break

    seen = {}
    for model in ("proposer", "verifier"):          # one episode store per model, with its own calls
        assert EpisodeStore(run / f"episodes-{model}.sqlite").counts()["trained"] >= step
        for call in recorded_calls(run, model):
            assert call["model"] == model and call["role"] == model      # only its own calls
            seen.setdefault(model, set()).update(prompt_ids(call) + call["completion_ids"])
    assert max(seen["proposer"]) < TINY_VOCAB < max(seen["verifier"])        # two different tokenizers

    for model in ("proposer", "verifier"):
        rewards = [r["reward_mean"] for r in rows if r["kind"] == "train" and r["model"] == model and r["step"] <= step]
        assert len(rewards) == step
        print(f"{model}: reward {sum(rewards[:10]) / 10:.3f} → {sum(rewards[-10:]) / 10:.3f} (judged at step {step})")
    assert shown, (evals, verifier)          # each learned from its own reward


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


SHARED_MIN_STEPS, SHARED_MAX_STEPS = 10, 40


def _rounder_learned(rows: list[dict]) -> bool:
    """The rounder's best held-out score is 10 points over the base's, and its last 5 steps'
    sampled reward beats its first 5 by 0.10 (128 episodes a step: ~0.05 at first, ~0.45 once
    it learns, ~0.14 when served the adder's adapter)."""
    evals = [r["accuracy"] for r in rows if r["kind"] == "eval" and r["model"] == "rounder"]
    reward = [r["reward_mean"] for r in rows if r["kind"] == "train" and r["model"] == "rounder"]
    return (len(evals) >= 2 and max(evals[1:]) > evals[0] + 0.10
            and len(reward) >= SHARED_MIN_STEPS and sum(reward[-5:]) / 5 > sum(reward[:5]) / 5 + 0.10)


@pytest.mark.long(minutes=2)      # 10 steps when it learns as usual; up to 40 when late
def test_two_adapters_of_one_base_share_one_engine_and_learn_their_own_rewards(swarm, network, tmp_path):
    """agents/shared_base.toml: adder and rounder are two LoRA adapters of tiny-arith, served by
    one engine (adder's); each learner trains on its own calls and reward.

    It trains until the rounder has learned, up to 40 steps.  Why not a fixed length: at 20
    steps (`python bench/spread.py shared_base`, 8 runs on a quiet machine and 4 beside a busy
    process, bench/results/spread_shared_base*.json) the rounder, whose reward the base rarely
    earns (4.9%), stood at 25.6–61.7% held-out, mostly ~40% by step 10 already; but in full
    suite runs it learned later: one CI run peaked at step 10 (+18 points) and fell back (+2 at
    step 20), one local run reached only +8.8.  A run that learns stops at step 10, one that
    learns late gets the time it needs, one that never learns fails at 40.  As it is now, 4
    runs beside a busy process (spread_shared_base_load1.json) each stopped at step 10, the
    rounder's last held-out score +16.0 … +28.5 points."""
    job = (REPO / "agents" / "shared_base.toml").read_text().replace("steps = 60", f"steps = {SHARED_MAX_STEPS}")
    job = job.replace("eval_every = 10", "eval_every = 5").replace("[train]", "[train]\nkeep_trajectories = true")
    (tmp_path / "shared.toml").write_text(job)
    run = tmp_path / "run"
    status = start(swarm, network, run, REPO / "supervisors" / "shared_base.toml", tmp_path / "shared.toml")

    def settled() -> bool:
        steps = [m["learner_step"] for m in status()["models"]]
        if steps == [SHARED_MAX_STEPS] * 2:
            return True
        return min(steps) >= SHARED_MIN_STEPS and _rounder_learned(metrics.read(run))
    wait_until(settled, 900, interval_s=1, what=f"the rounder learning, or {SHARED_MAX_STEPS} steps of both learners")
    engines = [a["path"] for a in status()["actors"] if a["path"].endswith("/engine")]
    assert engines == ["root/model.adder/engine"]                  # one engine holds the base
    data = metrics.read(run)
    train = {m: [r for r in data if r["kind"] == "train" and r["model"] == m] for m in ("adder", "rounder")}
    evals = {m: [r["accuracy"] for r in data if r["kind"] == "eval" and r["model"] == m] for m in ("adder", "rounder")}
    print(f"held-out {evals}")
    for model in ("adder", "rounder"):
        steps = [r["step"] for r in train[model]]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= SHARED_MIN_STEPS, (model, steps)
        versions = set()
        for call in recorded_calls(run, model):
            assert call["model"] == model and call["role"] == model      # only its own calls
            versions.add(call["weight_version"])
        assert max(versions) >= len(steps) // 2, (model, sorted(versions))   # served by its own learner's versions
        # every version is the adapter: 0.76 MB, against 4.2 MB for the whole of tiny-arith
        assert all(r["publish_bytes"] < 1_000_000 for r in train[model])
    # Each is served by its own adapter: the engine's logprobs are its learner's (mean |ratio-1|
    # per token 0.00–0.17 a step).  Served with the other's adapter, the rounder's ran 0.15–3.9
    # (mean 0.8) while its held-out score still rose to 0.26: the score alone cannot tell, so
    # ratio_dev is what tells the adapters apart, and learning is judged as _rounder_learned says.
    for model, steps in train.items():
        ratio_dev = [r["ratio_dev"] for r in steps if "ratio_dev" in r]
        assert sum(ratio_dev) / len(ratio_dev) < 0.15, (model, ratio_dev)
    assert _rounder_learned(data), (evals["rounder"], [r["reward_mean"] for r in train["rounder"]])
    assert evals["adder"][-1] > evals["adder"][0] - 0.10, evals       # the adder keeps its answer

