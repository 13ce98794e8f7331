"""The outbound door's request checks (actors/door.py): every bad body is a 400 that names
the field, before anything reaches the registry."""
import pytest

from actorjet.actors.door import check_lease_ids, check_lease_request, check_results
from actorjet.serving.openai_api import ApiError


@pytest.mark.parametrize("check, body, field", [
    (check_lease_request, {}, "runner_id"),
    (check_lease_request, {"runner_id": "r", "max_groups": 0}, "max_groups"),
    (check_lease_request, {"runner_id": "r", "max_groups": True}, "max_groups"),
    (check_lease_request, {"runner_id": "r", "behaviors": {"a": "1"}}, "behaviors"),
    (check_results, {"runner_id": "r", "lease_id": "l", "results": []}, "results"),
    (check_results, {"runner_id": "r", "lease_id": "l", "results": [{"error": "x"}]}, "episode_id"),
    (check_results, {"runner_id": "r", "lease_id": "l", "results": [{"episode_id": "e", "error": 3}]}, "results"),
    (check_lease_ids, {"runner_id": "r"}, "lease_ids"),
    (check_lease_ids, {"runner_id": "r", "lease_ids": "l1"}, "lease_ids"),
    (check_lease_ids, {"runner_id": "r", "lease_ids": ["l1", ""]}, "lease_ids"),
    (check_lease_ids, {"runner_id": "r", "lease_ids": ["x"] * 5000}, "lease_ids"),
    (check_lease_ids, {"lease_ids": []}, "runner_id"),
])
def test_bad_bodies_are_400s_naming_the_field(check, body, field):
    with pytest.raises(ApiError) as caught:
        check(body)
    assert caught.value.status == 400 and caught.value.param == field, caught.value.message


def test_good_bodies_pass_through():
    assert check_lease_request({"runner_id": "r", "max_groups": 3, "behaviors": {"a": 2}}) == ("outbound:r", 3, {"a": 2})
    assert check_lease_ids({"runner_id": "r", "lease_ids": ["l1", "l2"]}) == ["l1", "l2"]
    result = check_results({"runner_id": "r", "lease_id": "l", "results": [
        {"episode_id": "e", "reward": 0.5}, {"episode_id": "f", "error": "boom"}]})
    assert result.runner_id == "outbound:r"       # done or failed; a reward is the stores' business
    assert result.results == [{"episode_id": "e"}, {"episode_id": "f", "error": "boom"}]
