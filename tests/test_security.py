"""No one in without the token: actor frames are authenticated before they are unpickled.

The attack is real: a raw TCP client on its own host sends thespian-framed pickles whose
``__reduce__`` would create a canary file, to the head's admin port, to a joined member's port
and to an actor's port.  Nothing is unpickled (no canary), training goes on, and `status`
counts the frames.
"""
import json
import os
import pickle
import subprocess

import pytest

from actorjet import signing
from actorjet.runtime import frames
from jobs import tiny_arith
from swarm import REPO, wait_until


class Canary:
    """Unpickling this creates a file: proof that a frame reached pickle.loads."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def framed(payload: bytes) -> bytes:
    """thespian's TCP framing: ``LENGTH>`` then the bytes (streamBuffer.toSendBuffer)."""
    return b"%d>" % len(payload) + payload


def test_a_signed_frame_round_trips_and_any_other_is_dropped_unread(tmp_path):
    ours, theirs = frames.SignedPickle(signing.frame_key("a")), frames.SignedPickle(signing.frame_key("b"))
    assert ours.loads(ours.dumps({"x": [1, 2]})) == {"x": [1, 2]}
    canary = tmp_path / "canary"
    for frame in (pickle.dumps(Canary(canary)),                   # unsigned
                  theirs.dumps(Canary(canary)),                   # another cluster's key
                  b"\x00" * 32 + pickle.dumps(Canary(canary)),    # a forged tag
                  b"short"):
        assert ours.loads(frame) is frames.REJECTED
    flipped = bytearray(ours.dumps("hello"))
    flipped[-2] ^= 1
    assert ours.loads(bytes(flipped)) is frames.REJECTED
    assert ours.rejected == 5 and not canary.exists()
    assert signing.frame_key("a") != signing.frame_key("b") and len(signing.frame_key("a")) == 32


# the SDK's agent: its clients' lean transport (runner/llm.py) is what calls the https gateway here
JOB = tiny_arith(steps=400, behavior="agents.arithmetic:behavior")


def self_signed(tmp_path, ip: str):
    """A certificate for ``ip`` and its key (openssl, as an operator would make one)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate (.ci/run installs it)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "2", "-subj", f"/CN={ip}",
                    "-addext", f"subjectAltName=IP:{ip}"], check=True, capture_output=True)
    return cert, key


def ssl_trusting(cert):
    import ssl

    ctx = ssl.create_default_context()
    ctx.load_verify_locations(str(cert))
    return ctx


def test_rejected_frame_counts_of_gone_processes_fold_into_one_file(tmp_path):
    """A week of restarts must not leave one count file per process that ever dropped a frame."""
    folder = tmp_path / "security"
    folder.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()                                              # a PID nobody has now
    (folder / f"rejected.{gone.pid}").write_text("5")
    (folder / f"rejected.{os.getpid()}").write_text("2")    # this process, alive
    assert frames.rejected_on_node(tmp_path) == 7
    assert sorted(p.name for p in folder.glob("rejected.*")) == sorted([f"rejected.{os.getpid()}", "rejected.retired"])
    assert frames.rejected_on_node(tmp_path) == 7            # counted once, kept
    (folder / f"rejected.{os.getpid()}").write_text("3")
    assert frames.rejected_on_node(tmp_path) == 8


def test_tls_options_are_checked_before_anything_starts(tmp_path):
    import subprocess
    import sys

    cert, _ = self_signed(tmp_path, "10.9.8.7")      # only read by the CLI's checks: no host needed
    for extra, says in ((["--tls-cert", str(cert)], "go together"),
                        (["--tls-cert", str(cert), "--tls-key", str(tmp_path / "nope.pem")], "TLS files")):
        out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "start", "--run-dir", str(tmp_path / "r"),
                              "--port", "1", *extra], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_thespian_of_another_shape_is_refused_loudly(monkeypatch):
    monkeypatch.setattr(frames, "THESPIAN_VERSION", "0.0.0")
    with pytest.raises(RuntimeError, match="refusing to run unauthenticated"):
        frames._thespian_transport()


ATTACKER = """
import pickle, socket, sys
sys.path.insert(0, {tests!r})
from actorjet import signing
from actorjet.runtime import frames
from test_security import Canary, framed
envelope = ("sender", Canary({canary!r}))      # what thespian unpacks: (sender address, message)
other = frames.SignedPickle(signing.frame_key("another cluster's token"))
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    for frame in (framed(pickle.dumps(envelope)), framed(other.dumps(envelope))):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(frame)
            s.settimeout(2)
            try:
                s.recv(100)
            except OSError:
                pass
print("sent", 2 * (len(sys.argv) - 1))
"""


@pytest.mark.slow
@pytest.mark.netns
def test_across_hosts_no_frame_without_the_token_runs_and_gateways_speak_tls(swarm, network, tmp_path):
    """Each party on its own host: a head whose gateway serves HTTPS with a self-signed
    certificate, a member that trusts it (--tls-ca), a node with the wrong token, and an
    outsider who sends pickles (unsigned, and signed with another cluster's key) that would
    create a canary file to the head's admin port, the member's port and an actor's port."""
    import subprocess
    import sys

    import httpx2
    import openai

    head_host, member_host, intruder_host, outsider = (network.host(n) for n in ("head", "m", "x", "out"))
    cert, key = self_signed(tmp_path, head_host.ip)
    (tmp_path / "job.toml").write_text(JOB)
    _, port, token = swarm.head(tmp_path / "run", str(REPO / "supervisors" / "default.toml"), host=head_host,
                                extra=["--config", str(tmp_path / "job.toml"), "--tls-cert", str(cert),
                                       "--tls-key", str(key)])
    _, member_port = swarm.join(port, token, "m", slots=1, head_host=head_host.ip, host=member_host,
                                extra=["--tls-ca", str(cert)])
    status = lambda: swarm.ctl(head_host, "status", port)  # noqa: E731
    wait_until(lambda: status()["models"][0]["learner_step"] >= 2, 120, interval_s=0.5,
               what="2 learner steps, the member's runner calling the https gateway")
    url = status()["services"]["policy"]["gateway"]
    assert url.startswith(f"https://{head_host.ip}:")
    trusted = openai.OpenAI(base_url=url, api_key="listing-models-needs-no-key",
                            http_client=openai.DefaultHttpxClient(verify=ssl_trusting(cert)))
    assert [mdl.id for mdl in trusted.models.list()] == ["policy"]
    with pytest.raises(openai.APIConnectionError):            # the system's roots do not know it
        openai.OpenAI(base_url=url, api_key="x", max_retries=0).models.list()
    with pytest.raises(httpx2.HTTPError):                     # and plain http is not served
        httpx2.get(url.replace("https://", "http://") + "/models", timeout=5)

    intruder, _ = swarm.join(port, "not-the-token", "x", head_host=head_host.ip, host=intruder_host, wait=False)
    registry_port = swarm.ctl(head_host, "port", port, "registry")["port"]
    canary = tmp_path / "canary"
    script = ATTACKER.format(tests=str(REPO / "tests"), canary=str(canary))
    sent = subprocess.run(outsider.prefix + [sys.executable, "-c", script, f"{head_host.ip}:{port}",
                                             f"{member_host.ip}:{member_port}", f"{head_host.ip}:{registry_port}"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert sent.stdout.strip() == "sent 6", sent.stderr
    assert intruder.wait_exit(60) == 2 and "refused this node: wrong join token" in intruder.output, intruder.output
    data = wait_until(lambda: (s := status())["rejected_frames"] >= 6 and s, 20, interval_s=0.5,
                      what="the outsider's and the intruder's frames counted")
    nodes = {n["name"]: n for n in data["nodes"]}
    assert "x" not in nodes and nodes["m"]["rejected_frames"] >= 2 and nodes["head"]["rejected_frames"] >= 4, nodes
    assert not canary.exists(), "a frame was unpickled"
    before = data["models"][0]["learner_step"]
    wait_until(lambda: status()["models"][0]["learner_step"] >= before + 3, 120, interval_s=0.5,
               what="training going on after the attack")
    assert not canary.exists()
    text = (tmp_path / "run" / "logs" / "head" / "actors.log").read_text()
    assert f"dropped an unauthenticated frame from {outsider.ip}" in text
    assert token not in text and token not in json.dumps(data, default=str)     # the secret stays secret
