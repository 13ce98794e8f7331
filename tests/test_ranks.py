"""Learner ranks (rl/ranks.py): 2 processes with FSDP2 over gloo take the same step as one
process on the same batch — tree-packed multi-turn samples, with SGD, with AdamW and
gradient clipping, and with a LoRA adapter (its base frozen)."""
import json
import random

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from actorjet.models import zoo
from actorjet.rl import lora
from actorjet.rl.algorithms import Algorithm
from actorjet.rl.grpo import grpo_step
from actorjet.rl.pack import pack
from actorjet.rl.ranks import shares
from swarm import free_port

pytestmark = pytest.mark.slow       # two processes that import torch and transformers: ~20 s


def samples(seed: int = 3) -> list[dict]:
    """Six episodes of 2–4 turns each, with forks, tree-packed into several sequences."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randint(4, 20) for _ in range(n)]  # noqa: E731
    calls, system = [], tok(5)
    for e in range(6):
        history = system + tok(rng.randint(2, 5))
        for turn in range(rng.randint(2, 4)):
            for fork in range(rng.choice([1, 1, 2])):
                completion = tok(rng.randint(1, 4))
                calls.append(({"model": "m", "role": "a", "episode_id": f"e{e}", "call_index": 2 * turn + fork,
                               "choice": 0, "prompt_ids": list(history), "completion_ids": completion,
                               "temperature": 1.0, "weight_version": 0,
                               "logprobs": [-rng.random() for _ in completion]}, rng.uniform(-1, 1)))
            history = history + completion + tok(rng.randint(1, 3))
    return [p.to_dict() for p in pack(calls, "tree", max_tokens=40)]


def optimizer(name: str, model):
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.SGD(trainable, lr=0.5) if name == "sgd" else torch.optim.AdamW(trainable, lr=1e-3)


def fresh_model(adapter: bool):
    """tiny-arith, or tiny-arith with a LoRA adapter (the same random init in every process)."""
    model = AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0), dtype=torch.float32)
    if adapter:
        torch.manual_seed(0)
        model = lora.attach(model, lora.check({"r": 4, "alpha": 8}, "test")).get_base_model()
    return model


def rank_main(rank: int, port: int, opt: str, cfg: dict, out: str) -> None:
    """One learner rank (a spawned process): shard, take the step, rank 0 writes the result."""
    from actorjet.rl import ranks

    torch.set_num_threads(1)
    group = ranks.join(rank, 2, "127.0.0.1", port, timeout_s=60)
    model = ranks.shard(fresh_model(opt.startswith("lora")))
    info = grpo_step(model, optimizer(opt, model), samples(), Algorithm(**cfg), 0, ranks=group)
    whole = fresh_model(opt.startswith("lora")) if rank == 0 else None     # rank 0's unsharded copy
    ranks.gather_into(model, whole)
    if rank == 0:
        torch.save(whole.state_dict(), out + ".pt")
        with open(out + ".json", "w") as f:
            json.dump(info, f)
    ranks.leave()


def test_the_split_is_balanced_by_tokens_and_the_same_on_every_rank():
    batch = samples()
    split = shares(batch, 2)
    assert sorted(len(s["input_ids"]) for part in split for s in part) == sorted(len(s["input_ids"]) for s in batch)
    loads = [sum(len(s["input_ids"]) for s in part) for part in split]
    assert all(loads) and max(loads) - min(loads) <= max(len(s["input_ids"]) for s in batch)
    assert split == shares(list(reversed(batch)), 2)


@pytest.mark.parametrize("opt, cfg", [("sgd", {"grad_clip": 1e9}), ("adamw", {"grad_clip": 0.05}),
                                      ("lora-adamw", {"grad_clip": 1e9})])
def test_two_ranks_take_the_step_one_rank_takes(tmp_path, opt, cfg):
    batch = samples()
    assert len(batch) >= 4 and len({len(part) for part in shares(batch, 2)}) >= 1
    model = fresh_model(opt.startswith("lora"))
    one = grpo_step(model, optimizer(opt, model), batch, Algorithm(**cfg), 0)
    out = str(tmp_path / "rank0")
    mp.spawn(rank_main, args=(free_port(), opt, cfg, out), nprocs=2, join=True)
    two = json.loads(open(out + ".json").read())
    sharded = torch.load(out + ".pt")
    assert two["tokens"] == one["tokens"] and two["sequence_tokens"] == one["sequence_tokens"]
    assert abs(two["loss"] - one["loss"]) <= 1e-6 and abs(two["grad_norm"] - one["grad_norm"]) <= 1e-5 * one["grad_norm"]
    if opt == "adamw":
        assert one["grad_norm"] > cfg["grad_clip"]              # the clip was active
    state = model.state_dict()
    assert set(sharded) == set(state)
    diff = max(float((sharded[k] - state[k]).abs().max()) for k in state)
    moved = max(float((state[k] - v).abs().max()) for k, v in fresh_model(opt.startswith("lora")).state_dict().items())
    print(f"{opt}: 2 ranks vs 1, max |weight diff| {diff:.1e} (the step moved weights by up to {moved:.1e}); "
          f"loss {two['loss']:.6f} vs {one['loss']:.6f}")
    assert diff <= 1e-5 < moved, (diff, moved)


def test_a_rendezvous_nobody_answers_is_a_one_line_error_naming_it():
    import time

    from actorjet.rl import ranks

    port, start = free_port(), time.monotonic()
    with pytest.raises(RuntimeError, match=rf"learner rank 1/2: no rendezvous at 127\.0\.0\.1:{port}: nothing listens") as e:
        ranks.join(1, 2, "127.0.0.1", port, timeout_s=2)        # waits its timeout for rank 0, then says so
    assert "\n" not in str(e.value) and 2 <= time.monotonic() - start < 30
