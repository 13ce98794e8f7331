"""`actorjet research ask`: a question in, a draft study out (actorjet/research/ask.py).

The grammar's four forms give valid studies (loaded back with the same checks as any spec);
nonsense gets one line that says what it can read; a scripted OpenAI-compatible planner's
draft is validated like any spec, and its bad drafts are refused with the reason.  The
catalogue is built from the job schema, so every field config.py accepts is in it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from actorjet import job_schema
from actorjet.config import MODEL_DEFAULTS, TRAIN_DEFAULTS, load_job
from actorjet.errors import UserError
from actorjet.research import ask
from actorjet.research.catalogue import catalogue, resolve
from actorjet.research.plan import check_budget, make_plan
from actorjet.research.study_spec import apply, load_study

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "agents" / "job.toml"


def drafted(question: str, tmp_path: Path, **kw) -> dict:
    out = tmp_path / "studies" / "q.toml"
    spec, how = ask.draft(question, JOB, out, **kw)
    out.write_text(ask.to_toml(spec, how, out))
    study = load_study(out)                 # the written draft passes the checks of any study …
    check_budget(study, make_plan(study))   # … and its budget fits its plan
    return study


@pytest.mark.parametrize("question,knob,rule,metric", [
    ("Does group size matter?", "train.group_size", {"int_uniform": [2, 32]}, {"kind": "final_accuracy"}),
    ("does the learning rate matter for learning speed", "models.policy.lr", {"log_uniform": [1e-6, 1e-2]},
     {"kind": "auc"}),
    ("best lr between 1e-5 and 1e-3", "models.policy.lr", {"log_uniform": [1e-5, 1e-3]}, {"kind": "final_accuracy"}),
    ("best clip between 0.3 and 0.1 for accuracy", "models.policy.clip", {"uniform": [0.1, 0.3]},
     {"kind": "final_accuracy"}),
    ("best merge between prefix and tree", "models.policy.merge", {"choice": ["prefix", "tree"]},
     {"kind": "final_accuracy"}),
    ("compare grpo, rloo and PPO on arithmetic by learning speed", "models.policy.algorithm",
     {"choice": ["grpo", "rloo", "ppo"]}, {"kind": "auc"}),
    ("compare GRPO vs reinforce++ on agents.arithmetic", "models.policy.algorithm",
     {"choice": ["grpo", "reinforce_pp"]}, {"kind": "final_accuracy"}),
    ("How does steps to 50% scale with max staleness?", "train.max_staleness", {"int_uniform": [0, 4]},
     {"kind": "steps_to", "threshold": 0.5}),
])
def test_each_grammar_form_drafts_a_valid_study(question, knob, rule, metric, tmp_path):
    study = drafted(question, tmp_path)
    assert list(study["knobs"]) == [knob]
    kind, values = next(iter(rule.items()))
    assert study["knobs"][knob]["kind"] == kind and study["knobs"][knob]["values"] == values
    assert {k: v for k, v in study["metric"].items() if v is not None} == metric
    assert study["question"] == question
    assert study["base_job"] == load_job(JOB)          # the base job by path, unchanged


@pytest.mark.parametrize("question,says", [
    ("what is the meaning of life", "ask one of: does KNOB matter"),
    ("", "ask a question"),
    ("does foo matter", "'foo' is no field of the job"),
    ("does gateway port matter", "not a learning knob"),
    ("best lr between 1e-3 and 1e-3", "the two ends are the same"),
    ("best lr between -1 and 1e-3", "makes an invalid job"),
    ("best group size between 1 and 1e9x", "is not a number"),
    ("compare grpo and ppx on arithmetic", "unknown: ppx"),
    ("compare grpo on arithmetic", "two or more algorithms"),
    ("compare grpo and ppo on chess", "no task 'chess'"),
    ("does lr matter for vibes", "no metric called 'vibes'"),
    ("how does steps to 150% scale with lr", "between 0% and 100%"),
])
def test_nonsense_is_refused_in_one_line(question, says, tmp_path):
    with pytest.raises(UserError) as e:
        ask.draft(question, JOB, tmp_path / "q.toml")
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "q.toml").exists()


def test_the_cli_writes_the_draft_or_says_why_not_in_one_line(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "actorjet.cli.main", "research", *a],  # noqa: E731
                                    cwd=tmp_path, capture_output=True, text=True, timeout=120)
    ok = run("ask", "does kl matter", "--base-job", str(JOB))
    assert ok.returncode == 0, ok.stderr
    out = tmp_path / "studies" / "ask-does-kl-matter.toml"
    assert out.is_file() and "wrote studies/ask-does-kl-matter.toml" in ok.stdout
    assert run("plan", str(out)).returncode == 0
    bad = run("ask", "tell me a joke", "--base-job", str(JOB))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    knobs = run("knobs", "--base-job", str(JOB))
    assert knobs.returncode == 0 and "models.policy.lr" in knobs.stdout and "learning rate" in knobs.stdout


class Planner:
    """A scripted OpenAI-compatible endpoint: answers every chat call with ``answer`` and keeps
    the prompts it was sent."""

    def __init__(self):
        self.answer, self.prompts = "", []
        planner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply({"object": "list", "data": [{"id": "planner-1", "object": "model", "created": 0,
                                                        "owned_by": "test"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                planner.prompts.append(body["messages"][-1]["content"])
                self.reply({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": planner.answer}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def planner():
    p = Planner()
    yield p
    p.server.shutdown()
    p.server.server_close()


def test_a_planners_draft_is_validated_like_any_study(planner, tmp_path):
    planner.answer = ("Here is the plan: " + json.dumps({
        "metric": {"kind": "steps_to", "threshold": 0.6},
        "knobs": {"models.policy.clip_high": {"uniform": [0.2, 0.35]}, "train.group_size": {"choice": [4, 8, 16]}},
        "explore_trials": 5, "why": "clip-higher keeps entropy up; smaller groups step faster"}))
    study = drafted("Does clip-higher help the quickstart learn faster?", tmp_path, planner=planner.url)
    assert set(study["knobs"]) == {"models.policy.clip_high", "train.group_size"}
    assert study["metric"] == {"kind": "steps_to", "threshold": 0.6} and study["explore"]["trials"] == 5
    text = (tmp_path / "studies" / "q.toml").read_text()
    assert "planner-1" in text and "clip-higher keeps entropy up" in text     # who drafted it, and why
    prompt = planner.prompts[-1]
    assert "Does clip-higher help" in prompt and "models.policy.lr" in prompt and "learning rate" in prompt


@pytest.mark.parametrize("answer,says", [
    ('{"knobs": {"models.policy.temperature": {"uniform": [0.5, 1.0]}}}', "has no field 'temperature'"),
    ('{"knobs": {"models.policy.lr": {"log_uniform": [-1, 1e-3]}}}', "log_uniform needs low > 0"),
    ('{"knobs": {"train.group_size": {"int_uniform": [0, 8]}}}', "makes an invalid job"),
    ('{"metric": {"kind": "vibes"}, "knobs": {"models.policy.lr": {"log_uniform": [1e-5, 1e-3]}}}',
     "metric.kind"),
    ("I would study the learning rate.", "not a JSON object"),
    ('{"why": "no knobs"}', "names no knobs"),
])
def test_a_planners_bad_draft_is_refused_with_its_reason(planner, answer, says, tmp_path):
    planner.answer = answer
    with pytest.raises(UserError) as e:
        ask.draft("anything", JOB, tmp_path / "q.toml", planner=planner.url)
    assert says in str(e.value) and "planner" in str(e.value) and "\n" not in str(e.value)


def test_a_planner_nobody_answers_at_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:       # a port nobody listens at
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match="did not answer"):
        ask.draft("anything", JOB, tmp_path / "q.toml", planner=f"http://127.0.0.1:{port}/v1")


def test_the_catalogue_is_the_job_schema_and_every_default_range_makes_valid_jobs():
    job = load_job(JOB)
    table = catalogue(job)
    assert set(MODEL_DEFAULTS) == set(job_schema.MODEL) and set(TRAIN_DEFAULTS) == set(job_schema.TRAIN)
    assert {p.rsplit(".", 1)[1] for p in table if p.startswith("models.policy.")} == set(MODEL_DEFAULTS)
    for path, entry in table.items():
        assert entry["meaning"].strip(), path
        rule = entry["explore"]
        if rule:
            kind, values = next(iter(rule.items()))
            for value in (values if kind == "choice" else values[:1] + values[-1:]):
                apply(job, {path: int(value) if kind == "int_uniform" else value})     # no UserError
    assert resolve(job, "learning rate") == "models.policy.lr" == resolve(job, "models.policy.lr")
    assert resolve(job, "the batch size") == "train.groups_per_step"
