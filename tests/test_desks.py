"""The registry's desks as plain state objects: each test drives a real EpisodeDesk with the
messages the actors send, and checks the messages it answers with (addresses are plain
strings here: a desk only passes them on).  Nothing finished is lost, no group is trained in
part, nothing is counted twice, and upgrades reach every live runner."""
import json
import time

from actorjet.registry.episodes import EpisodeDesk
from actorjet.runtime import messages as m
from actorjet.registry import protocol as proto

TOKEN = "k"


def make_desk(group_size=2, retries=1, timeout=60.0) -> EpisodeDesk:
    job = {"train": {"group_size": group_size, "groups_per_step": 2, "max_staleness": 1,
                     "lease_timeout_s": timeout, "episode_retries": retries, "seed": 0},
           "tasks": [{"name": "t", "source": "agents.arithmetic", "behavior": "agents.arithmetic:behavior",
                      "weight": 1.0}]}
    desk = EpisodeDesk({"job": job, "token": TOKEN, "run_dir": None}, epoch=1)
    for model, kind, address in (("policy", "gateway", "gw"), ("policy", "learner", "learner")):
        desk.on_ServiceUp(m.ServiceUp(model, kind, f"http://{address}", address), None)
    desk.runners = [{"id": "r", "placed": True}, {"id": "r2", "placed": True}]
    (out,) = desk.on_LeaseRequest(proto.LeaseRequest("r", 1, {"t": 1}), "addr-r")
    assert out[1].reason == "models not ready"          # no engine behind the gateway yet: no lease
    desk.on_ServiceUp(m.ServiceUp("policy", "engine", "http://engine", "engine"), None)
    return desk


def lease(desk, runner="r") -> dict:
    (out,) = desk.on_LeaseRequest(proto.LeaseRequest(runner, 1, {"t": 1}), f"addr-{runner}")
    to, msg = out
    assert to == f"addr-{runner}" and isinstance(msg, proto.Leases), msg
    (one,) = msg.leases
    return one


def result(lease, ok=lambda k: True) -> proto.GroupResult:
    """What a runner reports: done (its reward is in the stores) or failed, never a reward."""
    return proto.GroupResult("r", lease["lease_id"], [
        {"episode_id": e["episode_id"]} if ok(k) else {"episode_id": e["episode_id"], "error": "ValueError: env crashed"}
        for k, e in enumerate(lease["episodes"])])


def open_groups(desk) -> int:
    """Groups the registry still leases (issued, neither done by every member nor dropped)."""
    return desk.status_counts()["groups"]["groups_open"]


def sent(out, kind, to=None) -> list:
    return [msg for addr, msg in out if isinstance(msg, kind) and (to is None or addr == to)]


def closed(out) -> list[str]:
    return [e for msg in sent(out, proto.CloseEpisodes, to="gw") for e in msg.episode_ids]


def test_a_failed_member_is_run_again_in_its_place_and_the_group_finishes_whole():
    desk = make_desk()
    first = lease(desk)
    assert (first["members"], first["group_size"]) == ([0, 1], 2)    # what the runner stores rewards under
    out = desk.on_GroupResult(result(first, ok=lambda k: k == 0), "r")
    assert closed(out) == [first["episodes"][1]["episode_id"]] and open_groups(desk) == 1
    retry = lease(desk, "r2")
    assert retry["group_id"] == first["group_id"] and [e["episode_id"] for e in retry["episodes"]] == ["g1_1.1r1"]
    assert retry["members"] == [1]                                   # the retry takes the failed member's place
    assert desk.on_GroupResult(result(retry), "r2") == []           # the stores have its rewards already
    c = desk.counters
    assert (c.requeued, c.abort_causes, c.completed, open_groups(desk)) == (1, {"behavior error": 1}, 2, 0)
    assert c.completed_by_runner == {"r": 1, "r2": 1}


def test_failed_expired_and_badly_rewarded_episodes_are_closed_at_the_gateways():
    desk = make_desk(retries=1)
    first = lease(desk)
    nan = proto.GroupResult("r", first["lease_id"], [   # the runner refused a NaN its behavior returned
        {"episode_id": first["episodes"][0]["episode_id"]},
        {"episode_id": first["episodes"][1]["episode_id"], "error": "invalid reward: must be a finite number"}])
    assert closed(desk.on_GroupResult(nan, "r")) == [first["episodes"][1]["episode_id"]]   # the bad one only
    assert desk.counters.abort_causes == {"invalid reward": 1}
    retry = lease(desk)                                      # its member runs again...
    out = desk.on_RunnerDown(m.RunnerDown("r"), "runners")   # ...and its runner dies
    assert {retry["episodes"][0]["episode_id"], first["episodes"][0]["episode_id"]} <= set(closed(out))
    c = desk.counters      # the group is dropped whole: its finished member is closed too
    assert (c.groups_dropped, c.drop_causes, c.in_flight) == (1, {"runner died": 1}, 0)
    (source,) = desk.sources
    assert desk.leases.room(source, {}, desk.sources) == desk.leases.window     # a dropped group frees its place


def test_expired_leases_are_requeued_and_late_results_rejected():
    desk = make_desk()
    first = lease(desk)
    for stored in desk.leases.leases.values():
        stored["active"] = time.time() - 100          # no LLM call for longer than the idle limit
    assert len(closed(desk.tick())) == 2
    desk.on_GroupResult(result(first), "r")          # the slow runner answers after all: rejected
    assert open_groups(desk) == 1
    again = lease(desk, "r2")
    desk.on_GroupResult(result(again), "r2")
    c = desk.counters
    assert (c.late_results, c.completed, c.requeued, open_groups(desk)) == (1, 2, 2, 0)
    assert desk.status_counts()["groups"]["late_results_rejected"] == 1


def test_an_episode_that_keeps_calling_outlives_the_idle_limit_but_not_the_total_limit():
    """issue 30: a 6-minute episode was expired at 120 s with nothing stored.  The limit is an
    idle limit (gateways report which episodes called), with a separate total limit; the
    cause travels to the gateways (the agent's 409 says it) and to status."""
    job_train = {"lease_timeout_s": 60.0, "episode_max_s": 1000.0}
    desk = make_desk(timeout=60.0)
    desk.leases.total_limit = job_train["episode_max_s"]
    first = lease(desk)
    (stored,) = desk.leases.leases.values()
    start = stored["started"]
    for t in range(0, 600, 30):                      # a call every 30 s for 10 minutes
        desk.on_EpisodeActivity(proto.EpisodeActivity("policy", [first["episodes"][0]["episode_id"]]), "gw")
        stored["active"] = start + t                 # (the registry stamps with its clock: simulated)
        assert desk.leases.tick(now=start + t + 1) == []
    out = desk.leases.tick(now=start + 600 + 63)      # then silence past the idle limit + grace
    (msg,) = [x for _, x in out if isinstance(x, proto.CloseEpisodes)]
    assert "idle" in msg.cause and "lease_timeout_s" in msg.cause
    assert desk.counters.abort_causes == {"lease expired (idle)": 2}
    routed = desk.route(out)                           # and its runner is told to give up on it now
    assert [(to, x.lease_id) for to, x in routed if isinstance(x, proto.AbandonLease)] == [("addr-r", first["lease_id"])]
    again = lease(desk, "r2")
    for stored in desk.leases.leases.values():
        stored["active"] = stored["started"] + 1100   # busy all along, but past episode_max_s
    out = desk.leases.tick(now=stored["started"] + 1101)
    assert "total limit" in [x for _, x in out if isinstance(x, proto.CloseEpisodes)][0].cause
    assert again["timeout_s"] == 1000.0 and again["idle_s"] == 60.0    # the runner gives up at the total limit


def test_client_mode_episodes_are_leases_of_one_member():
    """One path to finish a group: a client-mode episode is a lease (opened by the program at
    a gateway), ended by /end or /abort, expired by the same idle limit as a runner's."""
    desk = make_desk()
    client = lambda event, episode, **more: desk.handlers()[proto.ClientEvent](  # noqa: E731
        proto.ClientEvent({"event": event, "episode_id": episode, **more}), "gw")
    for k in range(2):
        client("open", f"c{k}", group="G", group_size=2)
    assert desk.counters.in_flight == 2 and desk.status_counts()["groups"]["leases_open"] == 2
    assert client("end", "c0") == [] and open_groups(desk) == 1
    assert client("end", "c1") == [] and open_groups(desk) == 0     # nothing left to run
    client("open", "c9")
    assert closed(client("abort", "c9")) == ["c9"]
    c = desk.counters
    assert (c.in_flight, c.completed, c.aborted, open_groups(desk), c.groups_dropped) == (0, 2, 1, 0, 1)
    assert c.abort_causes == {"client abort": 1} and c.requeued == 0        # a program's episode is never re-run
    client("open", "c5", group="H", group_size=2)
    client("open", "c6", group="H", group_size=2)
    client("end", "c5")
    for stored in desk.leases.leases.values():
        stored["active"] = time.time() - 100                 # c6's program went quiet
    out = desk.tick()
    assert "client expired (idle)" in sent(out, proto.CloseEpisodes, to="gw")[0].cause
    assert set(closed(out)) == {"c5", "c6"}              # its group is dropped whole
    assert not sent(out, proto.AbandonLease) and desk.counters.in_flight == 0    # no runner to tell
    assert client("end", "c6") == []                      # too late: its lease is gone


def test_groups_jsonl_and_the_learners_backlog_come_from_the_stores(tmp_path):
    desk = make_desk()
    desk.learners.group_log.path = tmp_path / "groups.jsonl"
    g = {"group_id": "g1_1", "task_name": "t", "behavior": "t", "version": 1, "rewards": {"g1_1.0": 1.0}}
    assert desk.handlers()[proto.StoreNews](proto.StoreNews("policy", [g], 1, 3), "gw")[0][1].group_ids == ["g1_1"]
    out = desk.handlers()[proto.StoreNews](proto.StoreNews("critic", [g, dict(g, group_id="g1_2")], 2, 0), "gw2")   # two stores
    assert [(to, x.group_ids) for to, x in out] == [("gw2", ["g1_1", "g1_2"])]   # both marked told there
    lines = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert [x["group_id"] for x in lines] == ["g1_1", "g1_2"] and lines[0]["rewards"] == {"g1_1.0": 1.0}
    assert desk.learners.untrained == {"policy": 3, "critic": 0}
    assert desk.status_counts()["groups"]["finished"] == 2          # as the stores judged it, never counted here


def test_the_registry_keeps_no_count_of_finished_groups_of_its_own():
    """Issue 51: "done" lives in the episode stores only (StoreNews).  A registry-side count of
    finished groups (it was ``groups_finished``, bumped when every member of a lease reported
    done, and it trailed the stores) must not come back under any name."""
    import dataclasses
    import re
    from pathlib import Path

    import actorjet.registry as registry
    from actorjet.registry.counters import Counters

    assert not [f.name for f in dataclasses.fields(Counters) if re.search(r"finish|complete", f.name)
                and f.name.startswith("groups")]
    desk = make_desk()
    first = lease(desk)
    desk.on_GroupResult(result(first), "r")                           # every member done, per the runner
    assert desk.status_counts()["groups"]["finished"] == 0            # the stores have not said so
    sources = "\n".join(p.read_text() for p in Path(registry.__file__).parent.glob("*.py"))
    assert not re.search(r"groups?_(finished|completed?)\s*\+=|finished\s*\+=\s*1", sources)


def test_a_learner_starved_by_a_stalled_gateway_is_not_blamed():
    """The gateway blocks, so no batch can be assembled: only the gateway is restarted (CI once
    saw the learner restarted with it, which costs a rewind to its checkpoint)."""
    from actorjet.registry.watchdog import Watchdog

    dog = Watchdog(stall_s=4.0)
    dog.progress("policy/learner", 7, 1, "learner", now=0.0)       # batches waiting, step 7
    dog.progress("policy/gateway", 100, 1, "gateway", now=0.0)     # its loop stops turning
    assert [who for who, _, _ in dog.check(now=5.0)] == ["policy/gateway"]
    assert dog.check(now=8.0) == []                                # still starved: not blamed
    dog.progress("policy/gateway", 0, 1, "gateway-2", now=8.5)     # a new incarnation: healed
    assert (dog.detected, dog.healed) == (1, 1)
    assert dog.check(now=12.0) == []                               # its quiet time started again at 8
    dog.progress("policy/gateway", 5, 1, "gateway-2", now=12.5)    # the new gateway serves
    assert [who for who, _, _ in dog.check(now=13.0)] == ["policy/learner"]   # stuck on its own now


def test_an_engine_that_stops_reporting_is_stalled_with_or_without_work_waiting():
    """A SIGKILLed engine whose exit its supervisor never heard of (seen once in the suite: it
    stayed down for minutes) sends no more reports: silence for stall_s is a stall too."""
    from actorjet.registry.watchdog import Watchdog

    dog = Watchdog(stall_s=4.0)
    for t in range(4):                                          # idle, reporting every second
        dog.progress("policy/engine.1", 10, 0, "engine", now=float(t))
        dog.progress("policy/learner", 3, 0, "learner", now=float(t))
    assert dog.check(now=6.0) == []                             # 3 s of silence: not yet
    dog.progress("policy/learner", 3, 0, "learner", now=7.5)
    [(who, address, reason)] = dog.check(now=7.5)
    assert (who, address, reason) == ("policy/engine.1", "engine", "stalled: no report for 4 s")
    assert dog.check(now=20.0) == []                            # named once; the learner is never "silent"
    dog.progress("policy/engine.1", 0, 0, "engine-2", now=21.0)
    assert (dog.detected, dog.healed) == (1, 1)


def test_counters_change_one_way_through_their_methods():
    """registry/counters.py: every count changes through a method of Counters, never by a
    desk assigning its fields (it did, 11 times, in leases.py)."""
    import re
    from pathlib import Path

    import actorjet.registry as registry

    for path in Path(registry.__file__).parent.glob("*.py"):
        if path.name != "counters.py":
            assert not re.search(r"counters\.\w+(\[[^\]]*\])?\s*([-+*]?=)(?!=)", path.read_text()), path.name


def test_an_unanswered_node_is_pinged_at_doubling_gaps_and_an_answering_one_every_beat():
    """A node that drops packets silently holds a pending TCP connect per Ping for ~2 minutes,
    and thespian holds all of the registry's sends once 20 are pending: pinged every beat, an
    outbound-only laptop muted the registry's Leases to the door (a suite run stopped at step 6)."""
    from actorjet.registry.nodes import NodeTable

    table = NodeTable("t", node_timeout_s=6.0)
    silent = table.admit({"node_id": "n1", "name": "laptop", "slots": 1}, "1.1")
    healthy = table.admit({"node_id": "n2", "name": "server", "slots": 1}, "1.2")
    silent.link = healthy.link = object()
    pinged = {"laptop": [], "server": []}
    for beat in range(130):                         # ~2 minutes of 1-second heartbeats
        for node in table.to_ping(1.0, now=float(beat)):
            pinged[node.name].append(beat)
        table.seen(healthy.node_id)                 # the server answers every Ping
    assert pinged["server"] == list(range(130))
    assert pinged["laptop"][:5] == [0, 1, 3, 7, 15] and len(pinged["laptop"]) <= 20
    table.seen(silent.node_id)                      # back: pinged at the next beat again
    assert silent in table.to_ping(1.0, now=130.0)


def test_a_restarted_learners_old_incarnation_gets_no_more_directories():
    """Every Directory went to every address that ever subscribed: after restarts, to dead
    actors too, and to one on a lost node each send is a TCP connect pending for minutes."""
    desk = make_desk()
    desk.subscribe("learner")
    desk.on_ServiceUp(m.ServiceUp("policy", "learner", None, "learner-2"), None)    # restarted
    desk.subscribe("learner-2")
    sent_to = [to for to, msg in desk.on_ServiceUp(m.ServiceUp("policy", "engine", "http://e2", "engine-2"), None)
               if isinstance(msg, m.Directory)]
    assert sent_to == ["learner-2"]
    # an address that still serves another kind (a learner's "ranks") keeps its directory
    desk.on_ServiceUp(m.ServiceUp("policy", "ranks", "http://r", "learner-2"), None)
    desk.on_ServiceUp(m.ServiceUp("policy", "learner", None, "learner-3"), None)
    assert desk.subscribers == ["learner-2"]


def test_a_stopped_engines_late_announcement_does_not_replace_its_successors():
    """An engine placed on a node that was lost for a moment was stopped while it loaded its
    model and started again on the node once it was back.  The stopped one announced last, and
    the directory took its URL: every call went to a port nothing listened on, for good
    (tests/test_hosts.py's engine-apart test, 4 swarms on 2 cores)."""
    desk = make_desk()
    up = lambda url, address, incarnation, supervisor="model-sup": m.ServiceUp(  # noqa: E731
        "policy", "engine", url, address, supervisor, "engine", 0, incarnation)
    desk.on_ServiceUp(up("http://new", "engine-2", 2), None)
    assert desk.on_ServiceUp(up("http://old", "engine-1", 1), None) == []        # late, ignored
    assert desk.services["policy"]["engine"] == {"url": "http://new", "address": "engine-2"}
    desk.on_ServiceUp(up("http://new", "engine-2", 2), None)                      # re-announced
    desk.on_ServiceUp(up("http://third", "engine-3", 3), None)                    # restarted again
    assert desk.services["policy"]["engine"]["url"] == "http://third"
    # a restarted supervisor counts from 1 again: another supervisor's announcement is taken as it comes
    desk.on_ServiceUp(up("http://fourth", "engine-4", 1, supervisor="model-sup-2"), None)
    assert desk.services["policy"]["engine"]["url"] == "http://fourth"


def test_steps_a_restarted_learner_trains_again_are_consumed_once():
    """A learner trained steps 1–4, checkpointed at step 2 and was killed: its successor rewinds
    the store to step 2 (Resumed) and trains steps 3 and 4 again on the same groups.  Counted
    twice, those groups would widen the lease window (groups issued less groups consumed: the
    staleness bound) for good, by more at every restart.  A rewind that no Resumed reported
    (a learner that had no checkpoint yet) is caught by the step trained again."""
    def leasable(desk) -> int:
        """Lease (and finish) groups until the desk says no: its room right now."""
        n = 0
        while isinstance((reply := desk.on_LeaseRequest(proto.LeaseRequest("r", 1, {"t": 1}), "addr-r")[0][1]),
                         proto.Leases):
            for one in reply.leases:
                desk.on_GroupResult(result(one), "r")
            n += len(reply.leases)
        return n

    def trained(desk, step):
        desk.handlers()[proto.Trained](proto.Trained("policy", step, step, 2, tasks={"t": 2}), "learner")

    restarted, unrestarted = make_desk(), make_desk()
    for desk in (restarted, unrestarted):
        for step in (1, 2, 3, 4):
            assert leasable(desk) > 0
            trained(desk, step)
    restarted.handlers()[proto.Resumed](proto.Resumed("policy", 2, 2, 4), "learner")
    assert restarted.learners.consumed(["t"]) == {"t": 4}            # steps 3 and 4 are pending again
    trained(restarted, 3)
    trained(restarted, 4)
    assert restarted.learners.consumed(["t"]) == unrestarted.learners.consumed(["t"]) == {"t": 8}
    trained(restarted, 4)                                            # again, with no Resumed before it
    assert restarted.learners.consumed(["t"]) == {"t": 8}
    assert leasable(restarted) == leasable(unrestarted) > 0


def test_a_restarted_supervisor_replaces_its_old_incarnation_as_a_listener_to_node_news():
    """Node news (NodeUp / NodeLost) went to every address that ever subscribed: a supervisor
    placed again after its node was lost left its dead self there, and each later send to it
    is a TCP connect pending for minutes (thespian holds every send once 20 pend)."""
    from actorjet.registry.nodes import NodeTable

    table = NodeTable(TOKEN, node_timeout_s=6.0)
    table.listen("root/model.policy", "supervisor-on-node-a")
    table.listen("root/runners", "runners")
    table.listen("root/model.policy", "supervisor-on-node-b")       # its node was lost: placed again
    table.listen("", "an-actor-of-no-path")                          # (keyed by its address instead)
    assert sorted(table.listeners.values()) == ["an-actor-of-no-path", "runners", "supervisor-on-node-b"]
    table.listen(["not", "a", "path"], "a-listener-with-a-bad-path")             # keyed by its address, no crash
    assert table.listeners["a-listener-with-a-bad-path"] == "a-listener-with-a-bad-path"


def test_every_control_plane_message_formats_as_its_name_for_thespians_log():
    """thespian formats str(message) on every send and receive for its debug log, log off or
    on: a message class that is not a Message would pay its whole repr each time (0.84 ms for a
    step's timeline record) and would copy a lease's keys into thespian.log."""
    import dataclasses
    import inspect

    from thespian.actors import ActorAddress
    from thespian.system.transport import ReceiveEnvelope, TransmitIntent

    from actorjet.registry import protocol, trials
    from actorjet.runtime import messages

    classes = [c for module in (messages, protocol, trials) for _, c in inspect.getmembers(module, inspect.isclass)
               if c.__module__ == module.__name__ and dataclasses.is_dataclass(c) and c is not trials.Trial]
    assert len(classes) > 60
    assert [c.__name__ for c in classes if not issubclass(c, messages.Message)] == []
    lease = protocol.Leases([{"lease_id": "l1", "episodes": [{"api_key": "secret-key-" + "x" * 40}] * 64}], {})
    for text in (TransmitIntent(ActorAddress("a"), lease).identify(), ReceiveEnvelope("a", lease).identify()):
        assert "Leases" in text and "secret-key" not in text and len(text) < 400, text
    assert "secret-key" in repr(lease)                 # repr stays whole, for debugging
