"""A model's episode store: nothing finished is lost, nothing is trained twice, a group is
trained only whole — through retries, closed episodes, learner restarts and poison — and the
learner's pull (next_batch) keeps task quotas exact.  (The registry's group bookkeeping is
tested in test_desks.py; the whole path in a live swarm in test_training.py and test_chaos.py.)"""
import json

from actorjet.rl.batching import BatchConfig, compose, next_batch
from actorjet.store.episode_store import EpisodeStore
from actorjet.store.records import CallRecord


def record(store, episode_id, prompt=(5, 6, 7)):
    return CallRecord(episode_id, "policy", "default", store.next_index(episode_id), 0, list(prompt), [8, 9],
                      [-0.5, -0.2], 0, 1.0)


def finish(store, group_id, rewards, task="t", members=None, size=None):
    """A runner's result: calls recorded first, then the rewards with their group."""
    episodes = [f"{group_id}.{k}" for k in (members or range(len(rewards)))]
    store.add([record(store, e) for e in episodes])
    return store.put_results({"group_id": group_id, "size": size or len(rewards), "task_name": task,
                              "behavior": task, "version": 1},
                             [{"episode_id": e, "member": e.rsplit(".", 1)[1].split("r")[0], "reward": r}
                              for e, r in zip(episodes, rewards)])


def test_a_group_is_trainable_only_when_every_member_has_a_reward(tmp_path):
    store = EpisodeStore(tmp_path / "s.sqlite")
    assert finish(store, "g1", [1.0, 0.0], members=[0, 1], size=3) == []
    assert store.counts()["complete"] == 0 and next_batch(store, BatchConfig("policy", 1)) is None
    store.close(["g1.1"])                                 # member 1 failed: closed at the gateway
    assert finish(store, "g1", [0.5], members=[1]) == ["g1.1"]       # a late result for it is refused
    finish(store, "g1", [0.5, 1.0], members=["1r1", 2])               # its retry takes its place
    assert store.counts() == {"complete": 1, "trained": 0, "quarantined": 0, "pending": 1, "episodes_trained": 0}
    batch = next_batch(store, BatchConfig("policy", 1, merge="tree", prepare=lambda calls: {"drift_repairs": 0}))
    assert batch["group_ids"] == ["g1"] and batch["stats"]["episodes"] == 3
    assert sorted(batch["stats"]["by_task"]) == ["t"] and batch["samples"]
    assert store.is_closed("g1.1") and store.calls(["g1.1"]) == {"g1.1": []}    # its calls are gone
    store.trained(["g1"], 1)                  # three members trained, whatever their episodes were
    assert store.counts() == {"complete": 1, "trained": 1, "quarantined": 0, "pending": 0, "episodes_trained": 3}


def test_learner_restarts_rewind_to_the_checkpoint_and_nothing_trains_twice(tmp_path):
    path = tmp_path / "s.sqlite"
    gateway = EpisodeStore(path)
    for i in range(5):
        finish(gateway, f"g{i}", [0.0, 1.0])
    learner = EpisodeStore(path)               # another process in real life: the same file
    cfg = BatchConfig("policy", 2)
    first = next_batch(learner, cfg)
    learner.trained(first["group_ids"], 1)     # step 1, then a checkpoint at step 1
    second = next_batch(learner, cfg)
    learner.trained(second["group_ids"], 2)
    prefetched = next_batch(learner, BatchConfig("policy", 1))        # taken, never trained: the crash
    assert set(first["group_ids"] + second["group_ids"] + prefetched["group_ids"]) == {f"g{i}" for i in range(5)}
    assert learner.counts()["pending"] == 1            # taken counts as pending until trained
    # the learner restarts from its checkpoint at step 1: step 2 and the prefetched batch come back
    restarted = EpisodeStore(path)
    assert restarted.rewind(1) == 3
    assert restarted.counts() == {"complete": 5, "trained": 2, "quarantined": 0, "pending": 3, "episodes_trained": 4}
    again = next_batch(restarted, BatchConfig("policy", 3))
    assert sorted(again["group_ids"]) == sorted(second["group_ids"] + prefetched["group_ids"])
    assert not set(again["group_ids"]) & set(first["group_ids"])       # never the checkpoint's groups
    # the gateway restarts too: its calls go on after the stored ones, the same rows are not rewritten
    assert EpisodeStore(path).next_index("g0.0") == 1


def test_a_poisoned_group_is_quarantined_with_its_cause_and_the_rest_trains(tmp_path):
    store = EpisodeStore(tmp_path / "s.sqlite")
    finish(store, "good", [0.0, 1.0])
    finish(store, "bad", [0.0, 1.0])
    with store.lock:               # stored before rewards were checked: a string reward
        store.db.execute("UPDATE episodes SET reward = ? WHERE episode_id = 'bad.0'", (json.dumps("high"),))
    out = next_batch(store, BatchConfig("policy", 2))
    assert out["samples"] is None and [g for g, _ in out["quarantined"]] == ["bad"]
    assert "invalid reward" in out["quarantined"][0][1]
    assert store.quarantined()[0]["group_id"] == "bad" and "high" in store.quarantined()[0]["sample"]
    finish(store, "next", [1.0, 0.0])
    assert next_batch(store, BatchConfig("policy", 2))["group_ids"] == ["good", "next"]
    assert store.rewind(0) == 2 and store.counts()["quarantined"] == 1     # a rewind never brings it back


def test_task_quotas_are_exact_and_a_stalled_task_is_filled_only_after_fill_after_s(tmp_path):
    store = EpisodeStore(tmp_path / "s.sqlite")
    for i in range(6):
        finish(store, f"a{i}", [0.0, 1.0], task="a")
    finish(store, "b0", [0.0, 1.0], task="b")
    cfg = BatchConfig("policy", 4, weights={"a": 1.0, "b": 1.0}, started=0.0)
    last_b = store.last_complete()["b"]
    assert compose(store, cfg, now=last_b + 0.1) is None            # b finished a group just now: wait for it
    assert compose(store, BatchConfig("policy", 4, weights=cfg.weights, mix="strict"), now=last_b + 99) is None
    assert compose(store, cfg, now=last_b + 99) == {"a": 2, "b": 2}  # b stalled: fill its share
    batch = next_batch(store, BatchConfig("policy", 4, weights=cfg.weights, fill_after_s=0.0))
    assert batch["stats"]["by_task"]["a"]["groups"] == 3 and batch["stats"]["by_task"]["b"]["groups"] == 1
    finish(store, "b1", [0.0, 1.0], task="b")
    finish(store, "b2", [0.0, 1.0], task="b")
    batch = next_batch(store, BatchConfig("policy", 4, weights=cfg.weights))
    assert {t: v["groups"] for t, v in batch["stats"]["by_task"].items()} == {"a": 2, "b": 2}


def test_a_batch_smaller_than_the_weights_resolution_keeps_the_mix_over_steps(tmp_path):
    """2 groups a step at 3:1 rounds to 2 + 0: without the carried debt the minor task never trains."""
    store = EpisodeStore(tmp_path / "s.sqlite")
    for i in range(8):
        finish(store, f"major{i}", [0.0, 1.0], task="major")
        finish(store, f"minor{i}", [0.0, 1.0], task="minor")
    cfg = BatchConfig("policy", 2, weights={"major": 3.0, "minor": 1.0}, mix="strict")
    trained = {"major": 0, "minor": 0}
    for _ in range(4):
        for task, v in next_batch(store, cfg)["stats"]["by_task"].items():
            trained[task] += v["groups"]
    assert trained == {"major": 6, "minor": 2}
    assert max(abs(d) for d in cfg.owed.values()) <= 1.0


def test_the_store_judges_groups_and_tells_each_complete_one_once(tmp_path):
    """store/completed.py: what the gateway sends the head (groups.jsonl, the learner's backlog)."""
    from actorjet.store import completed

    store = EpisodeStore(tmp_path / "s.sqlite")
    finish(store, "g1", [1.0, 0.0])
    finish(store, "g2", [0.5], members=[0], size=2)                  # one member still running
    (news,) = completed.news(store)
    assert news == {"group_id": "g1", "task_name": "t", "behavior": "t", "version": 1,
                    "rewards": {"g1.0": 1.0, "g1.1": 0.0}}
    assert completed.news(store) == [news]           # told again until the head says it wrote it down
    completed.told(store, ["g1"])
    assert completed.news(store) == [] and completed.standing(store) == (1, 1)     # (complete, untrained)
    finish(store, "g2", [0.25], members=["1"], size=2)
    assert [g["group_id"] for g in completed.news(store)] == ["g2"] and completed.standing(store) == (2, 2)
    batch = next_batch(store, BatchConfig("policy", 2))
    assert completed.standing(store) == (2, 2)                        # taken for a step: still the learner's work
    store.trained(batch["group_ids"], 1)
    assert completed.standing(store) == (2, 0)
    completed.told(store, ["g2"])
    store.retain(1)                                                  # retired groups still count as complete
    assert completed.standing(store) == (2, 0) and store.counts()["complete"] == 2


def test_retention_waits_for_a_group_to_be_told(tmp_path):
    from actorjet.store import completed

    store = EpisodeStore(tmp_path / "s.sqlite")
    finish(store, "g1", [1.0, 0.0])
    store.trained([g["group_id"] for g in store.take({}, 1)], 1)
    assert store.retain(1) == {"groups": 0, "episodes": 0}          # its groups.jsonl line first
    completed.told(store, [g["group_id"] for g in completed.news(store)])
    assert store.retain(1) == {"groups": 1, "episodes": 2}


def test_a_store_from_before_gets_the_logged_and_members_columns_and_its_groups_count_as_told(tmp_path):
    import sqlite3

    from actorjet.store import completed

    store = EpisodeStore(tmp_path / "s.sqlite")
    finish(store, "g1", [1.0, 0.0])
    store.trained([g["group_id"] for g in store.take({}, 1)], 1)
    store.close_db()
    with sqlite3.connect(tmp_path / "s.sqlite") as db:               # as the store was before these columns
        db.executescript("CREATE TABLE old AS SELECT group_id, task_name, behavior, version, size, complete_at, "
                         "taken, trained_step, quarantine FROM groups; DROP TABLE groups; "
                         "ALTER TABLE old RENAME TO groups")
    again = EpisodeStore(tmp_path / "s.sqlite")
    assert completed.news(again) == []                                # the old registry logged them
    finish(again, "g2", [1.0])
    assert [g["group_id"] for g in completed.news(again)] == ["g2"]
    assert again.retain(0) == {"groups": 0, "episodes": 0} and again.counts()["complete"] == 2
    assert again.counts()["episodes_trained"] == 2                    # g1's members, counted when it opened


def test_the_store_records_each_episodes_timeline_in_order_and_the_batch_carries_it(tmp_path):
    """The step timeline's store stages (monitor/timeline.py): leased (the runner's lease,
    passed through), first call, last answer, stored, complete, taken — in that order."""
    import time

    store = EpisodeStore(tmp_path / "s.sqlite")
    leased = time.time()
    for e in ("g1.0", "g1.1"):
        store.call_started(e)
        store.add([record(store, e)])
    store.put_results({"group_id": "g1", "size": 2, "task_name": "t", "behavior": "t", "version": 1},
                      [{"episode_id": "g1.0", "member": 0, "reward": 1.0, "leased_at": leased}])
    time.sleep(0.01)
    store.put_results({"group_id": "g1", "size": 2, "task_name": "t", "behavior": "t", "version": 1},
                      [{"episode_id": "g1.1", "member": 1, "reward": 0.0, "leased_at": leased}])
    batch = next_batch(store, BatchConfig("policy", 1))
    rows = {row[0]: row[1:] for row in batch["timeline"]}
    assert sorted(rows) == ["g1.0", "g1.1"]
    for times in rows.values():
        assert None not in times and times == sorted(times), times
    assert rows["g1.0"][3] < rows["g1.1"][3] == rows["g1.0"][4]     # the group completed with its last member
    assert store.times == {}                                       # nothing kept for ended episodes
