"""GRPO on the real tiny model: the update follows the advantages, the pieces agree."""
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from actorjet.rl.pack import call_sample
from actorjet.rl.rewards import reward_for
from actorjet.models import zoo
from actorjet.serving.transformers_engine import GenRequest, TransformersEngine
from actorjet.rl.algorithms import Algorithm, episode_advantages
from actorjet.rl.grpo import collate, grpo_step, micro_batches, term_logprobs


@pytest.fixture(scope="module")
def model_dir():
    return zoo.tiny_arith(0)


def sampled_calls(model_dir, n=8):
    engine = TransformersEngine(model_dir, seed=3)
    prompt = engine.tokenizer("23+45=")["input_ids"]
    results = engine.generate([GenRequest(prompt, max_tokens=4, temperature=1.0, n=n, seed=11)])[0]
    engine.close()
    return [{"prompt_ids": prompt, "completion_ids": r.completion_ids, "logprobs": r.logprobs,
             "temperature": 1.0, "weight_version": 0} for r in results]


def seq_logprob(model, sample):
    with torch.no_grad():
        return float(term_logprobs(model, collate([sample], 0)).sum())


def test_recorded_logprobs_match_the_learner(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for call in sampled_calls(model_dir):
        with torch.no_grad():
            lp = term_logprobs(model, collate([call_sample(call, 1.0)], 0))
        assert torch.allclose(lp, torch.tensor(call["logprobs"]), atol=1e-4)


def test_a_step_moves_logprobs_in_the_direction_of_the_advantages(model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    calls = sampled_calls(model_dir)
    distinct = {tuple(c["completion_ids"]): c for c in calls}
    assert len(distinct) >= 2, "need two different completions"
    good, bad = list(distinct.values())[:2]
    samples = [call_sample(good, +1.0), call_sample(bad, -1.0)]
    before = [seq_logprob(model, s) for s in samples]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)    # a small first-order step
    info = grpo_step(model, opt, samples, Algorithm(), pad_id=0)
    after = [seq_logprob(model, s) for s in samples]
    # What the gradient optimizes to first order: the positive sample gains on the negative one.
    assert after[0] - after[1] > before[0] - before[1]
    assert info["tokens"] == sum(len(c["completion_ids"]) for c in (good, bad))


def test_micro_batching_does_not_change_the_gradient(model_dir):
    calls = sampled_calls(model_dir)
    samples = [call_sample(c, random.Random(i).uniform(-1, 1)) for i, c in enumerate(calls)]
    grads = []
    for max_tokens in (10_000, 12):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        grpo_step(model, opt, samples, Algorithm(micro_batch_tokens=max_tokens, grad_clip=1e9), pad_id=0)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert len(micro_batches(samples, 12)) > 1
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_group_advantages_and_reward_routing():
    adv = episode_advantages(Algorithm(), {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0})
    assert adv["a"] > 0 > adv["b"] and abs(sum(adv.values())) < 1e-6
    assert reward_for(0.5, "m", "x") == 0.5
    assert reward_for({"solver": 1.0, "default": 0.2}, "m", "solver") == 1.0
    assert reward_for({"m": 0.7}, "m", "critic") == 0.7
    assert reward_for({"other": 1}, "m", "x") is None


def test_kl_to_the_reference_is_zero_at_start_and_grows_after_updates(model_dir):
    calls = sampled_calls(model_dir)
    samples = [call_sample(c, (-1.0) ** k) for k, c in enumerate(calls)]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = Algorithm(kl=0.1)
    first = grpo_step(model, opt, samples, cfg, pad_id=0, ref_model=ref)
    second = grpo_step(model, opt, samples, cfg, pad_id=0, ref_model=ref)
    assert abs(first["kl"]) < 1e-6 and second["kl"] > 1e-6


def test_eval_limit_scores_the_first_n_held_out_tasks_and_a_bad_one_is_refused():
    """``eval_limit = N``: an evaluation scores the split's first N tasks (a quick look while
    iterating; bench/realmodel.py --smoke); a negative or fractional one is a one-line error."""
    from transformers import AutoTokenizer

    from actorjet.config import normalize
    from actorjet.errors import UserError
    from actorjet.models.evaluations import Evaluations
    from actorjet.models.heldout import eval_spec

    job = {"models": [{"name": "policy", "source": "tiny-arith", "eval_limit": 5}]}
    cfg = normalize(job)["models"][0]
    path = zoo.resolve("tiny-arith", 0)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    asked = []
    tasks, messages, score = eval_spec("actorjet_agents.arithmetic", "policy")

    def counted(task, text):
        asked.append(task)
        return score(task, text)
    evals = Evaluations("policy", [("arithmetic", (tasks, messages, counted))], tokenizer, cfg)
    try:
        assert evals.start(model, 0, 0, last=True)
        evals.running[0].result(timeout=120)
        [[record]] = evals.finished()
    finally:
        evals.shutdown()
    assert asked == tasks()[:5] and record["accuracy"] * 5 == round(record["accuracy"] * 5)
    for bad in (-1, 2.5, True):
        with pytest.raises(UserError, match="eval_limit"):
            normalize({"models": [{"name": "policy", "source": "tiny-arith", "eval_limit": bad}]})


def test_an_idle_learner_looks_for_batches_less_often_until_a_call_is_recorded(tmp_path):
    """An idle head's learner looked for batches 70 times a second (5% of a core) with no job.
    After QUIET_AFTER_S with neither a batch nor a write to its store it looks every
    QUIET_POLL_S; a call the gateway records (a write to the store's WAL) restores the pace."""
    import os
    import time
    from types import SimpleNamespace

    from actorjet.actors import learner

    store = tmp_path / "episodes-policy.sqlite"
    wal = tmp_path / "episodes-policy.sqlite-wal"
    store.write_bytes(b""), wal.write_bytes(b"")
    long_ago = time.time() - 2 * learner.QUIET_AFTER_S
    os.utime(store, (long_ago, long_ago)), os.utime(wal, (long_ago, long_ago))
    idle = SimpleNamespace(batch_at=time.monotonic() - 2 * learner.QUIET_AFTER_S, store=SimpleNamespace(path=store))
    assert learner.Learner._pause(idle, 0.02) == learner.QUIET_POLL_S
    assert learner.Learner._pause(SimpleNamespace(batch_at=idle.batch_at, store=None), 0.02) == learner.QUIET_POLL_S
    wal.write_bytes(b"a recorded call")
    assert learner.Learner._pause(idle, 0.02) == 0.02
    assert learner.Learner._pause(SimpleNamespace(batch_at=time.monotonic(), store=idle.store), 0.05) == 0.05
