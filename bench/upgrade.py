"""Live upgrades during a real training run: how fast new code reaches every runner.

    python bench/upgrade.py [--upgrades 10] [--nodes 2] [--slots 2]

A head trains tiny-arith while joined nodes run the arithmetic behavior; the head and each
node are their own host (a network namespace with its own address, tests/hosts.py; needs
root and `ip netns`), and the operator's side of the bench runs on the head's host, as
`actorjet upgrade` would.  The bench
alternates between two behaviors that format the prompt differently (``07+45=`` and
``7+45=``), ``--upgrades`` times, then rolls back once.  Each version writes a tag per
episode to a log, so the bench checks that every trained group was produced by the code
its version label names.  Prints a table and writes bench/results/upgrade.json.

Measured per upgrade:
  reach (client)    from sending the upgrade until `actorjet status` shows every live
                    runner on the new version (what `actorjet upgrade` waits for)
  reach (runners)   from the registry's activation until the last runner confirmed it
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import actorjet  # noqa: E402,F401
from actorjet.cli.behavior_cmds import pickle_behavior, send  # noqa: E402
from actorjet.behaviors import sign_upload  # noqa: E402
from actorjet.registry import protocol as proto  # noqa: E402
from actorjet.runtime.head import attach_root, status  # noqa: E402
import hosts  # noqa: E402
import jobs  # noqa: E402
from common import parse, table, write  # noqa: E402
from swarm import REPO, Swarm, wait_until  # noqa: E402

JOB = jobs.tiny_arith(100000, group_size=8, groups_per_step=4, runner_concurrency=8)

BEHAVIOR = """
def behavior(task, llm):
    question = task["question"]
    if {strip!r}:                                   # the prompt format this version uses
        a, b = question[:-1].split("+")
        question = f"{{int(a)}}+{{int(b)}}="
    reply = llm.client().chat.completions.create(
        model=llm.model(), max_tokens=4, messages=[{{"role": "user", "content": question}}])
    with open({log!r}, "a") as f:
        f.write("{tag} " + llm.episode_id + "\\n")
    return float((reply.choices[0].message.content or "").strip() == task["answer"])
"""


def behavior_file(tmp: Path, tag: str, strip: bool) -> Path:
    path = tmp / f"behavior_{tag}.py"
    path.write_text(textwrap.dedent(BEHAVIOR.format(strip=strip, log=str(tmp / "ran.log"), tag=tag)))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upgrades", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--dwell", type=float, default=2.0, help="seconds of training between upgrades")
    ap.add_argument("--operate", nargs=3, metavar=("PORT", "TOKEN", "TMP"), help=argparse.SUPPRESS)
    args = parse(ap, {"upgrades": 2, "nodes": 1, "slots": 1, "dwell": 0.5})
    if args.operate:          # the operator's half, on the head's host: JSON result on stdout
        port, token, tmp = args.operate
        print(json.dumps(operate(int(port), token, Path(tmp), args)))
        return
    why = hosts.unavailable()
    if why:
        sys.exit(f"bench/upgrade.py runs the head and nodes on their own hosts (network namespaces): {why}")
    print(f"hosts: head and {args.nodes} nodes each in their own network namespace (own address, own loopback)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        swarm, net = Swarm(tmp), hosts.Network()
        try:
            result = run(swarm, net, tmp, args)
        finally:
            swarm.cleanup()
            left = len(swarm.leftovers())
            net.close()
    result.update(leftover_processes=left, hosts="network namespaces")
    rows = [("upgrades", result["upgrades"], "10"),
            ("reach, client view (p50 / max)", f"{result['reach_client_s']['p50']:.3f} / "
             f"{result['reach_client_s']['max']:.3f} s", "<= 2 s"),
            ("reach, runner acks (p50 / max)", f"{result['reach_runners_s']['p50']:.3f} / "
             f"{result['reach_runners_s']['max']:.3f} s", "<= 2 s"),
            ("live runners", result["runners"], "-"),
            ("episodes failed by a swap", result["episodes_failed_by_swap"], "0"),
            ("groups checked: label = code that ran", f"{result['groups_label_ok']}/{result['groups_checked']}", "all"),
            ("rollback restored old code", result["rollback_restored"], "True"),
            ("bad payloads refused", f"{result['bad_payloads_refused']}/3", "3/3"),
            ("processes left after cleanup", result["leftover_processes"], "0"),
            ("learner steps during the bench", result["learner_steps"], "> 0")]
    table(rows, ("measure", "result", "target"))
    write("upgrade", result)
    if left:
        sys.exit(f"bench/upgrade.py: {left} processes outlived the bench")


def run(swarm: Swarm, net: hosts.Network, tmp: Path, args) -> dict:
    job = tmp / "job.toml"
    job.write_text(JOB)
    head = net.host("head")
    _, port, token = swarm.head(tmp / "run", str(REPO / "supervisors" / "default.toml"), host=head,
                                extra=["--config", str(job)])
    for i in range(args.nodes):
        swarm.join(port, token, f"node{i}", slots=args.slots, head_host=head.ip, host=net.host(f"node{i}"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--upgrades", str(args.upgrades), "--dwell", str(args.dwell),
           "--operate", str(port), token, str(tmp)]
    out = head.run(cmd, env=swarm.env_of(head), cwd=REPO, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(f"the operator's half failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    print("\n".join(line for line in out.stderr.splitlines() if line.startswith("upgrade ")))
    return json.loads(out.stdout.splitlines()[-1])


def operate(port: int, token: str, tmp: Path, args) -> dict:
    """Upgrades, a rollback and bad payloads against the head on this host; the checks."""
    run_dir = tmp / "run"
    get = lambda: status(*attach_root(port, token))  # noqa: E731
    wait_until(lambda: get()["models"][0]["learner_step"] >= 1, 120, interval_s=0.5, what="first learner step")
    step0 = get()["models"][0]["learner_step"]
    files = {"A": behavior_file(tmp, "A", False), "B": behavior_file(tmp, "B", True)}
    blobs = {tag: pickle_behavior(f"{path}:behavior") for tag, path in files.items()}
    tag_of_version: dict[int, str] = {}
    client_s = []
    for k in range(args.upgrades):
        tag = "AB"[k % 2]
        blob, source = blobs[tag]
        t0 = time.perf_counter()
        reply, took, behind = send(port, token, proto.Upgrade(sign_upload(token, "arithmetic", blob, source)), 30, 30)
        elapsed = time.perf_counter() - t0
        if not reply.ok or behind:
            raise RuntimeError(f"upgrade {k} failed: {reply.error or behind}")
        tag_of_version[reply.version] = tag
        client_s.append(elapsed)
        print(f"upgrade {k + 1}: v{reply.version} ({tag}) on {len(reply.runners)} runners in {elapsed:.3f} s",
              file=sys.stderr)
        time.sleep(args.dwell)
    # rollback to the version before, and check its code is what runs afterwards
    reply, _, behind = send(port, token, proto.Rollback("arithmetic"), 15, 30)
    rolled_to = reply.version
    log_lines = (tmp / "ran.log").read_text().count("\n")
    time.sleep(args.dwell)
    after = (tmp / "ran.log").read_text().splitlines()[log_lines:]
    rollback_restored = bool(reply.ok and after and all(line.split()[0] == tag_of_version[rolled_to]
                                                        for line in after[len(after) // 2:]))
    # bad payloads: tampered, other key, raw pickle
    asys, registry = _registry(port, token)
    good = sign_upload(token, "arithmetic", b"\x80\x04N.", "bench")
    refused = 0
    for upload in (dict(good, blob=b"\x80\x04X."), sign_upload("other", "arithmetic", b"\x80\x04N.", ""), b"\x80\x04N."):
        r = asys.ask(registry, proto.Upgrade(upload), 10)
        refused += int(isinstance(r, proto.UpgradeReply) and not r.ok)
    time.sleep(3)       # let the last groups finish
    data = get()
    pushes = [p for p in data["upgrades"] if p["version"] in tag_of_version]
    runner_s = [max(p["acked_s"].values()) for p in pushes if p["acked_s"]]
    checked, ok = check_labels(run_dir, tmp, tag_of_version)
    causes = data["aborted_by_cause"]
    return {
        "upgrades": len(client_s), "runners": len([r for r in data["runners"] if r.get("node_id")]),
        "reach_client_s": _summary(client_s), "reach_runners_s": _summary(runner_s),
        "episodes_failed_by_swap": sum(v for c, v in causes.items() if c.startswith(("behavior error", "upgrade"))),
        "aborted_by_cause": causes, "groups_checked": checked, "groups_label_ok": ok,
        "rollback_to": rolled_to, "rollback_restored": rollback_restored, "bad_payloads_refused": refused,
        "learner_steps": data["models"][0]["learner_step"] - step0,
        "targets": {"reach_s": "<= 2 (p50 and max)", "episodes_failed_by_swap": 0},
    }


def _registry(port: int, token: str):
    from actorjet.runtime.head import lookup
    asys, root = attach_root(port, token)
    return asys, lookup(asys, root, "registry")


def check_labels(run_dir: Path, tmp: Path, tag_of_version: dict) -> tuple[int, int]:
    """(groups checked, groups whose every episode ran the code its version label names)."""
    tags = dict(reversed(line.split()) for line in (tmp / "ran.log").read_text().splitlines())
    checked = ok = 0
    for line in (run_dir / "groups.jsonl").read_text().splitlines():
        group = json.loads(line)
        if group["version"] not in tag_of_version:
            continue
        checked += 1
        ok += all(tags.get(e) == tag_of_version[group["version"]] for e in group["rewards"])
    return checked, ok


def _summary(values: list[float]) -> dict:
    return {"p50": statistics.median(values), "max": max(values), "n": len(values)} if values else \
        {"p50": float("nan"), "max": float("nan"), "n": 0}


if __name__ == "__main__":
    main()
