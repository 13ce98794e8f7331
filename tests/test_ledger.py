"""The durable ledger: nothing finished is lost, nothing is trained twice.  (The registry's
group bookkeeping is tested in test_desks.py.)"""
from actorjet.ledger import Ledger


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
