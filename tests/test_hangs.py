"""Nothing hangs silently: a thread that dies takes its actor with it (and is restarted), and
a weights file that is gone is a logged, recovered event, never a dead batcher."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from actorjet.models import zoo
from actorjet.serving.transformers_engine import GenRequest, TransformersEngine
from jobs import tiny_arith
from swarm import REPO, pid_of, wait_until


def test_a_guarded_thread_that_raises_ends_its_process_loudly(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from actorjet.runtime import guarded, logs
        logs.configure(Path({str(tmp_path)!r}))
        guarded.start(lambda: 1 / 0, "worker")
        time.sleep(30)
        print("still alive")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 70 and "still alive" not in out.stdout
    text = (tmp_path / "actors.log").read_text()
    assert "thread worker of pid" in text and "ZeroDivisionError" in text


def test_weights_that_are_gone_load_the_newest_instead(tmp_path):
    from safetensors.torch import save_file

    engine = TransformersEngine(zoo.tiny_arith(0), start_thread=False)
    state = {k: v.clone().contiguous() for k, v in engine.model.state_dict().items()}
    save_file(state, str(tmp_path / "v000002.safetensors"))
    engine.load_weights(7, str(tmp_path / "v000007.safetensors"))       # cleaned up before it was loaded
    engine._apply_weights()
    assert engine.weight_version == 2                                  # the newest that exists
    engine.load_weights(9, str(tmp_path / "nowhere" / "v000009.safetensors"))
    engine._apply_weights()
    assert engine.weight_version == 2                                  # nothing there: keep serving
    prompt = engine.tokenizer("12+30=", add_special_tokens=False)["input_ids"]
    assert engine.generate([GenRequest(prompt, 3, 0.0)])[0][0].weight_version == 2


JOB = tiny_arith(steps=12)


@pytest.mark.slow
def test_an_engine_whose_batcher_dies_is_restarted_and_training_continues(swarm, tmp_path):
    from actorjet.runtime import messages as m
    from actorjet.runtime.head import attach_root, lookup, status as head_status

    (tmp_path / "job.toml").write_text(JOB)
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    wait_until(lambda: status()["models"][0]["learner_step"] >= 3, 120, interval_s=0.5, what="3 learner steps")
    asys, root = attach_root(port)
    asys.tell(lookup(asys, root, "model.policy/engine"), m.Crash("batcher test", thread=True))
    wait_until(lambda: status()["restarts"].get("root/model.policy/engine") == 1, 30, what="the engine restarted")
    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what="12 learner steps")
    text = (run / "logs" / "head" / "actors.log").read_text()
    assert "thread engine-batcher of pid" in text and "batcher test" in text


def test_flaky_agent_hangs_without_killing_its_process():
    """agents/flaky_arithmetic.py: a hang is followed by the ordinary episode, never by the
    exit branch (which its docstring says is off by default)."""
    script = textwrap.dedent("""
        import os
        os.environ.update(AJ_FLAKY_RAISE="0", AJ_FLAKY_HANG="1", AJ_FLAKY_HANG_S="0")
        from actorjet_agents.flaky_arithmetic import behavior

        class Reached(Exception):
            pass

        class LLM:
            def __getattr__(self, name):
                raise Reached()
        try:
            behavior({"question": "1+1=", "answer": "2"}, LLM())
        except Reached:
            print("episode ran after the hang")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0 and "episode ran after the hang" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
def test_a_stalled_engine_or_gateway_is_named_in_status_and_restarted(swarm, tmp_path):
    """Alive but stuck: the engine's batcher asleep, then the gateway's server loop blocked.
    Each is named in status, logged and restarted (a new PID in `status --actors`), and
    training finishes.  Runner states in status say what the runner is doing."""
    from actorjet.registry import protocol as proto
    from actorjet.runtime import heap, system
    from actorjet.runtime import messages as m
    from actorjet.runtime.head import attach_root, lookup, status as head_status

    (tmp_path / "job.toml").write_text(tiny_arith(steps=16, train="stall_s = 4.0"))
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    pids = lambda: {a["path"]: a for a in status()["actors"]}  # noqa: E731
    wait_until(lambda: status()["models"][0]["learner_step"] >= 3, 120, interval_s=0.5, what="3 learner steps")
    data = status()
    assert data["watchdog"] == "training"
    [runner] = data["runners"]
    assert runner["behaviors"] == {"arithmetic": 1}
    assert runner["state"].startswith(("running ", "idle")), runner      # never "placed" or "starting" now
    before = pids()
    engine = before["root/model.policy/engine"]
    assert engine["node"] == "head" and engine["pid"] == pid_of(port, "model.policy/engine")
    assert f"root/runners/{runner['id']}" in before

    asys, root = attach_root(port)
    # each one's garbage collector (runtime/heap.py): what it inherited is frozen, and only the
    # gateway, which holds no tensors, collects young objects less often
    for child, young in (("engine", 700), ("gateway", heap.YOUNG_THRESHOLD)):
        reply = system.ask(asys, lookup(asys, root, f"model.policy/{child}"), m.Ping(), m.Pong, 5)
        collector = reply.info["gc"]
        assert collector["frozen"] > 50_000 and collector["young_threshold"] == young, (child, collector)
    for child, healed in (("engine", 1), ("gateway", 2)):
        asys.tell(lookup(asys, root, f"model.policy/{child}"), proto.Stall(600))     # alive, answering, stuck
        seen = wait_until(lambda: (s := status())["stalled"] and s, 20, interval_s=0.2,
                          what=f"the {child} stall named in status")
        assert f"policy/{child}" in seen["stalled"] and seen["watchdog"].startswith(f"stalled: policy/{child}")
        wait_until(lambda: (s := status())["stalls_healed"] == healed
                   and s["restarts"].get(f"root/model.policy/{child}") == 1, 40, what=f"the {child} stall healed")
        data = status()
        assert data["restarts"].get(f"root/model.policy/{child}") == 1 and data["stalls_detected"] == healed
        after = pids()[f"root/model.policy/{child}"]
        assert after["pid"] != before[f"root/model.policy/{child}"]["pid"] and after["restarts"] == 1
    # Hung for good (SIGSTOP: it cannot even run the watchdog's Crash, and sends no reports):
    # its supervisor ends it by PID and restarts it.  (The same path restarts an engine that
    # died without thespian's exit notice, seen once in the kill loop below.)
    frozen = pid_of(port, "model.policy/engine")
    os.kill(frozen, signal.SIGSTOP)
    wait_until(lambda: status()["stalls_healed"] == 3 and pid_of(port, "model.policy/engine") not in (None, frozen),
               60, what="the frozen engine replaced")
    assert status()["restarts"].get("root/model.policy/engine") == 2
    wait_until(lambda: not psutil.pid_exists(frozen) or psutil.Process(frozen).status() == psutil.STATUS_ZOMBIE,
               10, what="the frozen engine's process ended")
    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what="16 learner steps")
    assert status()["watchdog"] == "training finished at step 16"
    wait_until(lambda: status()["runners"][0]["state"] == "idle: training finished", 10, what="an idle runner")
    text = (run / "logs" / "head" / "actors.log").read_text()
    assert "watchdog: policy/engine stalled" in text and "watchdog: policy/gateway stalled" in text
    assert "engine is still there 5 s after the watchdog crashed it" in text


@pytest.mark.slow
def test_a_slow_evaluation_neither_stops_training_nor_gets_the_learner_restarted(swarm, tmp_path):
    """A held-out evaluation that takes longer than the watchdog's stall_s (SmolLM2's
    multi-turn one takes minutes): inline, it stopped training and the watchdog restarted the
    learner (and a final evaluation that waited for the earlier ones did too, once).  It runs on
    a copy beside training now: steps go on meanwhile, the lines come in step order, training
    counts as finished when the last one is in, the learner is never restarted."""
    import json

    from actorjet.runtime.head import attach_root, status as head_status

    job = tiny_arith(steps=6, eval_every=6, train="stall_s = 4.0", behavior="agents.flaky_arithmetic:behavior")
    (tmp_path / "job.toml").write_text(job.replace('source = "agents.arithmetic"', 'source = "agents.flaky_arithmetic"'))
    swarm.env.update(AJ_FLAKY_EVAL_S="6", AJ_FLAKY_RAISE="0", AJ_FLAKY_HANG="0")      # > stall_s
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    # finished = 6 steps trained and the last evaluation's line written (the learner says so)
    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what="6 learner steps, evaluated")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    trained_before_first_eval = [r["step"] for r in rows if r["kind"] == "train" and r["time"] < evals[0]["time"]]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 6, evals
    assert [e["step"] for e in evals] == sorted(e["step"] for e in evals)
    assert all(e["eval_time_s"] >= 6 for e in evals), evals
    assert len(trained_before_first_eval) >= 2, trained_before_first_eval       # training went on meanwhile
    data = status()
    assert not any(path.endswith("/learner") for path in data["restarts"]), data["restarts"]
    assert data["stalls_detected"] == 0


def test_requests_held_by_a_stuck_batcher_count_as_waiting():
    """The watchdog names an engine with work waiting and no progress.  A batcher that stalls
    while holding every request in flight leaves its queue empty: those requests must still
    count (found when the stall test failed in full suites: nothing waited, nothing was named)."""
    import threading

    engine = TransformersEngine(zoo.tiny_arith(0), window_s=0.05, start_thread=False)
    try:
        prompt = engine.tokenizer("12+30=", add_special_tokens=False)["input_ids"]
        held = [engine.submit(GenRequest(prompt, 2, 0.0)) for _ in range(3)]
        engine.stall_thread(1.0)                # lands while the batcher collects the three
        threading.Thread(target=engine._loop, daemon=True).start()
        time.sleep(0.4)
        assert engine._queue.qsize() == 0 and engine.waiting() == 3 and engine.batches == 0
        assert all(len(f.result(60)[0].completion_ids) >= 1 for f in held)
        assert engine.waiting() == 0 and engine.batches == 1
    finally:
        engine.close()


def test_a_stall_marker_is_a_pause_wherever_it_lands_in_a_batch():
    """The stall test hook may arrive while the batcher is collecting a batch: it pauses the
    thread there too (it once crashed it, which the stall test then saw as a restart)."""
    engine = TransformersEngine(zoo.tiny_arith(0), window_s=0.05)
    try:
        prompt = engine.tokenizer("12+30=", add_special_tokens=False)["input_ids"]
        first = [engine.submit(GenRequest(prompt, 2, 0.0)) for _ in range(3)]
        engine.stall_thread(0.3)
        later = [engine.submit(GenRequest(prompt, 2, 0.0)) for _ in range(3)]
        assert all(len(f.result(60)[0].completion_ids) >= 1 for f in first + later)
        assert engine.generate([GenRequest(prompt, 2, 0.0)])      # still serving
    finally:
        engine.close()


@pytest.mark.slow
def test_the_learner_and_then_the_engine_sigkilled_at_random_moments_do_not_stop_training(swarm, tmp_path):
    """The kill loop in one run (bench/kill_loop.py runs 20 per child): the moments are random
    on every run, and their seed is in the failure message."""
    import random

    from killloop import kill_run

    seed = random.randrange(1_000_000)
    out = kill_run(swarm, tmp_path / "kills", "learner+engine", random.Random(seed), steps=16)
    assert out["killed_pid"] and out["reached_final_step"], (seed, out)
    assert out["thread_deaths"] == 0, (seed, out)
    assert out["replaced"] == ["root/model.policy/engine", "root/model.policy/learner"], (seed, out)   # both restarted
    assert {"root/model.policy/learner", "root/model.policy/engine"} <= set(out["restarted"]), (seed, out)  # and counted
