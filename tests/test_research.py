"""`actorjet research`: a study spec is checked before anything runs, a study of real trials
runs unattended through its stages, survives a SIGKILL of its controller (no finished trial
runs twice, the trial in flight is stopped and re-run), a crashing trial is retried once and
recorded failed, and the report comes from the registry alone."""
import json
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from actorjet.errors import UserError
from actorjet.monitor import metrics
from actorjet.research import planner
from actorjet.research.plan import check_budget, make_plan
from actorjet.research.study_db import StudyRegistry
from actorjet.research.study_spec import check_study
from actorjet.research.stats import diff_ci, mean_ci, t_quantile
from actorjet.runtime import system
from swarm import REPO, Proc, existing, wait_until

BASE = {"models": [{"name": "policy", "source": "tiny-arith", "eval_every": 2, "checkpoint_every": 1000}],
        "tasks": [{"name": "arithmetic", "source": "agents.arithmetic", "behavior": "agents.arithmetic:behavior"}],
        "train": {"group_size": 4, "groups_per_step": 4, "steps": 4}}
LR = {"log_uniform": [1e-5, 1e-2]}


def runs_a_trial(p: psutil.Process) -> bool:
    """Whether ``p`` is alive and a research trial (it may exit while we look)."""
    try:
        return system.still_running(p) and "actorjet.research.trial" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def study(**over):
    data = {"question": "does lr matter?", "base_job": BASE, "knobs": {"models.policy.lr": LR},
            "budget": {"max_trials": 20, "max_wall_s": 900}}
    data.update(over)
    return data


@pytest.mark.parametrize("over,message", [
    ({"knobs": {"models.policy.lrr": LR}}, "knobs.models.policy.lrr': model 'policy' has no field 'lrr'"),
    ({"knobs": {"train.bogus": LR}}, "[train] has no field 'bogus'"),
    ({"knobs": {"lr": LR}}, "a knob is train.FIELD, models.NAME.FIELD or tasks.NAME.FIELD"),
    ({"knobs": {"train.groups_per_step": {"int_uniform": [0, 4]}}}, "0 makes an invalid job"),
    ({"knobs": {"models.policy.lr": {"log_uniform": [0, 1]}}}, "log_uniform needs low > 0"),
    ({"knobs": {}}, "name at least one knob"),
    ({"metric": {"kind": "steps_to"}}, "steps_to needs an accuracy threshold"),
    ({"metric": {"kind": "loss"}}, "one of final_accuracy, auc, steps_to"),
    ({"budget": {"max_trials": 0}}, "budget.max_trials' must be a positive integer"),
    ({"budget": {"max_wall_s": float("nan")}}, "budget.max_wall_s' must be a positive number"),
    ({"knobs": {"models.policy.lr": {"uniform": [0.0, float("inf")]}}}, "uniform must be [low, high]"),
    ({"colour": "blue"}, "unknown field 'colour'"),
    ({"question": ""}, "field 'question'"),
    ({"trials": {"hots": "10.0.0.5"}}, "unknown field 'trials.hots'"),
    ({"trials": {"port": 1900}}, "field 'trials.token_file': nodes joined to a fixed trials.port need"),
    ({"trials": {"port": "1900"}}, "field 'trials.port' must be int"),
    ({"trials": {"port": 10**9, "token_file": "x"}}, "field 'trials.port' is out of range"),
    ({"trials": {"slots": True}}, "field 'trials.slots' must be int"),
    ({"trials": {"host": " "}}, "field 'trials.host' is empty"),
    ({"trials": {"token_file": "no-such.token"}}, "field 'trials.token_file': no file at"),
])
def test_study_mistakes_name_the_field(over, message):
    with pytest.raises(UserError) as e:
        check_study(study(**over), "s.toml")
    assert message in str(e.value) and str(e.value).startswith("s.toml: ")


def test_split_less_task_sources_are_refused_by_a_study(tmp_path, monkeypatch):
    (tmp_path / "onesplit.py").write_text("from actorjet_agents.arithmetic import tasks, messages, score\n"
                                          "def eval_tasks():\n    return [{'question': '1+1=', 'answer': '2'}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = dict(BASE, tasks=[dict(BASE["tasks"][0], source="onesplit")])
    with pytest.raises(UserError, match="onesplit.eval_tasks has no 'test' split"):
        check_study(study(base_job=base), "s.toml")


@pytest.mark.parametrize("df,expected", [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)])
def test_t_quantiles_match_the_printed_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-3)


def test_three_seeds_need_a_clear_separation_before_a_difference_is_called():
    # bench/research.py's second run: a null knob, 3 seeds each side, a gap of 0.011 with seed
    # spreads of 0.005 (d = 2.2).  The percentile bootstrap excluded 0; Welch's interval (what
    # decides) must not.
    a, b = [0.761, 0.766, 0.771], [0.750, 0.755, 0.760]
    d = diff_ci(a, b)
    assert d["boot_low"] > 0 and d["low"] < 0 < d["high"] and not d["detectable"]
    assert diff_ci([0.80, 0.81, 0.82], [0.70, 0.71, 0.72])["detectable"]           # a real gap is still seen
    mean, low, high = mean_ci([0.70, 0.72, 0.71])
    assert mean == pytest.approx(0.71) and high - mean == pytest.approx(4.303 * 0.01 / 3 ** 0.5, rel=1e-3)


def test_ablation_compares_with_the_baseline_stage_when_confirm_had_nothing_to_run(tmp_path):
    """The base config won explore, so confirm ran nothing: the ablated knob is compared with
    the baseline stage's trials (same config, test split), never with an empty arm."""
    from actorjet.research.controller import Controller

    knobs = {"models.policy.lr": LR, "models.policy.checkpoint_every": {"choice": [1000, 5]}}
    spec = check_study(study(knobs=knobs, seeds={"baseline": 3, "ablate": 3}), "s.toml")
    c = Controller(spec, tmp_path, say=lambda *_: None)
    finished = {("baseline", "baseline"): [0.70, 0.71, 0.72],
                ("ablate", "models.policy.checkpoint_every = 5"): [0.705, 0.715, 0.71]}
    for (stage, arm), values in finished.items():
        for seed, value in zip(c.plan["seeds"][stage], values):
            c.reg.update(c.reg.add_trial(stage, arm, seed, {}, {}), state="done", metric=value, attempts=1)
    c._stage_ablate({k: v["base"] for k, v in c.study["knobs"].items()}, adopted=False)
    texts = [d["text"] for d in c.reg.decisions() if d["stage"] == "ablate"]
    assert any("checkpoint_every: no detectable difference" in t and "n = 3 vs 3" in t for t in texts), texts
    assert any("lr: nothing to vary it to" in t for t in texts), texts
    # the report, from this registry alone: knob importance from the ablation and from the
    # finished explore trials (lr explains the metric; checkpoint_every does not)
    from actorjet.research import study_report

    for i, (lr, every, value) in enumerate([(1e-5, 1000, 0.60), (1e-4, 5, 0.75), (1e-3, 1000, 0.10),
                                            (3e-4, 5, 0.50)]):
        params = {"models.policy.lr": lr, "models.policy.checkpoint_every": every}
        tid = c.reg.add_trial("explore", f"t{i}", 2000, params, {})
        c.reg.update(tid, state="done", metric=value, attempts=1, evals=[[4, value]])
    study_report.build(tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["knob_importance"]["models.policy.lr"] > results["knob_importance"]["models.policy.checkpoint_every"]
    assert (tmp_path / "importance.png").stat().st_size > 10_000
    assert "## Knob importance" in (tmp_path / "report.md").read_text()


def test_plan_counts_trials_refuses_a_small_budget_and_a_directory_of_another_spec(tmp_path):
    spec = check_study(study(seeds={"baseline": 3, "confirm": 3, "ablate": 2}, explore={"trials": 6}), "s.toml")
    plan = make_plan(spec)
    assert plan["trials_at_most"] == 3 + 6 + 6 + 2
    with pytest.raises(UserError, match="needs up to 17 trials but budget.max_trials is 10"):
        check_budget(dict(spec, budget=dict(spec["budget"], max_trials=10)), plan)
    assert StudyRegistry(tmp_path).bind(spec, plan) is True and StudyRegistry(tmp_path).bind(spec, plan) is False
    other = check_study(study(question="another question"), "t.toml")
    with pytest.raises(UserError, match="holds a study of another spec"):
        StudyRegistry(tmp_path).bind(other, plan)
    (tmp_path / "bad.toml").write_text('question = "q"\nbase_job = "nowhere.toml"\n[knobs."train.steps"]\nchoice = [1]\n')
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "research", "plan", str(tmp_path / "bad.toml")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "field 'base_job': no job config at" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_planner_proposal_may_only_narrow_the_spec():
    spec = check_study(study(knobs={"models.policy.lr": LR, "models.policy.checkpoint_every": {"choice": [5, 1000]}}), "s")
    knobs = planner.validate(spec, {"knobs": {"models.policy.lr": {"log_uniform": [1e-4, 1e-3]}}})
    assert knobs["models.policy.lr"]["values"] == [1e-4, 1e-3] and knobs["models.policy.checkpoint_every"]["values"] == [5, 1000]
    for bad, why in [({"knobs": {"models.policy.lr": {"log_uniform": [1e-6, 1e-3]}}}, "not inside the spec's"),
                     ({"knobs": {"models.policy.lr": {"uniform": [1e-4, 1e-3]}}}, "instead of the spec's"),
                     ({"knobs": {"train.kl": {"uniform": [0, 1]}}}, "not one of the spec's"),
                     ({"knobs": {"models.policy.checkpoint_every": {"choice": [7]}}}, "outside the spec's"),
                     ({"ranges": {}}, "non-empty 'knobs'")]:
        with pytest.raises(ValueError, match=why):
            planner.validate(spec, bad)


class ScriptedPlanner(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that always proposes a knob the spec does not have."""
    asked = 0

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        ScriptedPlanner.asked += 1
        content = json.dumps({"knobs": {"train.kl": {"uniform": [0.0, 0.1]}}, "why": "KL will help"})
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def toml(data: dict) -> str:
    """Just enough TOML for these specs (tables of scalars, lists and arrays of tables)."""
    def value(v):
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()
    lines = []
    for k, v in data.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {value(v)}")
    for k, v in data.items():
        if isinstance(v, dict) and k != "base_job" and k != "knobs":
            lines += [f"[{k}]"] + [f"{kk} = {value(vv)}" for kk, vv in v.items()]
    for name, rule in data["knobs"].items():
        lines += [f'[knobs."{name}"]'] + [f"{kk} = {value(vv)}" for kk, vv in rule.items()]
    for section in ("models", "tasks"):
        for item in data["base_job"][section]:
            lines += [f"[[base_job.{section}]]"] + [f"{kk} = {value(vv)}" for kk, vv in item.items()]
    lines += ["[base_job.train]"] + [f"{kk} = {value(vv)}" for kk, vv in data["base_job"]["train"].items()]
    return "\n".join(lines) + "\n"


def trials(study_dir):
    db = sqlite3.connect(study_dir / "study.sqlite")
    return db.execute("SELECT stage, arm, seed, state, attempts, log_tail FROM trials ORDER BY id").fetchall()


def research(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "actorjet.cli.main", "research", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_the_trial_server_forks_each_trial_into_its_own_log_and_reports_how_it_ended(tmp_path):
    """research/trial_server.py through runtime/forks.py: a trial is forked (no import of its
    own), writes its own trial.log, and its exit status comes back as Popen's would; the server
    ends with its pipe.  (A whole study through it, killed and resumed: the test below; a
    swarm node's trials: tests/test_research_swarm.py.)"""
    from actorjet.research import processes
    from actorjet.runner.trial_runs import TRIAL_SERVER
    from actorjet.runtime.forks import ForkServer

    server = ForkServer(TRIAL_SERVER, tmp_path / "trials")
    runs = []
    for name, job in (("0001-bad", {"models": []}), ("0002-worse", {})):
        run = tmp_path / "trials" / name
        run.mkdir(parents=True)
        (run / "job.json").write_text(json.dumps(job))
        runs.append(run)
    try:
        first = server.start(runs[0])
        second = server.start(runs[1])
        assert first.pid != second.pid and server.pid not in (first.pid, second.pid)
        assert server.pid in processes.strays(tmp_path / "trials")     # a study's processes name its folder
        assert first.wait(60) == 1 and second.wait(60) == 1             # neither job can run: exit status 1
        assert first.poll() == 1 and first.returncode == 1
        assert "KeyError: 'tasks'" in (runs[0] / "trial.log").read_text()
        assert "KeyError: 'models'" in (runs[1] / "trial.log").read_text()
        server_proc = psutil.Process(server.pid)
    finally:
        server.close()
    assert not server_proc.is_running() and server.pid is None


@pytest.mark.long(minutes=2)
@pytest.mark.slow
def test_a_study_runs_its_stages_and_resumes_after_its_controller_is_killed(tmp_path):
    spec = tmp_path / "mini.toml"
    spec.write_text(toml(study(seeds={"baseline": 2, "confirm": 2, "ablate": 2}, explore={"trials": 2},
                               budget={"max_trials": 20, "max_wall_s": 1200, "parallel": 2})))
    out = tmp_path / "study"
    first = research("run", str(spec), "--dir", str(out), start_new_session=True)

    def early() -> list[int]:
        """Trials running and not yet past their first step: a trial takes seconds, and one about
        to end may be gone (reaped by the trial server) before the controller records it."""
        db = sqlite3.connect(out / "study.sqlite")
        running = db.execute("SELECT pid, run_dir FROM trials WHERE state = 'running'").fetchall()
        return [pid for pid, run_dir in running if pid and psutil.pid_exists(pid) and
                max([r["step"] for r in metrics.read(run_dir) if r.get("kind") == "train"], default=0) < 1]
    try:
        # kill it while a trial runs and after another finished
        wait_until(lambda: (out / "study.sqlite").exists() and
                   [s for _, _, _, s, _, _ in trials(out)].count("done") >= 1 and early(), 300, interval_s=0.2,
                   what="one trial done and one running")
        orphans = early()
        done_before = {(a, b, c) for a, b, c, s, _, _ in trials(out) if s == "done"}
        first.kill()
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    assert orphans and all(psutil.pid_exists(p) for p in orphans)         # its trials outlive it...
    again = research("run", str(spec), "--dir", str(out))
    text, _ = again.communicate(timeout=900)
    assert again.returncode == 0, text
    assert "was in flight when the controller stopped: it runs again" in text
    assert not any(runs_a_trial(p) for p in existing(orphans))             # ...until the resume stops them
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not left, f"processes of this study outlived it: {left}"        # (a trial's actor system once did)
    rows = trials(out)
    keys = [(a, b, c) for a, b, c, _, _, _ in rows]
    assert len(keys) == len(set(keys))                                   # each trial once in the registry
    assert done_before <= {(a, b, c) for a, b, c, s, _, _ in rows if s == "done"}
    assert {s for _, _, _, s, _, _ in rows} <= {"done", "pruned"}
    stages = [a for a, _, _, _, _, _ in rows]
    assert stages.count("baseline") == 2 and stages.count("explore") == 2
    results = json.loads((out / "results.json").read_text())
    assert [d["stage"] for d in results["decisions"]][:3] == ["baseline", "explore", "confirm"]
    assert results["conclusion"].startswith("confirm: ")
    report = (out / "report.md").read_text()
    assert "**Conclusion.** confirm: " in report and (out / "curves.png").exists()
    status = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "research", "status", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert status.returncode == 0 and "decided: baseline" in status.stdout
    # explore selected on the validation split; every other stage was measured on test
    db = sqlite3.connect(out / "study.sqlite")
    for stage, run_dir in db.execute("SELECT stage, run_dir FROM trials WHERE state = 'done'"):
        evals = [r for r in map(json.loads, open(f"{run_dir}/metrics.jsonl")) if r.get("kind") == "eval"]
        assert evals and {r["split"] for r in evals} == {"validation" if stage == "explore" else "test"}, stage


@pytest.mark.slow
def test_a_crashing_trial_is_retried_once_then_recorded_failed_and_a_bad_planner_is_overruled(tmp_path):
    server = ThreadingHTTPServer(("localhost", 0), ScriptedPlanner)    # the planner: this process only
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = tmp_path / "crash.toml"
    spec.write_text(toml(study(knobs={"tasks.arithmetic.behavior": {"choice": ["agents.arithmetic:missing"]}},
                               seeds={"baseline": 1, "confirm": 1, "ablate": 1}, explore={"trials": 1},
                               planner={"kind": "llm", "base_url": f"http://localhost:{server.server_port}/v1",
                                        "model": "scripted"})))
    out = tmp_path / "study"
    try:
        run = research("run", str(spec), "--dir", str(out))
        text, _ = run.communicate(timeout=600)
    finally:
        server.shutdown()
    assert run.returncode == 0, text
    rows = trials(out)
    (explore,) = [r for r in rows if r[0] == "explore"]
    assert explore[3:5] == ("failed", 2) and "missing" in explore[5]
    assert [r[3] for r in rows if r[0] == "baseline"] == ["done"]
    report = (out / "report.md").read_text()
    assert "explore: no trial finished" in report and "nothing to confirm" in report
    # the planner's invalid proposal was rejected with its reason, and the playbook ran
    assert ScriptedPlanner.asked == 1
    assert "planner: proposal rejected (knob 'train.kl' is not one of the spec's" in report


@pytest.mark.slow
def test_trials_run_on_a_head_the_user_names_with_a_node_joined_once(swarm, network, tmp_path):
    """[trials] host/port/token_file: each trial's head comes up at HOST:PORT with one token,
    so a node joined once from another host is re-admitted by every trial and runs all the
    episodes (the trial heads have no runner slots of their own)."""
    import secrets

    from swarm import free_port

    head, alpha = network.host("head"), network.host("alpha")
    port = free_port()
    swarm.ports += [port, port + 1]
    (tmp_path / "swarm.token").write_text(secrets.token_hex(16) + "\n")
    token = (tmp_path / "swarm.token").read_text().strip()
    spec = tmp_path / "named.toml"
    spec.write_text(toml(study(seeds={"baseline": 1, "explore": 1}, explore={"trials": 1},
                               trials={"host": head.ip, "port": port, "token_file": "swarm.token", "slots": 0})))
    out = tmp_path / "study"
    controller = Proc(["research", "run", str(spec), "--dir", str(out)], swarm.env_of(head), prefix=head.prefix)
    swarm.procs.append(controller)
    wait_until(lambda: any((out / "trials").glob("*/head.json")), 300, interval_s=0.5, what="the first trial's head")
    node, _ = swarm.join(port, token, "alpha", slots=1, head_host=head.ip, host=alpha)
    assert controller.wait_exit(600) == 0, controller.output
    rows = trials(out)
    assert [(stage, state) for stage, _, _, state, _, _ in rows] == [("baseline", "done"), ("explore", "done")]
    for run_dir in sorted((out / "trials").iterdir()):
        assert json.loads((run_dir / "head.json").read_text())["port"] == port
    node.wait_for("re-admitted by the head", 10)        # the second trial's head took the node back
