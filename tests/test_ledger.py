"""The durable ledger and the registry's group bookkeeping: nothing finished is lost,
nothing is trained twice, no group is ever trained in part."""
import time
from types import SimpleNamespace

from actorjet.ledger import Ledger
from actorjet.registry.leases import LeaseDesk
from actorjet.runtime import messages as m


def group(i, n=2):
    return {"group_id": f"g{i}", "task_name": "t", "behavior": "b", "version": 1,
            "episodes": [{"episode_id": f"g{i}.{k}", "reward": float(k)} for k in range(n)]}


def test_ledger_accounts_for_every_group_through_crashes(tmp_path):
    ledger = Ledger(tmp_path)
    for i in range(5):
        assert ledger.store_many([(group(i), {"policy": {f"g{i}.0": [{"x": 1}], f"g{i}.1": []}})]) == [True]
    assert ledger.store_many([(group(0), {"policy": {}})]) == [False]    # a duplicate delivery is not counted
    first = ledger.pending("policy", 2)
    assert [g["group_id"] for g in first] == ["g0", "g1"] and first[0]["calls"]["g0.0"] == [{"x": 1}]
    ledger.assign("policy", ["g0", "g1"], "batch-1")
    assert ledger.count_pending("policy") == 3
    assert ledger.claim("policy", ["g0", "g1"], step=1)
    ledger.assign("policy", ["g2", "g3"], "batch-2")
    # the merger restarts: batch-2 is forgotten, and rebuilt with g1 by mistake → refused whole
    assert Ledger(tmp_path).release() == 2
    assert not ledger.claim("policy", ["g1", "g2"], step=2)
    assert ledger.count_pending("policy") == 3                 # g2, g3, g4: nothing lost
    assert ledger.claim("policy", ["g2", "g3"], step=2)
    assert ledger.claim("policy", ["g4"], step=3)
    # the learner restarts from its checkpoint at step 1: steps 2 and 3 are trained again
    assert ledger.rewind("policy", 1) == 3
    assert ledger.counts()["policy"] == {"finished": 5, "trained": 2, "quarantined": 0, "pending": 3,
                                         "episodes_trained": 4}
    # a group that cannot be trained leaves for good, with its cause; a batch holding it is refused
    ledger.quarantine("policy", "g4", "invalid reward: 'high'", '{"g4.0": "high"}')
    assert [g["group_id"] for g in ledger.pending("policy", 10)] == ["g2", "g3"]
    assert not ledger.claim("policy", ["g3", "g4"], step=2)
    assert ledger.release() == 0                                    # release never brings it back
    assert ledger.counts()["policy"] == {"finished": 5, "trained": 2, "quarantined": 1, "pending": 2,
                                         "episodes_trained": 4}
    assert ledger.quarantined() == [{"group_id": "g4", "model": "policy", "cause": "invalid reward: 'high'",
                                     "sample": '{"g4.0": "high"}'}]


class FakeRegistry:
    """Only what LeaseDesk uses of the registry actor: an epoch and ``send``."""

    def __init__(self):
        self.epoch, self.sent = 1, []

    def send(self, to, msg):
        self.sent.append((to, msg))


def desk(group_size=2, retries=1, timeout=60.0):
    tasks = iter(range(10**6))
    source = SimpleNamespace(name="t", behavior="t", version=1, tasks=({"i": i} for i in tasks),
                             weight=1.0, state="active", issued=0)
    registry = FakeRegistry()
    d = SimpleNamespace(registry=registry, token="k", sources=[source],
                        services={"": {"merger": {"address": "merger"}}}, closed=[])
    d.close_episodes = d.closed.extend          # episodes the gateways must close
    train = {"group_size": group_size, "groups_per_step": 2, "max_staleness": 1, "lease_timeout_s": timeout,
             "episode_retries": retries}
    return LeaseDesk(d, train), registry


def test_failed_expired_and_badly_rewarded_episodes_are_closed_at_the_gateways():
    leases, _ = desk(group_size=2, retries=1, timeout=60.0)
    (lease,) = leases.lease("r", 1, {}, {"policy": "u"})
    nan_reward = m.GroupResult("r", lease["lease_id"], [{"episode_id": lease["episodes"][0]["episode_id"], "reward": 1.0},
                                                        {"episode_id": lease["episodes"][1]["episode_id"],
                                                         "reward": float("nan")}])
    leases.on_result(nan_reward)
    assert leases.desk.closed == [lease["episodes"][1]["episode_id"]]          # the bad one only, for now
    assert leases.abort_causes == {"invalid reward": 1}
    (retry,) = leases.lease("r", 1, {}, {"policy": "u"})                       # its member runs again...
    leases.lost({"r"}, "runner died")                                          # ...and its runner dies
    closed = set(leases.desk.closed)
    assert retry["episodes"][0]["episode_id"] in closed
    assert lease["episodes"][0]["episode_id"] in closed        # the group is dropped: its finished member too


def result(lease, ok=lambda k: True):
    return m.GroupResult("r", lease["lease_id"], [
        {"episode_id": e["episode_id"], "reward": 1.0} if ok(k) else
        {"episode_id": e["episode_id"], "reward": None, "error": "ValueError: env crashed"}
        for k, e in enumerate(lease["episodes"])])


def done_groups(registry):
    return [msg.group for _, msg in registry.sent if isinstance(msg, m.GroupDone)]


def test_a_failed_member_is_run_again_and_the_group_is_only_sent_whole():
    leases, registry = desk()
    (lease,) = leases.lease("r", 1, {}, {"m": "url"})
    leases.on_result(result(lease, ok=lambda k: k == 0))
    assert done_groups(registry) == []
    (retry,) = leases.lease("r2", 1, {}, {"m": "url"})
    assert retry["group_id"] == lease["group_id"] and [e["episode_id"] for e in retry["episodes"]] == ["g1_1.1r1"]
    leases.on_result(result(retry))
    (done,) = done_groups(registry)
    assert [e["episode_id"] for e in done["episodes"]] == ["g1_1.0", "g1_1.1r1"]
    assert leases.counts["requeued"] == 1 and leases.abort_causes == {"behavior error": 1}


def test_a_group_that_cannot_be_completed_is_dropped_whole_and_counted():
    leases, registry = desk(retries=1)
    (lease,) = leases.lease("r", 1, {}, {"m": "url"})
    leases.on_result(result(lease, ok=lambda k: k == 0))
    (retry,) = leases.lease("r", 1, {}, {"m": "url"})
    leases.on_result(result(retry, ok=lambda k: False))
    assert done_groups(registry) == [] and leases.counts["groups_dropped"] == 1
    assert leases.drop_causes == {"behavior error": 1}
    assert leases.room(leases.desk.sources[0], {}) == leases.window     # a dropped group frees its place


def test_expired_leases_are_requeued_and_late_results_rejected():
    leases, registry = desk(timeout=0.0)
    (lease,) = leases.lease("r", 1, {}, {"m": "url"})
    time.sleep(0.01)
    leases.lease_timeout = 60.0
    for stored in leases.leases.values():
        stored["deadline"] = 0.0
    leases.tick()
    leases.on_result(result(lease))                  # the slow runner answers after all
    assert leases.counts["late_results"] == 1 and done_groups(registry) == []
    (again,) = leases.lease("r2", 1, {}, {"m": "url"})
    leases.on_result(result(again))
    assert len(done_groups(registry)) == 1 and leases.counts["completed"] == 2


def test_unacknowledged_groups_go_to_a_restarted_merger_again():
    leases, registry = desk()
    (lease,) = leases.lease("r", 1, {}, {"m": "url"})
    leases.on_result(result(lease))
    leases.merger_up()
    assert len(done_groups(registry)) == 2           # sent, then sent again
    leases.on_stored(lease["group_id"])
    leases.merger_up()
    assert len(done_groups(registry)) == 2
