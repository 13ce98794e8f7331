"""Behavior payloads are verified before anything is unpickled."""
import os
import pickle

import cloudpickle
import pytest

from actorjet.registry.behaviors import BehaviorRejected, load, sign


class _Boom:
    """Unpickling this writes a marker file: proof that a payload was (or was not) unpickled."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_signed_behavior_round_trips():
    payload = sign("secret", "agents.x:behavior", 3, cloudpickle.dumps(lambda task, llm: 0.5))
    assert load(payload, "secret")({}, None) == 0.5


@pytest.mark.parametrize("attack", ["flip a byte", "other key", "raw pickle", "forged version"])
def test_bad_payloads_are_refused_without_being_unpickled(tmp_path, attack):
    marker = tmp_path / "unpickled"
    blob = pickle.dumps(_Boom(str(marker)))
    payload = sign("secret", "b", 1, blob)
    if attack == "flip a byte":
        payload["blob"] = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    elif attack == "other key":
        payload = sign("another-cluster", "b", 1, blob)
    elif attack == "raw pickle":
        payload = blob
    else:
        payload["version"] = 2
    with pytest.raises(BehaviorRejected) as err:
        load(payload, "secret")
    assert str(err.value)
    assert not marker.exists()
    load(sign("secret", "b", 1, blob), "secret")       # the control: a valid one does unpickle
    assert marker.exists()
    os.remove(marker)


def test_a_node_without_a_secret_refuses_everything(monkeypatch):
    monkeypatch.delenv("ACTORJET_TOKEN", raising=False)
    with pytest.raises(BehaviorRejected, match="no cluster secret"):
        load(sign("s", "b", 1, cloudpickle.dumps(len)))
