"""Watching a swarm: `actorjet top` in a real terminal (tmux), the HTML report in headless
Chromium, TensorBoard event files read back with tensorboard's own reader."""
import base64
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from actorjet.monitor import metrics
from jobs import tiny_arith
from swarm import REPO, wait_until

JOB = tiny_arith(steps=60, groups_per_step=8, eval_every=20, train="tensorboard = true")


class Tmux:
    """A terminal of our own: a private tmux server (its own socket), killed at the end."""

    def __init__(self, name: str, env: dict):
        # the pane's size, not the COLUMNS / LINES a parent may have set (xdist's workers do)
        self.socket = f"aj-{name}-{os.getpid()}"
        self.env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              env=self.env, timeout=20).stdout

    def start(self, command: list[str]) -> None:
        self("new-session", "-d", "-s", "top", "-x", "220", "-y", "70", " ".join(map(str, command)))

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def keys(self, keys: str) -> None:
        self("send-keys", "-t", "top", keys)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", "top"], env=self.env,
                              capture_output=True).returncode == 0

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True)


def learner_step_on(screen: str) -> int | None:
    """The step column of the models table for `policy`."""
    match = re.search(r"policy\s*│\s*(\d+)\s*│", screen)
    return int(match.group(1)) if match else None


@pytest.mark.slow
def test_top_report_and_tensorboard_of_a_live_run(swarm, tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("no tmux (.ci/run installs it)")
    from actorjet.runtime.head import attach_root, status as head_status

    (tmp_path / "job.toml").write_text(JOB)
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=2,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    tmux = Tmux("top", dict(swarm.env, TERM="xterm-256color"))
    try:
        tmux.start([f"cd {REPO} &&", sys.executable, "-m", "actorjet.cli.main", "top", "--run-dir", run])
        try:
            first = wait_until(lambda: learner_step_on(tmux.screen()) is not None and learner_step_on(tmux.screen()),
                               120, interval_s=0.3, what="top showing the learner step")
        except AssertionError:
            print("top's screen:\n" + tmux.screen())
            raise
        wait_until(lambda: (learner_step_on(tmux.screen()) or 0) > first, 60, interval_s=0.3,
                   what="the step increasing on screen")
        assert "nodes" in tmux.screen() and "restarts in the last minute" in tmux.screen()

        tmux.keys("3")                                           # the runners panel
        wait_until(lambda: "episodes/s" in tmux.screen(), 5, what="the runners panel")
        runner = next(a for a in status()["actors"] if "/runners/" in a["path"])
        name = runner["path"].rsplit("/", 1)[1]
        os.kill(runner["pid"], signal.SIGKILL)
        killed = time.time()
        wait_until(lambda: re.search(rf"{name}\s*│[^\n]*│\s*1\s*│", tmux.screen()), 10, interval_s=0.1,
                   what="the killed runner shown restarted")
        shown_after = time.time() - killed
        tmux.keys("5")                                           # supervision
        wait_until(lambda: f"root/runners/{name}" in tmux.screen(), 5, what="the restart in the last minute")
        tmux.keys("q")
        wait_until(lambda: not tmux.alive(), 10, what="top to quit on q")
        print(f"top showed the runner's restart {shown_after:.2f} s after the SIGKILL")   # the figure

        tmux.start([f"cd {REPO} &&", sys.executable, "-m", "actorjet.cli.main", "top", "--head", "127.0.0.1:1",
                    "--token", "x"])
        wait_until(lambda: "unreachable" in tmux.screen(), 15, what="the unreachable head's one line")
        assert "Traceback" not in tmux.screen()
        tmux.keys("q")
        wait_until(lambda: not tmux.alive(), 10, what="top to quit")
    finally:
        tmux.close()

    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what="60 learner steps")
    swarm.cleanup()
    check_tensorboard(run)
    check_report(run, tmp_path)


def check_report(run, tmp_path):
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{not json\n")                                   # one malformed line: skipped, counted
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "report", str(run)], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    page = (run / "report.html").read_text()
    images = re.findall(r'<img class="plot" alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    titles = [html.unescape(t) for t, _ in images]
    for want in ("by learner step", "by wall-clock time", "step's time", "Throughput", "Faults"):
        assert any(want in t for t in titles), (want, titles)
    assert all(base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n" for _, png in images)
    assert "1 malformed" in page and "Traceback" not in page and "Error" not in page
    if shutil.which("chromium") is None:
        pytest.skip("no chromium to open the report in (.ci/run installs Debian's package)")
    shot = tmp_path / "report.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1100,2400", (run / "report.html").as_uri()],
                   capture_output=True, timeout=120)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] >= 2000 and pixels[..., :3].std() > 0.05    # a page with plots, not a blank one


def check_tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"policy/reward_mean", "policy/eval/arithmetic/accuracy", "swarm/episodes/completed"} <= set(scalars)
    steps = [e.step for e in events.Scalars("policy/reward_mean")]
    rows = [r for r in metrics.read(run) if r.get("kind") == "train"]
    assert steps == [r["step"] for r in rows]
    assert [e.value for e in events.Scalars("policy/reward_mean")] == pytest.approx([r["reward_mean"] for r in rows])


def test_malformed_metric_lines_are_skipped_and_counted(tmp_path):
    lines = [json.dumps({"kind": "train", "model": "m", "step": 1, "time": 1.0, "reward_mean": 0.5}),
             "{broken", "[1, 2]", "", json.dumps({"kind": "eval", "model": "m", "step": 1, "time": 2.0,
                                                   "accuracy": 0.25}),
             json.dumps({"kind": "train", "model": "m", "step": "two", "time": "later", "reward_mean": "x"}),
             '{"kind": "tra']   # the last: being written
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    rows, bad = metrics.read_counted(tmp_path)
    assert [r["kind"] for r in rows] == ["train", "eval", "train"] and bad == 2
    from actorjet.monitor import report

    page = report.build(tmp_path).read_text()      # the wrongly typed line is skipped as well
    assert "3 malformed" in page and "data:image/png;base64," in page


def test_top_says_when_the_head_is_gone_and_comes_back_with_it():
    """The poller behind `top` against a door that stops and starts again on the same port."""
    from aiohttp import web

    from actorjet.cli.top import Poller, screen
    from actorjet.serving.serve import AppServer

    async def status(request):
        if request.headers.get("Authorization") != "Bearer t":
            return web.json_response({}, status=401)
        return web.json_response({"status": {"watchdog": "training", "episodes": {"completed": 3}}, "errors": []})

    def door():
        app = web.Application()
        app.router.add_get("/v1/actorjet/status", status)
        return app

    server = AppServer(door(), host="127.0.0.1")
    port = server.port
    poller = Poller(server.url, "t")
    assert poller.poll()["status"]["watchdog"] == "training"
    server.stop()
    assert poller.poll() is None and "unreachable" in poller.error
    assert "unreachable" in str(screen(None, poller, "overview").renderables[0])
    server = AppServer(door(), host="127.0.0.1", port=port)
    try:
        assert poller.poll()["status"]["episodes"]["completed"] == 3 and poller.error == ""
        assert Poller(server.url, "wrong").poll() is None
    finally:
        server.stop()


def test_the_metrics_follower_parses_only_new_whole_lines_and_agrees_with_a_full_read(tmp_path):
    follower = metrics.Follower(tmp_path)
    assert follower.read() == []                                   # no file yet
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "tr')     # the second line is being written
    assert [r["step"] for r in follower.read()] == [1]
    with open(path, "a") as f:
        f.write('ain", "step": 2}\n[1, 2]\n{not json\n{"kind": "eval", "step": 2}\n')
    assert follower.read() == metrics.read(tmp_path) and len(follower.rows) == 3
    assert follower.read() == metrics.read(tmp_path)                # nothing new: the same rows


def test_a_timeline_line_gives_back_every_stage_to_the_millisecond_in_a_third_of_the_bytes():
    """The step timeline's line holds each stage as milliseconds after one base time: read
    back (monitor/timeline.py), every stage is within a millisecond of what the store saw,
    their order is kept, and a line written before (Unix seconds in full) still reads."""
    import random

    from actorjet.monitor import timeline
    from actorjet.rl.step import StepTimes, timeline_record

    rng, start = random.Random(0), 1796495124.78961
    rows = []
    for g in range(32):
        complete = start + 0.3 + rng.random()
        for k in range(8):
            first = start + rng.random() * 0.2
            answer = first + rng.random() * 0.1
            rows.append((f"g1_{g}.{k}", start, first, answer, min(complete, answer + 0.05), complete, complete + 0.1))
    rows[3] = (rows[3][0], start, None, None, *rows[3][4:])               # a gateway restarted meanwhile
    times = StepTimes(start=0.0, trained=1.0, published=1.2, done=1.25, wall=start + 2)
    line = timeline_record("policy", 1, 1, {"timeline": rows, "stats": {"created": start + 1.9}}, times)
    served = {"kind": "served", "model": "policy", "weight_version": 1, "time": start + 3.5}
    (step,) = timeline.steps([line, served])
    stages = ("leased", "first_call", "last_answer", "stored", "complete", "taken")
    for row, e in zip(rows, step.episodes):
        for name, t in zip(stages, row[1:]):
            assert (e[name] is None) if t is None else abs(e[name] - t) <= 0.001, (name, e[name], t)
    assert timeline.problems(step) == ["g1_0.3: no first_call, last_answer"]
    full = dict(line, episodes=[[r[0], *(None if t is None else round(t, 4) for t in r[1:])] for r in rows])
    del full["t0"]
    assert len(json.dumps(line)) < 0.5 * len(json.dumps(full))
    (old,) = timeline.steps([full, served])
    assert all(abs(a[name] - b[name]) <= 0.001 for a, b in zip(old.episodes, step.episodes)
               for name in stages if a[name] is not None)
