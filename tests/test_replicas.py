"""Engine replicas: a model with ``engines = N`` (serving/engine_client.py).

In-process: the gateway's router over two real tiny-arith engines behind their real HTTP
endpoints.  In a swarm: one replica SIGKILLed while it holds requests."""
import asyncio
import os
import signal
import time

import pytest

from actorjet.serving.engine_wire import engine_app
from actorjet.models import zoo
from actorjet.serving.batching_engine import GenRequest
from actorjet.serving.engine_client import ReplicaRouter, replica_services
from actorjet.serving.openai_api import EngineUnavailable
from actorjet.serving.serve import AppServer
from actorjet.serving.transformers_engine import TransformersEngine
from swarm import REPO, pid_of, wait_until


def test_the_directory_names_replicas_in_order_with_their_weight_receivers():
    service = {"gateway": {"url": "g"}, "engine.10": {"url": "e10"}, "weights.10": {"url": "w10"},
               "engine": {"url": "e0"}, "weights": {"url": "w0"}, "engine.2": {"url": "e2"}, "learner": {},
               "engine.x": {"url": "not a replica"}}
    replicas = replica_services(service)
    assert list(replicas) == ["engine", "engine.2", "engine.10"]
    assert replicas["engine"] == ({"url": "e0"}, {"url": "w0"}) and replicas["engine.2"] == ({"url": "e2"}, None)


def test_engines_becomes_one_child_per_replica_and_bad_values_get_one_line_errors():
    from actorjet.config import normalize
    from actorjet.errors import UserError
    from actorjet.runtime.head import with_engine_replicas
    from actorjet.runtime.tree_spec import load_tree

    tree = load_tree(REPO / "supervisors" / "default.toml")
    job = normalize({"models": [{"engines": 3, "engine_placement": [{}, {"node": "b"}, {"gpus": 1}]}]})
    [model] = [c for c in with_engine_replicas(tree, job).children if c.id == "model.policy"]
    assert [(c.id, c.args, c.placement) for c in model.children if c.kind == "engine"] == [
        ("engine", {"replica": 0}, {}), ("engine.1", {"replica": 1}, {"node": "b"}),
        ("engine.2", {"replica": 2}, {"gpus": 1})]
    assert with_engine_replicas(tree, normalize({})) == tree                  # one engine: the tree as written
    assert normalize({"models": [{"engine": "vllm", "tensor_parallel_size": 4}]})["models"][0]["tensor_parallel_size"] == 4
    for bad, says in (({"engines": 0}, "engines must be from 1 to 64, got 0"),
                      ({"engines": True}, "field 'engines' must be int"),
                      ({"engines": 2, "engine_placement": [{"gpus": 1}]}, "one placement table per engine replica"),
                      ({"engine_placement": [{"rack": 3}]}, "each with node, gpus or cpus"),
                      ({"tensor_parallel_size": 2}, 'above 1 only with engine = "vllm"')):
        with pytest.raises(UserError, match=says):
            normalize({"models": [bad]})


@pytest.fixture(scope="module")
def two_engines():
    engines = [TransformersEngine(zoo.tiny_arith(0), seed=0) for _ in range(2)]
    servers = [AppServer(engine_app(e)) for e in engines]
    yield engines, servers
    for server, engine in zip(servers, engines):
        server.stop()
        engine.close()


def test_an_episode_sticks_to_a_replica_new_ones_go_to_the_least_busy_and_a_dead_one_is_routed_around(two_engines):
    engines, servers = two_engines
    router = ReplicaRouter(retry_s=60.0)
    router.set_replicas({"engine": servers[0].url, "engine.1": servers[1].url})
    prompt = engines[0].tokenizer("12+30=", add_special_tokens=False)["input_ids"]

    async def scenario():
        first = await asyncio.gather(*(router(GenRequest(prompt, 3, 0.0, cache_key=f"e{k}/policy")) for k in range(8)))
        spread = dict(router.served)
        again = [await router(GenRequest(prompt, 3, 0.0, cache_key=f"e{k}/policy")) for k in range(8)]
        where = {k: router.sticky[f"e{k}"] for k in range(8)}
        # a replica at an address where nothing listens (its process is gone): every call is
        # answered by the other, and the dead one is out until the directory names it anew
        router.set_replicas({"engine": servers[0].url, "engine.1": "http://127.0.0.1:9"})
        rerouted = await asyncio.gather(*(router(GenRequest(prompt, 3, 0.0, cache_key=f"e{k}/policy"))
                                          for k in range(8)))
        stats = router.replica_stats()
        router.set_replicas({"engine": servers[0].url, "engine.1": servers[1].url})      # restarted
        back = await asyncio.gather(*(router(GenRequest(prompt, 3, 0.0, cache_key=f"n{k}/policy")) for k in range(8)))
        router.set_replicas({"engine": "http://127.0.0.1:9"})
        with pytest.raises(EngineUnavailable, match="every engine replica failed"):
            await router(GenRequest(prompt, 3, 0.0, cache_key="z/policy"))
        await router.close()
        return first, spread, again, where, rerouted, stats, back

    first, spread, again, where, rerouted, stats, back = asyncio.run(scenario())
    assert all(r[0].completion_ids == first[0][0].completion_ids for r in first + again + rerouted + back)
    assert spread == {"engine": 4, "engine.1": 4}                       # eight new episodes at once: four each
    assert sorted(where.values()) == ["engine"] * 4 + ["engine.1"] * 4
    # the same eight again, one at a time: each on its own replica (8 + 8); with engine.1 dead
    # its four fail there once and are answered by engine (+8); restarted, it takes new ones (+4)
    assert stats["engine.1"]["out"] and stats["engine.1"]["failed"] == 4 and not stats["engine"]["out"]
    assert router.served == {"engine": 8 + 8 + 4, "engine.1": 8 + 4}


@pytest.mark.slow
def test_a_replica_killed_while_it_holds_requests_fails_no_episode_and_takes_traffic_again(swarm, tmp_path):
    """``engines = 2``: replica engine.1's batcher is stalled so it holds the calls routed to it,
    then its process is SIGKILLed.  Its calls are answered by engine (no episode aborted, no
    group dropped), its supervisor restarts it and the gateway takes it back.  (Steps of
    tiny-arith take ~0.25 s on a quiet machine: the job is long enough never to end first.)"""
    from actorjet.registry import protocol as proto
    from actorjet.runtime.head import attach_root, lookup, status as head_status
    from jobs import tiny_arith

    (tmp_path / "job.toml").write_text(tiny_arith(steps=1000, model="engines = 2"))
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    replicas = lambda: status()["models"][0]["engine_replicas"]  # noqa: E731
    wait_until(lambda: status()["models"][0]["learner_step"] >= 2 and all(r["served"] for r in replicas().values())
               and len(replicas()) == 2, 120, interval_s=0.5, what="2 steps with both replicas serving")
    asys, root = attach_root(port)
    pid = pid_of(port, "model.policy/engine.1")
    asys.tell(lookup(asys, root, "model.policy/engine.1"), proto.Stall(600))      # it holds what it gets

    def holding():
        """The replica's calls once the stall took hold: none served for a second (read at
        once after the Stall, a batch it was running still finished afterwards)."""
        before = replicas()["engine.1"]
        time.sleep(1.0)
        now = replicas()
        return now if now["engine.1"]["served"] == before["served"] and now["engine.1"]["outstanding"] > 0 else None
    held = wait_until(holding, 30, interval_s=0.2, what="calls held by the stalled replica")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: status()["restarts"].get("root/model.policy/engine.1") == 1, 60, what="engine.1 restarted")
    served = replicas()["engine.1"]["served"]
    wait_until(lambda: replicas()["engine.1"]["served"] > served, 60, interval_s=0.5,
               what="the restarted replica taking calls again")
    steps = status()["models"][0]["learner_step"]
    wait_until(lambda: status()["models"][0]["learner_step"] >= steps + 3, 60, interval_s=0.5, what="3 more steps")
    data = status()
    assert data["aborted_by_cause"] == {} and data["groups"]["dropped"] == 0, data["aborted_by_cause"]
    hardware = data["models"][0]["hardware"]       # device = "auto", decided by each process: no GPU here
    assert {k: v["device"] for k, v in hardware.items()} == {"engine": "cpu", "engine.1": "cpu", "learner": "cpu"}
    assert hardware["engine"]["kv_budget_mb"] == 1024.0 and hardware["learner"]["gpu_share"] == 1.0
    final = data["models"][0]["engine_replicas"]
    assert final["engine.1"]["failed"] >= held["engine.1"]["outstanding"]       # sent again, elsewhere
    assert pid_of(port, "model.policy/engine.1") not in (None, pid)


def test_status_and_top_show_each_replicas_calls_and_which_is_out():
    from rich.console import Console

    from actorjet.cli.tables import print_status
    from actorjet.cli.top import replicas_cell

    model = {"name": "policy", "weight_version": 3, "learner_step": 3, "engine_replicas": {
        "engine": {"url": "u0", "out": False, "outstanding": 2, "served": 40, "failed": 0},
        "engine.1": {"url": "u1", "out": True, "outstanding": 0, "served": 17, "failed": 3}}}
    console = Console(record=True, width=200)
    print_status({"models": [model], "nodes": [], "runners": []}, console)
    shown = console.export_text()
    assert "engine: 40 / 2" in shown and "engine.1: 17 / 0 out" in shown
    assert replicas_cell(model) == "e:40/2 e.1:17/0 out" and replicas_cell({"name": "m"}) == "-"


def test_status_and_top_show_each_process_device_and_its_kv_cache():
    from actorjet.cli.tables import hardware_cell

    model = {"name": "policy", "hardware": {
        "engine": {"device": "cuda:0", "kv_budget_mb": 65536.0, "kv_used_mb": 4301.2, "kv_kept": 1},
        "learner": {"device": "cuda:0", "gpu_share": 0.4}}}
    assert hardware_cell(model) == "engine: cuda:0 4301/65536, learner: cuda:0"
    assert hardware_cell({"name": "m"}) == "-"
