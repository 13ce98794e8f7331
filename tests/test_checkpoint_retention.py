"""Checkpoint retention (models/checkpoint_retention.py): the newest N and the best M by
held-out accuracy are kept, the newest always."""
import json

import pytest

from actorjet.models.checkpoint_retention import prune, record_score, to_delete


@pytest.mark.parametrize("steps, scores, last, best, deleted", [
    ([10, 20, 30, 40], {}, 2, 1, [10, 20]),                              # no scores: the newest only
    ([10, 20, 30, 40], {10: 0.9, 20: 0.5, 40: 0.6}, 2, 1, [20]),         # 10 is the best
    ([10, 20, 30, 40], {10: 0.5, 20: 0.5}, 1, 1, [10, 30]),              # a tie: the later step
    ([10, 20, 30], {10: 0.9}, 0, 0, [10, 20]),                           # never fewer than the newest
    ([], {}, 3, 1, []),
    ([10, 20, 30, 40], {10: 0.9, 20: 0.8, 30: 0.1}, 1, 2, [30]),
])
def test_the_newest_and_the_best_are_kept(steps, scores, last, best, deleted):
    assert to_delete(steps, scores, last, best) == deleted


def test_prune_reads_the_scores_written_beside_each_checkpoint(tmp_path):
    for step in (2, 4, 6, 8):
        folder = tmp_path / f"step_{step:06d}"
        folder.mkdir()
        (folder / "state.json").write_text(json.dumps({"step": step}))
    record_score(tmp_path, 4, 0.8)
    record_score(tmp_path, 4, 0.6)          # two tasks: their mean, 0.7
    record_score(tmp_path, 6, 0.65)
    record_score(tmp_path, 5, 1.0)          # no checkpoint of step 5: nothing written
    assert json.loads((tmp_path / "step_000004" / "score.json").read_text()) == [0.8, 0.6]
    assert prune(tmp_path, keep_last=1, keep_best=1) == [2, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000004", "step_000008"]


def test_bad_keep_values_are_one_line_errors():
    from actorjet.config import normalize
    from actorjet.errors import UserError

    with pytest.raises(UserError, match="checkpoint_keep_last must be >= 1"):
        normalize({"models": [{"checkpoint_keep_last": 0}]})
    with pytest.raises(UserError, match="must be >= 1 .* and checkpoint_keep_best >= 0"):
        normalize({"models": [{"checkpoint_keep_best": -1}]})
