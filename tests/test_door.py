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


@pytest.mark.slow
def test_many_outbound_runners_at_once_are_all_answered_and_every_lease_accounted_for(tmp_path):
    """40 runners asking the door at the same moment: their requests and results reach the
    registry in shared frames (proto.Batch) and come back to the right asker; every lease
    ends finished, none is lost, none is answered "registry busy"."""
    import asyncio
    import time

    import aiohttp

    import sim_runner

    from actorjet.config import normalize, tree_path
    from actorjet.models.prepare import prepare
    from actorjet.runtime.head import Head
    from actorjet.runtime.system import free_port
    from actorjet.runtime.tree_spec import load_tree

    job = prepare(normalize({"models": [{"name": "policy", "source": "tiny-arith", "eval_every": 10 ** 6}],
                             "train": {"group_size": 4, "groups_per_step": 64, "max_staleness": 1000, "steps": 10 ** 6}}))
    door_port = free_port()
    head = Head(tmp_path / "run", load_tree(tree_path("default.toml")), job, port=free_port(), door_port=door_port)
    head.start()
    try:
        door = f"http://127.0.0.1:{door_port}"          # one head, no node: the runners are this process
        deadline = time.time() + 60
        while not {"gateway", "learner"} <= set(head.status(timeout_s=30).get("services", {}).get("policy", {})):
            assert time.time() < deadline, "the model did not come up"
            time.sleep(0.2)
        seen = sim_runner.counters()

        async def main() -> None:
            async with aiohttp.ClientSession() as session:      # 4 groups each ("not ready" answers wait)
                give_up = time.time() + 60
                await asyncio.gather(*(sim_runner.run(session, door, head.token, f"sim-{k}",
                                                      lambda mine: mine < 4 and time.time() < give_up, seen)
                                       for k in range(40)))
        asyncio.run(main())
        assert seen["leases"] == 160 and seen["busy"] == 0 and seen["refused"] == 0, seen
        deadline = time.time() + 30
        while (g := head.status(timeout_s=30)["groups"])["finished"] < seen["leases"]:
            assert time.time() < deadline, g
            time.sleep(0.2)
        assert g["finished"] == g["issued"] == seen["leases"] and g["dropped"] == 0 and g["late_results_rejected"] == 0, g
    finally:
        head.stop()
