"""Swarm overhead: one RL step through the swarm vs the same step in one process.

    python bench/overhead.py [--steps 30] [--model tiny-arith] [--agents plain,openai]

Baseline: one process, same model, batch (groups × 8), task, learning rate and seed:
          direct batched sampling with the learner's own weights, rewards, GRPO step.
Swarm:    embedded head + 2 runner processes, engine, gateway, learner; steady-state
          seconds per step, run twice with the same task and prompts:
            plain   the agent calls the gateway with http.client (bench/plain_http_agents.py)
                    — what the swarm itself adds;
            openai  the quickstart agent (agents/arithmetic.py) with the openai SDK — adds
                    the SDK's own CPU per call, which on one shared machine competes with
                    the engine and learner.
            hosts   the plain agent with its 2 runners on a joined node in another network
                    namespace (own address, veth + bridge; tests/hosts.py, needs root): the
                    same 2 cores, so the row shows the network path's cost, not extra CPU.
          CPU seconds per step of every swarm process (engine, gateway, learner,
          registry, runners) show where the time goes.
Target:   swarm step ≤ 1.5x the baseline step.  Writes bench/results/overhead[-MODEL].json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from common import cpu_seconds, parse, start_head, table, write  # noqa: E402

from actorjet.monitor import metrics  # noqa: E402
from actorjet.runtime import system  # noqa: E402

GROUP_SIZE, LR, SEED = 8, 1e-4, 0
TASKS = {"tiny-arith": "actorjet_agents.arithmetic", "smollm2-135m": "digits_task"}   # a task with signal for each
PLAIN = {"actorjet_agents.arithmetic": "plain_http_agents:arithmetic", "digits_task": "plain_http_agents:digits"}
ACTORS = ["registry", "model.policy/engine", "model.policy/gateway", "model.policy/learner",
          "runners/runner-head-0", "runners/runner-head-1"]


def actor_pids(head) -> dict[str, int]:
    from actorjet.runtime import messages as msgs

    pids = {}
    for path in ACTORS:
        address = head.lookup(path)
        reply = head.asys.ask(address, msgs.Ping(), 5) if address is not None else None
        if isinstance(reply, msgs.Pong):
            pids[path.split("/")[-1].replace("runner-head-", "runner ")] = reply.pid
    return pids


CLEAN_ENV = dict(os.environ)


@contextlib.contextmanager
def environment(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def error_lines(run_dir: Path, keep: int = 30) -> str:
    """The last error lines of the run's logs (the run directory is deleted after a failure)."""
    lines = []
    for log in sorted(run_dir.glob("logs/**/*.log")):
        lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if "Error" in line or "error" in line]
    return "\n".join(lines[-keep:]) or "(none)"


def bench_job(model: str, groups: int, steps: int, warmup: int, device: str, behavior: str) -> dict:
    source = TASKS.get(model, "digits_task")
    return {"models": [{"name": "policy", "source": model, "lr": LR, "eval_every": 10 ** 6, "device": device,
                        "checkpoint_every": 10 ** 6, "eval_max_tokens": 4}],
            "tasks": [{"name": "bench", "source": source, "behavior": behavior}],
            "train": {"group_size": GROUP_SIZE, "groups_per_step": groups, "steps": steps + warmup,
                      "seed": SEED, "runner_concurrency": 64}}


def measure(run_dir: Path, steps: int, warmup: int, find_pids) -> tuple[float, dict[str, float]]:
    """Watch metrics.jsonl: (seconds per step, CPU seconds per step of each actor process)
    over the steps after ``warmup``; ``find_pids()`` names the processes once warm.

    The file is followed (only new lines parsed): re-parsing all of it 20 times a second took
    half a core by step 80 (each step's timeline line is ~30 KB), taken from the swarm it timed."""
    follower = metrics.Follower(run_dir)
    last_progress, seen, pids, cpu0 = time.time(), -1, {}, {}
    while True:
        train = [r for r in follower.read() if r.get("kind") == "train"]
        if len(train) >= warmup and not pids:
            pids = find_pids()
            cpu0 = cpu_seconds(pids)
        if len(train) >= steps + warmup:
            cpu1 = cpu_seconds(pids)
            break
        if len(train) != seen:
            last_progress, seen = time.time(), len(train)
        if time.time() - last_progress > 120:
            raise RuntimeError(f"no learner step for 120 s; errors logged:\n{error_lines(run_dir)}")
        time.sleep(0.05)
    t = [r["time"] for r in train]
    measured = len(train) - warmup
    return (t[-1] - t[warmup - 1]) / (len(t) - warmup), {n: (cpu1.get(n, float("nan")) - cpu0.get(n, float("nan"))) / measured for n in pids}


def swarm_step_time(model: str, groups: int, steps: int, warmup: int, device: str,
                    agent: str) -> tuple[float, dict[str, float]]:
    """(seconds per step, CPU seconds per step of each actor process) in steady state."""
    source = TASKS.get(model, "digits_task")
    job = bench_job(model, groups, steps, warmup, device, PLAIN[source] if agent == "plain" else f"{source}:behavior")
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp), job, slots=2)
        try:
            return measure(Path(tmp), steps, warmup, lambda: actor_pids(head))
        finally:
            procs = system.system_processes(head.port)
            head.stop()
            psutil.wait_procs(procs, timeout=30)     # the next measurement starts on a quiet machine


def _toml(job: dict) -> str:
    """The job dict as TOML (flat tables of numbers and strings are all it holds)."""
    def value(v):
        return json.dumps(v) if isinstance(v, str) else repr(v).lower() if isinstance(v, bool) else repr(v)
    out = []
    for section in ("models", "tasks"):
        for table_ in job[section]:
            out += [f"[[{section}]]"] + [f"{k} = {value(v)}" for k, v in table_.items()]
    out += ["[train]"] + [f"{k} = {value(v)}" for k, v in job["train"].items()]
    return "\n".join(out) + "\n"


def swarm_step_time_hosts(model: str, groups: int, steps: int, warmup: int, device: str) -> tuple[float, dict]:
    """Like swarm_step_time with the plain agent, but the head and the runners' node each on
    their own host (network namespace): every LLM call and result crosses a veth pair."""
    import hosts
    from swarm import REPO, Swarm

    job = bench_job(model, groups, steps, warmup, device, PLAIN[TASKS.get(model, "digits_task")])
    with tempfile.TemporaryDirectory() as tmp_name, environment(CLEAN_ENV):
        tmp = Path(tmp_name)
        (tmp / "job.toml").write_text(_toml(job))
        sw, net = Swarm(tmp), hosts.Network()
        sw.env["PYTHONPATH"] = str(Path(__file__).resolve().parent)      # plain_http_agents
        try:
            head = net.host("head")
            _, port, token = sw.head(tmp / "run", str(REPO / "supervisors" / "default.toml"), host=head,
                                     extra=["--config", str(tmp / "job.toml")])
            sw.join(port, token, "runners", slots=2, head_host=head.ip, host=net.host("runners"))

            def find_pids():
                paths = ACTORS[:5] + ["runners/runner-runners-0", "runners/runner-runners-1"]
                pids = {p.split("/")[-1].replace("runner-runners-", "runner "): sw.ctl(head, "pid", port, p)["pid"]
                        for p in paths}
                return {k: v for k, v in pids.items() if v}
            return measure(tmp / "run", steps, warmup, find_pids)
        finally:
            sw.cleanup()
            net.close()


def baseline_step_time(model: str, groups: int, steps: int, warmup: int, device: str) -> float:
    import importlib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actorjet.rl.pack import call_sample
    from actorjet.config import normalize
    from actorjet.models.prepare import prepare
    from actorjet.serving.transformers_engine import GenRequest, TransformersEngine
    from actorjet.rl.algorithms import Algorithm, episode_advantages
    from actorjet.rl.grpo import grpo_step
    task_module = importlib.import_module(TASKS.get(model, "digits_task"))
    max_tokens = getattr(task_module, "MAX_TOKENS", 4)
    path = prepare(normalize({"models": [{"name": "policy", "source": model}]}))["models"][0]["path"]
    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path).to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    engine = TransformersEngine(model=policy, tokenizer=tok, start_thread=False, seed=SEED, device=device)
    tasks = task_module.tasks(SEED)
    times = []
    for _ in range(steps + warmup):
        t0 = time.perf_counter()
        group_tasks = [next(tasks) for _ in range(groups)]
        prompts = [tok(tok.apply_chat_template(task_module.messages(t), add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)["input_ids"] for t in group_tasks]
        policy.eval()
        outs = engine.generate([GenRequest(p, max_tokens, 1.0, n=GROUP_SIZE) for p in prompts])
        samples = []
        for task, prompt, results in zip(group_tasks, prompts, outs):
            rewards = {k: task_module.score(task, tok.decode(r.completion_ids, skip_special_tokens=True))
                       for k, r in enumerate(results)}
            if len(set(rewards.values())) < 2:
                continue
            adv = episode_advantages(Algorithm(), rewards)
            samples += [call_sample({"prompt_ids": prompt, "completion_ids": r.completion_ids,
                                     "logprobs": r.logprobs, "temperature": 1.0, "weight_version": 0}, adv[k])
                        for k, r in enumerate(results)]
        if samples:
            grpo_step(policy, opt, samples, Algorithm(), tok.pad_token_id)
        times.append(time.perf_counter() - t0)
    return sum(times[warmup:]) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--groups", type=int, default=32, help="GRPO groups of 8 per step (default 32)")
    ap.add_argument("--device", default="cpu", help="where engine and learner run: cpu or cuda")
    ap.add_argument("--agents", default="plain,openai,hosts",
                    help="comma-separated: plain (http.client), openai (SDK), hosts (plain, runners on another "
                    "host: a network namespace, needs root)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of (baseline, each swarm), interleaved; medians are reported (default 3)")
    args = parse(ap, {"steps": 3, "warmup": 1, "groups": 2, "repeats": 1, "agents": "plain,hosts"})
    agents = [a for a in args.agents.split(",") if a]
    if not agents or set(agents) - {"plain", "openai", "hosts"}:
        ap.error("--agents takes plain, openai and/or hosts")
    if "hosts" in agents:
        import hosts
        if hosts.unavailable():
            print(f"skipping the hosts row: {hosts.unavailable()}")
            agents.remove("hosts")
    if args.repeats < 1 or args.steps < 1 or args.warmup < 1:
        ap.error("--repeats, --steps and --warmup must be >= 1")
    # Interleaved rounds: a slow minute on a shared machine hits every setup alike.
    bases, runs = [], {a: [] for a in agents}
    for r in range(args.repeats):
        # The baseline runs in its own (spawned) process: had this process used CUDA, the
        # head's actors, forked from it, could not.
        # It also gets this process's environment as it was before any head changed it
        # (a head sets OMP_WAIT_POLICY=PASSIVE for its actors; that slows a lone process).
        with environment(CLEAN_ENV), multiprocessing.get_context("spawn").Pool(1) as pool:
            bases.append(pool.apply(baseline_step_time, (args.model, args.groups, args.steps, args.warmup,
                                                         args.device)))
        for a in agents:
            if a == "hosts":
                runs[a].append(swarm_step_time_hosts(args.model, args.groups, args.steps, args.warmup, args.device))
            else:
                runs[a].append(swarm_step_time(args.model, args.groups, args.steps, args.warmup, args.device, a))
        print(f"round {r + 1}/{args.repeats}: one process {bases[-1]:.3f} s/step, " +
              ", ".join(f"{a} {runs[a][-1][0]:.3f}" for a in agents), flush=True)
    base = statistics.median(bases)
    swarm = {}
    for a in agents:
        step = statistics.median(x[0] for x in runs[a])
        swarm[a] = (step, {name: statistics.median(x[1][name] for x in runs[a]) for name in runs[a][0][1]})
    rows = [("one process, direct generate", f"{base:.3f}", "")]
    for agent, (step, _) in swarm.items():
        label = {"plain": "agent on http.client", "openai": "agent on openai SDK",
                 "hosts": "http.client, runners on another host (netns)"}[agent]
        rows.append((f"swarm, {label}", f"{step:.3f}", f"{step / base:.2f}x (target <= 1.5x)"))
    table(rows, ("setup", "s/step", "vs one process"))
    print()
    names = list(next(iter(swarm.values()))[1])
    names += [n for a in agents for n in swarm[a][1] if n not in names]
    table([(name, *(f"{swarm[a][1].get(name, float('nan')) * 1000:.0f}" for a in agents)) for name in names]
          + [("total", *(f"{sum(swarm[a][1].values()) * 1000:.0f}" for a in agents))],
          ("CPU ms per step", *agents))
    # A step can go no faster than its CPU spread over every core: what 1.5x leaves to spend.
    budget = 1.5 * base * (os.cpu_count() or 1)
    print(f"\na 1.5x step on {os.cpu_count()} cores leaves {budget * 1000:.0f} CPU ms per step; the swarm used " +
          ", ".join(f"{sum(swarm[a][1].values()) * 1000:.0f} ({a})" for a in agents))
    name = "overhead" + ("" if args.model == "tiny-arith" else f"-{args.model}") + \
        ("" if args.device == "cpu" else f"-{args.device}")
    write(name, {"model": args.model, "device": args.device, "cpus": os.cpu_count(), "groups": args.groups,
                 "group_size": GROUP_SIZE, "steps": args.steps, "baseline_s_per_step": base,
                 "repeats": args.repeats, "baseline_runs": bases,
                 "swarm": {a: {"s_per_step": step, "ratio": step / base, "cpu_s_per_step": cpu,
                               "runs": [x[0] for x in runs[a]]}
                           for a, (step, cpu) in swarm.items()},
                 "target": "<= 1.5x", "cpu_s_budget_at_target": budget})


if __name__ == "__main__":
    main()
