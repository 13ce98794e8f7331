"""Live code iteration during a real training run: upgrade, canary, rollback, bad payloads,
and replacing a whole node — training never stops and every episode names its code."""
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

import jobs
from swarm import REPO, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns]

JOB = jobs.tiny_arith(100000, group_size=4, groups_per_step=2, runner_concurrency=8)

# Each version of the behavior writes "TAG episode_id" to a log, so the test can check that
# the version an episode is labelled with is the code that really ran it.
BEHAVIOR = """
def behavior(task, llm):
    reply = llm.client().chat.completions.create(
        model=llm.model(), max_tokens=4, messages=[{{"role": "user", "content": task["question"]}}])
    with open({log!r}, "a") as f:
        f.write("{tag} " + llm.episode_id + "\\n")
    {extra}
    return float((reply.choices[0].message.content or "").strip() == task["answer"])
"""


def write_behavior(tmp_path, tag, extra="pass"):
    path = tmp_path / f"behavior_{tag}.py"
    path.write_text(textwrap.dedent(BEHAVIOR.format(log=str(tmp_path / "ran.log"), tag=tag, extra=extra)))
    return path


def cli(*args, run=None, env=None, host=None):
    """An `actorjet` command, on ``host`` (a network namespace) when given."""
    extra = ["--run-dir", str(run)] if run else []
    prefix = host.prefix if host is not None else []
    return subprocess.run(prefix + [sys.executable, "-m", "actorjet.cli.main", *args, *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


# Run on the head's host: uploads that are tampered with, signed with another key, or raw
# pickles, sent straight to the registry, are all refused unread.
TAMPER = """
import sys
import actorjet
from actorjet.behaviors import sign_upload
from actorjet.registry import protocol as proto
from actorjet.runtime.head import attach_root, lookup
port, token = int(sys.argv[1]), sys.argv[2]
asys, root = attach_root(port, token)
registry = lookup(asys, root, "registry")
good = sign_upload(token, "arithmetic", b"\\x80\\x04N.", "test")
flipped = dict(good, blob=b"\\x80\\x04X.")
for upload in (flipped, sign_upload("other-key", "arithmetic", b"\\x80\\x04N.", ""), b"\\x80\\x04N."):
    reply = asys.ask(registry, proto.Upgrade(upload), 10)
    assert isinstance(reply, proto.UpgradeReply) and not reply.ok and "refused" in reply.error, reply
print("all refused")
"""


def groups(run):
    path = run / "groups.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ran_tags(tmp_path):
    path = tmp_path / "ran.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(reversed(line.split()) for line in lines)       # episode id → tag


def check_labels(run, tmp_path, tag_of_version):
    """Every logged group names the version whose code ran all of its episodes."""
    tags = ran_tags(tmp_path)
    checked = 0
    for g in groups(run):
        want = tag_of_version.get(g["version"])          # v1 (the config's code) logs nothing
        for episode_id in g["rewards"]:
            assert tags.get(episode_id) == want, (g, tags.get(episode_id))
            checked += 1
    return checked


def test_upgrade_canary_rollback_and_node_replacement_during_training(swarm, network, tmp_path):
    """The head and each node on its own host (network namespace): code ships across hosts."""
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    run = tmp_path / "run"
    head, host_a, host_b = network.host("head"), network.host("a"), network.host("b")
    _, port, token = swarm.head(run, str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(job)])
    node_a, _ = swarm.join(port, token, "a", slots=2, head_host=head.ip, host=host_a)
    status = lambda: swarm.ctl(head, "status", port)  # noqa: E731
    steps = lambda: status()["models"][0]["learner_step"]  # noqa: E731
    wait_until(lambda: steps() >= 1, 90, interval_s=0.5, what="first learner step")

    # upgrade: v2 reaches both runners, and new groups are labelled v2 and ran v2's code
    out = cli("upgrade", "arithmetic", f"{write_behavior(tmp_path, 'A')}:behavior", run=run, host=head, env=swarm.env_of(head))
    assert out.returncode == 0, out.stderr
    assert "arithmetic v2 is live on 2 runners" in out.stdout
    # "live" means loaded: when the command returns, every placed runner reports v2 already
    placed = [r for r in status()["runners"] if r["node_id"] is not None]
    assert len(placed) == 2 and all(r["behaviors"].get("arithmetic") == 2 for r in placed), placed
    wait_until(lambda: any(g["version"] == 2 for g in groups(run)), 30, what="a v2 group")
    data = status()
    behavior = data["behaviors"][0]
    assert behavior["name"] == "arithmetic" and behavior["version"] == 2 and behavior["runners"] == 2
    assert [(v["version"], v["state"]) for v in behavior["versions"]] == [(1, "retired"), (2, "active")]

    # a canary that passes, then one whose episodes raise: refused with the traceback
    out = cli("upgrade", "arithmetic", f"{write_behavior(tmp_path, 'B')}:behavior", "--canary", "2", run=run, host=head, env=swarm.env_of(head))
    assert out.returncode == 0, out.stderr
    assert "arithmetic v3 is live" in out.stdout
    bad = write_behavior(tmp_path, "C", extra="1 / 0")
    out = cli("upgrade", "arithmetic", f"{bad}:behavior", "--canary", "2", run=run, host=head, env=swarm.env_of(head))
    assert out.returncode == 2
    assert "ZeroDivisionError" in out.stderr and "v3 keeps running" in out.stderr
    behavior = status()["behaviors"][0]
    assert behavior["version"] == 3 and behavior["versions"][-1]["state"] == "refused"

    # payloads that are tampered with, signed with another key, or raw pickles: refused unread
    out = head.run([sys.executable, "-c", TAMPER, str(port), token], env=swarm.env_of(head), cwd=REPO, timeout=60)
    assert out.returncode == 0 and "all refused" in out.stdout, out.stderr

    # rollback restores the code of the version before (v2, tag A)
    out = cli("rollback", "arithmetic", run=run, host=head, env=swarm.env_of(head))
    assert out.returncode == 0, out.stderr
    assert "arithmetic v2 is live" in out.stdout
    before = len(groups(run))
    wait_until(lambda: [g for g in groups(run)[before:] if g["version"] == 2], 30, what="v2 groups after rollback")

    # policy abort: episodes in flight on the old code are aborted (counted), not trained
    slow = write_behavior(tmp_path, "S", extra="import time; time.sleep(3)")
    assert cli("upgrade", "arithmetic", f"{slow}:behavior", run=run, host=head, env=swarm.env_of(head)).returncode == 0
    time.sleep(0.5)
    out = cli("upgrade", "arithmetic", f"{write_behavior(tmp_path, 'D')}:behavior", "--policy", "abort", run=run, host=head, env=swarm.env_of(head))
    assert out.returncode == 0, out.stderr
    wait_until(lambda: status()["aborted_by_cause"].get("upgrade abort", 0) >= 4, 10,
               what="in-flight v5 episodes aborted")

    # replace the whole node: training goes on
    step_before = steps()
    out = cli("leave", "--name", "a", env=swarm.env_of(host_a), host=host_a)
    assert out.returncode == 0, out.stderr
    node_a.wait_exit(30)
    swarm.join(port, token, "b", slots=2, head_host=head.ip, host=host_b)
    wait_until(lambda: steps() >= step_before + 2, 90, interval_s=0.5, what="learner steps after node swap")

    assert check_labels(run, tmp_path, {2: "A", 3: "B", 5: "S", 6: "D"}) > 0
    # the groups aborted in flight are never trained (v5 groups that finished before the abort
    # landed, when the upgrade command took longer than an episode, are trained as they should)
    with contextlib.closing(sqlite3.connect(run / "episodes-policy.sqlite", timeout=30)) as db:
        aborted = {e.rsplit(".", 1)[0] for (e,) in db.execute("SELECT episode_id FROM closed WHERE cause LIKE "
                                                              "'%upgrade abort%'")}
        trained = {g for (g,) in db.execute("SELECT group_id FROM groups WHERE trained_step IS NOT NULL")}
    assert aborted and not aborted & ({g["group_id"] for g in groups(run)} | trained), aborted
    data = status()
    causes = data["aborted_by_cause"]
    assert not any(c.startswith("behavior error") for c in causes), causes    # no swap failed an episode
    assert {"v2", "v3"} <= {tag.split("@")[1] for r in _train_rows(run) for tag in r.get("by_behavior", {})}


def test_user_mistakes_get_one_line_errors(swarm, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    run = tmp_path / "run"
    swarm.head(run, str(REPO / "supervisors" / "default.toml"), extra=["--config", str(job)])
    good = write_behavior(tmp_path, "A")
    broken = tmp_path / "broken.py"
    broken.write_text("def behavior(task, llm):\n    return (\n")
    unshippable = tmp_path / "unshippable.py"
    unshippable.write_text("import threading\nCACHE = threading.local()\n\n"
                           "def behavior(task, llm):\n    CACHE.x = 1\n    return 1.0\n")
    cases = [(["upgrade", "nosuchtask", f"{good}:behavior"], "no task named 'nosuchtask'"),
             (["upgrade", "arithmetic", str(good)], "expected FILE.py:FUNCTION"),
             (["upgrade", "arithmetic", f"{good}:missing"], "has no function 'missing'"),
             (["upgrade", "arithmetic", f"{broken}:behavior"], "failed to import"),
             (["upgrade", "arithmetic", f"{tmp_path}/nope.py:behavior"], "no such file"),
             (["upgrade", "arithmetic", f"{unshippable}:behavior"], "cannot be shipped to runners"),
             (["rollback", "arithmetic"], "no earlier version"),
             (["rollback", "arithmetic", "--token", "t0ken"], "refused this command: wrong token"),  # --token works
             (["rollback", "arithmetic", "--to", "7"], "has no version 7")]
    with ThreadPoolExecutor(3) as pool:           # independent refusals: none changes the head
        outs = list(pool.map(lambda case: cli(*case[0], run=run), cases))
    for (args, message), out in zip(cases, outs):
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert "Traceback (most recent call last)" not in out.stderr or "failed to import" in out.stderr


def _train_rows(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]
