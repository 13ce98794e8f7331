"""The job schema: every field of a job config, its default, what it means, and the range a
study may explore.  One source of truth: config.py fills defaults and checks types from it,
and ``actorjet research knobs`` / ``research ask`` show it as the catalogue of knobs, so a
field added here is documented and studiable at once.

``explore`` is the range a study draws from when a question names the field without a range
(``{"log_uniform": [low, high]}``, ``uniform``, ``int_uniform`` or ``{"choice": [...]}``);
None means the field is not a learning knob (names, ports, placement, limits), and a study
refuses it unless its spec gives a range itself.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from actorjet.rl.algorithms import ALGORITHMS, CRITICS, KL_ESTIMATORS, LOSS_AGGS


@dataclass(frozen=True)
class Field:
    default: object
    meaning: str
    explore: dict | None = None


MODEL = {
    "name": Field("policy", "the model's name: its subtree, episodes-NAME.sqlite, weights/NAME/"),
    "source": Field("tiny-arith", "tiny-arith | tiny-long | smollm2-135m | a local Hugging Face directory"),
    "engine": Field("transformers", "transformers (embedded, CPU or GPU) | vllm (GPU, extra `vllm`)"),
    "device": Field("auto", "auto | cpu | cuda: where its engine and learner run (auto: CUDA where the "
                    "machine that runs them has a GPU)"),
    "dtype": Field("float32", "the weights' dtype: float32 | bfloat16 | float16"),
    "trainable": Field(True, "false: served, never trained (a frozen opponent or judge)"),
    "lr": Field(1e-4, "the learner's AdamW learning rate", {"log_uniform": [1e-6, 1e-2]}),
    "clip": Field(0.2, "PPO-clip epsilon on the token ratio (clip_low/clip_high default to it)",
                  {"uniform": [0.05, 0.4]}),
    "kl": Field(0.0, "weight of the KL penalty to the reference weights (0: none)", {"uniform": [0.0, 0.2]}),
    "grad_clip": Field(1.0, "the gradient's global norm is clipped to this", {"log_uniform": [0.1, 10.0]}),
    "max_batch": Field(256, "sequences the engine decodes at once"),
    "gateway_port": Field(0, "the gateway's port (0: a free one)"),
    "checkpoint_every": Field(50, "learner steps between checkpoints (what a restart resumes from)",
                              {"choice": [10, 50, 1000]}),
    "eval_every": Field(10, "learner steps between held-out evaluations"),
    "eval_at_start": Field(True, "score the weights a learner starts from (step 0, or the checkpoint it resumes) "
                           "while its first steps train; false: the first evaluation is at step eval_every"),
    "checkpoint_keep_last": Field(3, "checkpoints kept: the newest N (at least the newest, to resume from)"),
    "checkpoint_keep_best": Field(1, "... and the N best by held-out accuracy"),
    "eval_max_tokens": Field(8, "tokens an evaluation answer may take"),
    "default_max_tokens": Field(256, "max_tokens of a call that does not say"),
    "eval_limit": Field(0, "held-out tasks an evaluation scores: the first N of the split (0: all of them)"),
    "eval_split": Field("validation", "the held-out split the learner reports (task sources' eval_tasks(split))"),
    "merge": Field("auto", "context tracker: none | prefix | tree | auto (the best the model supports)",
                   {"choice": ["none", "prefix", "tree"]}),
    "attention": Field("model", "model (its own kernel) | exact (packing changes no bit; slower)"),
    "merge_match": Field("ids", "ids | text (for engines that re-tokenize; rl/align.py)"),
    "merge_ignore_tools": Field(False, "merge turns whose tool lists differ (an approximation; rl/align.py)"),
    "threads": Field(0, "torch threads per engine/learner process; 0 = auto"),
    "groups_per_step": Field(0, "this model's batch size in groups; 0 = [train] groups_per_step"),
    "lora": Field({}, "{} = full fine-tuning; { r = 16, alpha = 32, target_modules = \"all-linear\" }"),
    "base": Field("", "another model's name: be a LoRA adapter on that model's engine"),
    "prefix_cache_mb": Field(-1.0, "transformers engine: MB of KV caches kept between a conversation's calls "
                             "(-1: from the device: 1024 on the CPU, on a GPU the engine's share less its weights; "
                             "0: none)"),
    "activation_checkpointing": Field(False, "the learner recomputes each layer's activations in the backward "
                                      "pass instead of keeping them (long samples: 32k tokens)"),
    "gpu_memory_utilization": Field(0.92, "the fraction of a GPU this model's processes on it may use (vLLM's)"),
    "learner_gpu_memory": Field(0.4, "the learner's part of that fraction when it shares the engine's GPU"),
    "tool_parser": Field("", "hermes | llama3_json | mistral | pythonic ('': read from the chat template)"),
    "engines": Field(1, "engine replicas; the gateway spreads calls over them"),
    "engine_placement": Field([], "one placement table per replica ({ node = N } / { gpus = 1 })"),
    "tensor_parallel_size": Field(1, "engine = \"vllm\": GPUs per replica"),
    "learner": Field({}, "{ ranks = N, placement = [...] }: N learner ranks (FSDP2)"),
    # the algorithm and its knobs (rl/algorithms.py, docs/algorithms.md); 0 / "" = the paper's default
    "algorithm": Field("grpo", " | ".join(ALGORITHMS), {"choice": list(ALGORITHMS)}),
    "clip_low": Field(0.0, "lower clip bound of the ratio (0: clip, or the algorithm's)", {"uniform": [0.05, 0.2]}),
    "clip_high": Field(0.0, "upper clip bound; above clip_low is DAPO's clip-higher", {"uniform": [0.2, 0.4]}),
    "loss_agg": Field("", " | ".join(LOSS_AGGS) + " ('': the algorithm's)", {"choice": list(LOSS_AGGS)}),
    "kl_estimator": Field("k3", "k1 | k2 | k3 (Schulman's estimators)", {"choice": list(KL_ESTIMATORS)}),
    "kl_in": Field("loss", "the KL term as a loss term or in the reward", {"choice": ["loss", "reward"]}),
    "tis_cap": Field(0.0, "truncated importance sampling cap on engine/learner ratios (0: off)",
                     {"uniform": [1.0, 10.0]}),
    "dynamic_sampling": Field(False, "skip groups whose rewards are all equal and refill the batch (DAPO)",
                              {"choice": [False, True]}),
    "gamma": Field(1.0, "PPO/REINFORCE++ discount per token", {"uniform": [0.9, 1.0]}),
    "lam": Field(0.0, "PPO's GAE lambda (0: the algorithm's, 0.95 for ppo)", {"uniform": [0.8, 1.0]}),
    "critic": Field("trunk", " | ".join(CRITICS) + ": PPO's value head on the policy's trunk, or its own copy",
                    {"choice": list(CRITICS)}),
    "value_coef": Field(0.5, "PPO: weight of the value loss", {"uniform": [0.1, 1.0]}),
    "critic_lr": Field(0.0, "PPO: the critic's learning rate (0: lr)", {"log_uniform": [1e-5, 1e-2]}),
}

TASK = {
    "name": Field("arithmetic", "the task's name"),
    "source": Field("actorjet_agents.arithmetic", "module with tasks(seed) and optional eval_tasks/messages/score"),
    "behavior": Field("actorjet_agents.arithmetic:behavior", "module:function, the agent code that runs an episode"),
    "weight": Field(1.0, "its share of each batch among the job's tasks", {"log_uniform": [0.25, 4.0]}),
}

TRAIN = {
    "group_size": Field(8, "episodes per group (one task, one baseline)", {"int_uniform": [2, 32]}),
    "groups_per_step": Field(32, "groups per learner step (the batch)", {"int_uniform": [4, 64]}),
    "steps": Field(100, "learner steps in the job", {"int_uniform": [10, 300]}),
    "max_staleness": Field(1, "weight versions a sampled token may lag the learner (off-policy limit)",
                           {"int_uniform": [0, 4]}),
    "seed": Field(0, "the job's seed (tasks, sampling, initial order)"),
    "runner_concurrency": Field(32, "episodes one runner runs at once (whole groups; one group at a time if a group is larger)"),
    "lease_timeout_s": Field(120.0, "an episode with no LLM call for this long is expired (idle limit)"),
    "episode_max_s": Field(3600.0, "an episode running longer than this is expired, however busy"),
    "keep_trajectories": Field(False, "append trained calls to RUN_DIR/trajectories/MODEL.jsonl before retention"),
    "episode_retries": Field(2, "rounds of re-running failed members before a group is dropped"),
    "runner_memory_mb": Field(0.0, "a runner above this RSS restarts (0: no limit)"),
    "isolation": Field("thread", "thread | process: each task's episodes in its own process"),
    "task_memory_mb": Field(0.0, "with isolation = process: a task worker above this restarts"),
    "mix": Field("fill", "strict | fill: batches keep the task weights, or fill when one stalls"),
    "fill_after_s": Field(0.5, "fill: how long a batch waits for a stalled task's share"),
    "stall_s": Field(120.0, "an engine or learner with work waiting and no progress this long is restarted"),
    "tensorboard": Field(False, "also write TensorBoard event files into the run dir (extra `tb`)"),
}

SECTIONS = {"models": MODEL, "tasks": TASK, "train": TRAIN}


def defaults(section: dict[str, Field]) -> dict:
    """A section's defaults, as a fresh dict (config.py fills a job's fields from it)."""
    return {name: copy.deepcopy(f.default) for name, f in section.items()}
