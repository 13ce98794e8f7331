"""The learner's step in pure code (rl/step.py): staleness filter and metrics line."""
from actorjet.rl.pack import Packed, Term
from actorjet.rl.step import Fresh, StepTimes, keep_fresh, step_record


def sample(versions: list[int]) -> dict:
    ids = list(range(10, 10 + len(versions) + 1))
    terms = [Term(1 + k, 0.5, -1.0, 1.0, v) for k, v in enumerate(versions)]
    return Packed(ids, list(range(len(ids))), list(range(-1, len(ids) - 1)), terms).to_dict()


def test_keep_fresh_drops_old_tokens_and_samples_with_none_left():
    fresh = keep_fresh([sample([3, 5, 1]), sample([0, 1]), sample([5])], version=5, max_staleness=2)
    assert [[t.version for t in s["terms"]] for s in fresh.samples] == [[3, 5], [5]]
    assert fresh.dropped == 3
    assert sorted(fresh.staleness) == [0, 0, 2] and abs(fresh.staleness_mean - 2 / 3) < 1e-9
    assert fresh.samples[0]["input_ids"] == sample([3, 5, 1])["input_ids"]     # context stays whole


def test_keep_fresh_with_nothing_left_is_empty_not_an_error():
    fresh = keep_fresh([sample([0])], version=9, max_staleness=1)
    assert fresh.samples == [] and fresh.dropped == 1 and fresh.staleness_mean == 0.0


def test_step_record_carries_the_batch_stats_and_times():
    batch = {"group_ids": ["g1", "g2"], "stats": {"reward_mean": 0.25, "episodes": 16, "token_ratio": 2.0,
                                                  "by_task": {"add": {"groups": 2}}, "unrelated": 1}}
    times = StepTimes(start=10.0, trained=10.5, published=12.0, done=12.25)
    record = step_record("policy", 7, 8, batch, Fresh([], 4, [1, 3]), {"loss": 0.1, "skipped": True},
                         times, publish_bytes=1234, push_s=None)
    assert record["step"] == 7 and record["weight_version"] == 8 and record["groups"] == 2
    assert record["train_s"] == 1.5 and record["publish_s"] == 0.25 and record["step_time_s"] == 2.25
    assert record["stale_tokens_dropped"] == 4 and record["staleness_mean"] == 2 and record["staleness_max"] == 3
    assert record["token_ratio"] == 2.0 and record["by_task"] == {"add": {"groups": 2}}
    assert "unrelated" not in record and "skipped" not in record and record["loss"] == 0.1
