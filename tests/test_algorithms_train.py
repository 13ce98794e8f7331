"""Every algorithm trains the quickstart's task in a live swarm, above the quickstart's bar —
five models in one job, each with its own algorithm, answering the same episodes
(one call and one reward per model).  GRPO, the default, is the quickstart test itself
(tests/test_training.py).

The agent is agents/arithmetic_http.py's ``every_model``, over plain HTTP: five calls an
episode, 256 episodes a step, 30 steps through the ``openai`` SDK cost ~2 ms of runner CPU a
call (alone on 2 cores: 516 CPU-s and 268 s with the SDK, 272 CPU-s and 145 s without).

It trains until every algorithm has reached the bar, up to 30 steps: each is judged by the
first held-out evaluation at or over it (evaluated every 5 steps), as bench/algorithms.py's
``steps_to_bar`` is.  A fixed 30 steps spent ~237 of the full suite's CPU-seconds on steps
after every model had passed the bar (at step 10-20 in 17 of 18 runs alone).  What
this test checks, each algorithm learning from the recorded tokens, does not depend on the
agent's client; the SDK path is the quickstart test's."""
import math

import pytest

from actorjet.monitor import metrics
from actorjet.runtime.head import attach_root, status as head_status
from actorjet.store.episode_store import EpisodeStore
from swarm import REPO, evaluated_rows, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 30                  # the most a model gets to reach the bar
EVAL_EVERY = 5
MIN_STEPS = 10              # enough steps for RLOO's logprob-mismatch check below
BAR = 0.55                  # the quickstart's bar (31.8% before)
# One model per algorithm, each with its knobs as published (rl/algorithms.py); PPO's critic
# on the trunk, RLOO with truncated importance sampling and REINFORCE++ with its KL in the
# reward, so those paths run live too.
MODELS = {"ppo": "", "rloo": "tis_cap = 2.0", "dr_grpo": "clip_high = 0.28",
          "gspo": "", "reinforce_pp": 'kl = 0.01\nkl_in = "reward"'}


def job() -> str:
    models = "".join(f'[[models]]\nname = "{name}"\nsource = "tiny-arith"\nalgorithm = "{name}"\nlr = 1e-4\n'
                     f"eval_every = {EVAL_EVERY}\ncheckpoint_every = 1000\nmax_batch = 256\n{extra}\n"
                     for name, extra in MODELS.items())
    return (models + '[[tasks]]\nname = "arithmetic"\nsource = "actorjet_agents.arithmetic_http"\n'
            'behavior = "actorjet_agents.arithmetic_http:every_model"\n'
            f"[train]\ngroup_size = 8\ngroups_per_step = 32\nsteps = {STEPS}\nrunner_concurrency = 64\n")


def tree() -> str:
    """supervisors/default.toml with its one model subtree repeated for every model."""
    text = (REPO / "supervisors" / "default.toml").read_text()
    head, _, rest = text.partition("[[children]]\nid = \"model.policy\"")
    subtree, _, runners = rest.partition("[[children]]")
    return head + "".join("[[children]]\nid = \"model.policy\"".replace("policy", name)
                          + subtree.replace('model = "policy"', f'model = "{name}"') for name in MODELS) \
        + "[[children]]" + runners


@pytest.mark.long(minutes=3)
def test_every_algorithm_trains_the_quickstart_task_above_its_bar_side_by_side(swarm, tmp_path):
    (tmp_path / "job.toml").write_text(job())
    (tmp_path / "tree.toml").write_text(tree())
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(tmp_path / "tree.toml"), slots=2, extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731

    def at_bar(data: list[dict]) -> set[str]:
        return {r["model"] for r in data if r["kind"] == "eval" and r["step"] > 0 and r["accuracy"] >= BAR}

    def settled() -> bool:
        data = status()
        if data["training_finished"]:
            return True
        return min(m["learner_step"] for m in data["models"]) >= MIN_STEPS and at_bar(metrics.read(run)) == set(MODELS)
    wait_until(settled, 900, interval_s=1, what=f"all five learners at the bar, or {STEPS} steps of each")
    if status()["training_finished"]:
        evaluated_rows(run, MODELS, STEPS)          # the last evaluation runs beside the last step

    data = metrics.read(run)
    for name in MODELS:
        train = [r for r in data if r["kind"] == "train" and r["model"] == name]
        evals = [(r["step"], r["accuracy"]) for r in data if r["kind"] == "eval" and r["model"] == name]
        assert [r["step"] for r in train] == list(range(1, len(train) + 1)) and len(train) >= MIN_STEPS, name
        # The quickstart's bar, 55% held-out, from 31.8%.  In the 18 runs of `python
        # bench/algorithms.py --fixed-start` (bench/results/algorithms-fixed-start.json), each
        # algorithm alone, 14 were over it at step 10, the other 4 (47.3-54.9% then) at step 20,
        # and all at 62.9-71.7% at step 30.  Five side by side in the suite learn less per step than
        # alone (at step 20, RLOO once stood at 53.3%), so each has up to 30 steps.
        assert evals[0] == (0, pytest.approx(0.318, abs=0.001)), (name, evals)
        assert any(step > 0 and accuracy >= BAR for step, accuracy in evals), (name, evals)
        store = EpisodeStore(run / f"episodes-{name}.sqlite").counts()
        assert store["trained"] >= len(train) * 32 and store["quarantined"] == 0, (name, store)
    ppo = [r for r in data if r["kind"] == "train" and r["model"] == "ppo"]
    # The critic trains with the policy (that its loss falls on a fixed batch: test_algorithms.py).
    # Live, its loss tracks the returns' variance, which grows as accuracy nears 50%.
    assert all(r["value_loss"] > 0 and math.isfinite(r["value_explained"]) for r in ppo), ppo
    rloo = [r for r in data if r["kind"] == "train" and r["model"] == "rloo"]
    # engine ≈ learner on the tokens sampled at the weights being trained (None: a step with none)
    mismatch = [r["logprob_mismatch"] for r in rloo if r["logprob_mismatch"] is not None]
    assert len(mismatch) >= len(rloo) // 2 and all(0 <= x < 0.05 for x in mismatch), mismatch
    assert all(r["tis_weight"] > 0.9 for r in rloo), rloo
    gspo = [r for r in data if r["kind"] == "train" and r["model"] == "gspo"]
    assert any(r["clip_frac"] > 0 for r in gspo)          # its sequence ratios meet its 3e-4/4e-4 clip range
