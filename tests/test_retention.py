"""Retention (issue 30): trained groups leave the episode store at each checkpoint, so its size
follows what is pending, not the length of the run — and nothing is lost or trained twice
when the learner or the gateway is SIGKILLed in the middle of it.  With keep_trajectories the
groups are archived first, and `actorjet export-data` writes everything as JSONL."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actorjet.cli.main import main as cli
from actorjet.rl.batching import BatchConfig, next_batch
from actorjet.store import completed
from actorjet.store.episode_store import EpisodeStore
from actorjet.store.records import CallRecord

GROUP = 4


def record_group(store, g, turns=3):
    episodes = [f"g{g}.{k}" for k in range(GROUP)]
    for e in episodes:
        prompt, msgs = [1, 2, 3], [{"role": "user", "content": "q"}]
        for t in range(turns):
            store.add([CallRecord(e, "policy", "default", t, 0, list(prompt), [4, 5], [-0.5, -0.25], 0, 1.0, msgs)])
            prompt = prompt + [4, 5, 6 + t]
            msgs = msgs + [{"role": "assistant", "content": "a"}, {"role": "user", "content": str(t)}]
    store.put_results({"group_id": f"g{g}", "size": GROUP, "task_name": "t", "behavior": "b", "version": 1},
                      [{"episode_id": e, "member": k, "reward": float(k % 2)} for k, e in enumerate(episodes)])
    completed.told(store, [g["group_id"] for g in completed.news(store)])    # the gateway told the head


def size(store):
    """Bytes on disk: the file and its WAL (freed pages must go back to the file system)."""
    path = Path(store.path)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def test_the_store_stays_bounded_and_everything_is_counted_and_exported(tmp_path):
    run = tmp_path / "run"
    store = EpisodeStore(run / "episodes-policy.sqlite")
    archive = run / "trajectories" / "policy.jsonl"
    sizes, g = {}, 0
    for step in range(1, 301):
        for _ in range(2):
            record_group(store, g)
            g += 1
        batch = next_batch(store, BatchConfig("policy", 2, merge="tree"))
        store.trained(batch["group_ids"], step)
        if step % 10 == 0:                       # a checkpoint, then retention
            store.retain(step, archive=archive)
        if step in (30, 300):
            sizes[step] = size(store)
    assert sizes[300] <= 1.2 * sizes[30], sizes          # 10x the steps, the same size
    counts = store.counts()
    assert counts == {"complete": 600, "trained": 600, "quarantined": 0, "pending": 0, "episodes_trained": 2400}
    assert sum(1 for _ in open(archive)) == 4 * 600      # every retired episode, once
    out = tmp_path / "data.jsonl"
    assert cli(["export-data", str(run), str(out)]) == 0
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 600 * GROUP * 3
    last = [r for r in rows if r["episode_id"] == "g599.3" and r["call_index"] == 2][0]
    assert last["prompt_ids"] == [1, 2, 3, 4, 5, 6, 4, 5, 7] and last["trained_step"] == 300
    assert last["messages"][-1] == {"role": "user", "content": "1"} and last["reward"] == 1.0
    assert last["reward_detail"] is None and last["tools"] is None
    from datasets import load_dataset                  # conversational data as datasets and TRL read it

    data = load_dataset("json", data_files=str(out), split="train")
    assert data.features["reward"].dtype == "float64" and data.features["prompt_ids"].feature.dtype == "int64"
    assert data.features["messages"].feature["role"].dtype == "string"      # a list of {role, content}
    assert data[0]["messages"][0]["role"] == "user" and isinstance(data[0]["reward"], float)
    assert cli(["export-data", str(run), str(tmp_path / "data.csv")]) == 2     # a clear error, not a traceback


WORKER = r"""
import json, os, random, sys, time
sys.path.insert(0, sys.argv[3])
from test_retention import record_group
from actorjet.rl.batching import BatchConfig, next_batch
from actorjet.store import completed
from actorjet.store.episode_store import EpisodeStore
role, run = sys.argv[1], sys.argv[2]
store = EpisodeStore(os.path.join(run, "episodes-policy.sqlite"))
open(os.path.join(run, f"ready-{os.getpid()}"), "w").close()      # imports done: the kills may start
if role == "gateway":
    g = int(open(os.path.join(run, "next_group")).read()) if os.path.exists(os.path.join(run, "next_group")) else 0
    while True:
        record_group(store, g)
        g += 1
        with open(os.path.join(run, "next_group.tmp"), "w") as f:     # whole or not at all: a kill
            f.write(str(g))                                            # between truncate and write left
        os.replace(os.path.join(run, "next_group.tmp"), os.path.join(run, "next_group"))   # '' once
else:
    ckpt = os.path.join(run, "checkpoint")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    store.rewind(step)                          # the restarted learner: back to its checkpoint
    log = open(os.path.join(run, "trained.jsonl"), "a")
    while True:
        batch = next_batch(store, BatchConfig("policy", 2, merge="tree"))
        if batch is None:
            time.sleep(0.01)
            continue
        step += 1
        store.trained(batch["group_ids"], step)
        log.write(json.dumps({"step": step, "groups": batch["group_ids"], "pid": os.getpid()}) + "\n")
        log.flush()
        if step % 3 == 0:
            with open(ckpt + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(ckpt + ".tmp", ckpt)
            store.retain(step, archive=os.path.join(run, "trajectories", "policy.jsonl"))
"""


@pytest.mark.slow
def test_sigkill_of_the_learner_and_the_gateway_during_retention_loses_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    here = os.path.dirname(__file__)
    procs = {}

    def start(role):
        """Start one and wait until it has imported (a busy machine takes seconds): the kill
        must land while it works, or nothing is ever trained."""
        procs[role] = subprocess.Popen([sys.executable, str(script), role, str(run), here])
        deadline = time.time() + 60
        while not (run / f"ready-{procs[role].pid}").exists() and procs[role].poll() is None and time.time() < deadline:
            time.sleep(0.05)

    rng = random.Random(0)
    died = []                                  # workers that ended by themselves: a crash (they loop forever)
    try:
        start("gateway")
        start("learner")
        for _ in range(12):                    # kill one of them at a random moment, restart it
            time.sleep(rng.uniform(0.3, 1.2))
            role = rng.choice(["gateway", "learner"])
            if procs[role].poll() is not None:
                died.append((role, procs[role].returncode))
            procs[role].send_signal(signal.SIGKILL)
            procs[role].wait()
            start(role)
        time.sleep(1.0)
        died += [(role, p.returncode) for role, p in procs.items() if p.poll() is not None]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert not died, f"workers crashed by themselves (see their tracebacks above): {died}"
    # the history the surviving weights saw: per step, what the last learner that reached it
    # trained (a restarted learner rewinds to its checkpoint and trains the steps after it again)
    history: dict[int, list] = {}
    for line in open(run / "trained.jsonl"):
        if line.strip():
            entry = json.loads(line)
            history[entry["step"]] = entry["groups"]
    checkpoint = int((run / "checkpoint").read_text())
    kept = [g for s, groups in history.items() if s <= checkpoint for g in groups]
    assert len(kept) == len(set(kept)), "a group trained twice in the surviving weights"
    store = EpisodeStore(run / "episodes-policy.sqlite")
    store.rewind(checkpoint)
    counts = store.counts()
    assert counts["complete"] == counts["trained"] + counts["pending"] + counts["quarantined"]
    assert counts["trained"] == len(kept) >= 6
    archived = [json.loads(line)["group_id"] for line in open(run / "trajectories" / "policy.jsonl") if line.strip()]
    assert set(archived) <= set(kept)                    # only what the surviving weights trained


def test_a_torn_archive_line_from_a_killed_retention_is_cut_before_the_next_append(tmp_path):
    """SIGKILL while retention appends leaves half a line; its groups were not deleted (the
    delete commits after the write) and are archived again, so the fragment must go: CI once
    read '{"episode_id": "g1776.3", ...' glued to the next line."""
    from actorjet.store.upkeep import append_lines

    path = tmp_path / "trajectories" / "policy.jsonl"
    append_lines(path, '{"a": 1}\n')
    with open(path, "a") as f:
        f.write('{"b": 2, "torn')                    # killed mid-write
    append_lines(path, '{"b": 2}\n{"c": 3}\n')
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}, {"b": 2}, {"c": 3}]
    path.write_text('{"only": "torn')                 # a first line torn: nothing before it
    append_lines(path, '{"d": 4}\n')
    assert path.read_text() == '{"d": 4}\n'
