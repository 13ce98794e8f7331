"""Tree files: valid ones load as data, every mistake names file, line and field."""
import subprocess
import sys

import pytest

from actorjet.errors import UserError
from actorjet.runtime.tree_spec import ChildSpec, find, load_tree, parse_tree
from swarm import REPO

GOOD = """
id = "root"
strategy = "one_for_one"
max_restarts = 3
period_s = 5

[[children]]
id = "registry"
kind = "registry"
registry = true

[[children]]
id = "model.policy"
kind = "supervisor"
strategy = "rest_for_one"
args = { model = "policy" }
  [[children.children]]
  id = "p1"
  kind = "probe"
  restart = "transient"
"""


def test_a_good_tree_loads_and_round_trips():
    spec = parse_tree(GOOD, "good.toml")
    assert [c.id for c in spec.children] == ["registry", "model.policy"]
    sub = find(spec, "model.policy")
    assert sub.strategy == "rest_for_one" and sub.args == {"model": "policy"}
    assert find(spec, "model.policy/p1").restart == "transient"
    assert ChildSpec.from_dict(spec.to_dict()) == spec
    assert spec.kinds() == {"supervisor", "registry", "probe"}      # what a head preloads before forking


def test_preloading_imports_each_kinds_module_and_leaves_a_broken_one_to_its_actor():
    """A head imports its actors' modules once, before thespian forks them (runtime/kinds.py)."""
    code = ("import sys; from actorjet.runtime import kinds; "
            "kinds.preload(['probe', 'no_such_module:Actor', 'runner']); "
            "print('actorjet.runtime.probe' in sys.modules, 'actorjet.actors.runner' in sys.modules, "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.split() == ["True", "True", "False"], out.stderr    # a runner needs no torch


@pytest.mark.parametrize("text,expected", [
    ('id = "root"\n[[children]]\nid = "x"\nkind = "nope"\n', "t.toml:4: field 'kind': unknown actor kind 'nope'"),
    ('id = "root"\n[[children]]\nid = "merger"\nkind = "merger"\n',      # a tree written before issue 14
     "t.toml:4: field 'kind': actor kind 'merger' no longer exists"),
    ('id = "root"\n[[children]]\nid = "x"\nkind = "probe"\nrestart = "sometimes"\n',
     "t.toml:5: field 'restart': must be one of permanent"),
    ('id = "root"\nstrategy = "all_for_one"\n', "t.toml:2: field 'strategy'"),
    ('id = "root"\nmax_restarts = -1\n', "t.toml:2: field 'max_restarts': must be a number >= 0"),
    ('id = "root"\n[[children]]\nid = "x"\nkind = "probe"\nrestrat = "permanent"\n',
     "t.toml:5: field 'restrat': unknown field"),
    ('id = "root"\n[[children]]\nid = "x"\nkind = "probe"\n[[children]]\nid = "x"\nkind = "probe"\n',
     "field 'id': duplicate child id 'x'"),
    ('id = "root"\n[[children]\nid = "x"\n', "t.toml: malformed TOML"),
    ('id = "root"\n[[children]]\nkind = "probe"\n', "field 'id': every child needs a string id"),
    ('id = "root"\n[[children]]\nid = "registry"\nkind = "registry"\n',
     "t.toml:4: field 'kind': the registry child needs `registry = true`"),
    ('id = "root"\n[[children]]\nid = "a"\nkind = "registry"\nregistry = true\n[[children]]\nid = "b"\n'
     'kind = "probe"\nregistry = true\n', "field 'registry': only one child may be the registry"),
    ('id = "root"\n[[children]]\nid = "r"\nkind = "supervisor"\nstrategy = "simple_one_for_one"\n',
     "field 'child_kind': simple_one_for_one needs child_kind"),
    ('id = "root"\n[[children]]\nid = "r"\nkind = "supervisor"\nstrategy = "simple_one_for_one"\n'
     'child_kind = "warp"\n', "t.toml:6: field 'child_kind': unknown actor kind 'warp'"),
    ('id = "root"\n[[children]]\nid = "r"\nkind = "supervisor"\nstrategy = "simple_one_for_one"\n'
     'child_kind = "runner"\ncount = -1\n', "field 'count': must be a whole number from 0"),
    ('id = "root"\n[[children]]\nid = "r"\nkind = "supervisor"\nstrategy = "simple_one_for_one"\n'
     'child_kind = "runner"\ncount = 10000000\n', "to 4096, got 10000000"),
    ('id = "root"\n[[children]]\nid = "r"\nkind = "supervisor"\nstrategy = "simple_one_for_one"\n'
     'child_kind = "runner"\n[[children.children]]\nid = "x"\nkind = "probe"\n',
     "a simple_one_for_one supervisor declares no children"),
    ('id = "root"\n[[children]]\nid = "r"\nkind = "supervisor"\ncount = 3\n',
     "field 'count': count is only for strategy = \"simple_one_for_one\""),
])
def test_mistakes_name_file_line_and_field(text, expected):
    with pytest.raises(UserError) as err:
        parse_tree(text, "t.toml")
    assert expected in str(err.value)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read supervisor tree"):
        load_tree(tmp_path / "absent.toml")


def test_cli_reports_a_bad_tree_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "root"\n[[children]]\nid = "x"\nkind = "warp_drive"\n')
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "start", "--tree", str(bad),
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "bad.toml:4: field 'kind': unknown actor kind 'warp_drive'" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_help_lists_every_verb():
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "--help"], capture_output=True,
                         text=True, timeout=60)
    for verb in ("quickstart", "start", "join", "leave", "stop", "status"):
        assert verb in out.stdout


@pytest.mark.parametrize("module, behavior_code, message", [
    ("nosuchmodule", None, "task 'bad': cannot import its code: ModuleNotFoundError"),
    ("lockedagent", "import threading\nLOCAL = threading.local()\n\ndef tasks(seed):\n    while True:\n"
                    "        yield {}\n\ndef behavior(task, llm):\n    LOCAL.x = 1\n    return 1.0\n",
     "lockedagent.py: behavior cannot be shipped to runners: module-level LOCAL (_local) cannot be pickled"),
    ("nofunction", "def tasks(seed):\n    yield {}\n", "nofunction has no function 'behavior'"),
])
def test_cli_checks_task_code_before_starting(tmp_path, module, behavior_code, message):
    """Code the registry could not import or pickle is reported before anything starts
    (it used to crash the registry over and over)."""
    if behavior_code:
        (tmp_path / f"{module}.py").write_text(behavior_code)
    job = tmp_path / "job.toml"
    job.write_text(f'[[tasks]]\nname = "bad"\nsource = "{module}"\nbehavior = "{module}:behavior"\n')
    env = dict(__import__("os").environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "start", "--config", str(job),
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "head.json").exists()


def test_a_job_mistake_is_answered_before_torch_is_imported(tmp_path):
    """The job is checked before the tree's actor kinds are imported (they import torch and
    transformers): a mistyped field was answered after ~3 s, now at once."""
    job = tmp_path / "job.toml"
    job.write_text('[[models]]\nname = "policy"\nlr = -1\n')
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "actorjet.cli.main", "start", "--config", str(job),
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "job.toml: model 'policy': lr must be > 0, got -1" in out.stderr, out.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "actorjet.config" in imported and "torch" not in imported and "transformers" not in imported


@pytest.mark.parametrize("split, source, message", [
    ("tset", "agents.arithmetic", "held-out split 'tset': ValueError: unknown split 'tset' (known: validation, test)"),
    ("test", "onesplit", "asks for the held-out split 'test', but onesplit.eval_tasks has one set only"),
])
def test_a_held_out_split_the_task_lacks_is_refused_before_starting(tmp_path, split, source, message):
    (tmp_path / "onesplit.py").write_text("from actorjet_agents.arithmetic import tasks, behavior, messages, score\n"
                                          "def eval_tasks():\n    return [{'question': '1+1=', 'answer': '2'}]\n")
    job = tmp_path / "job.toml"
    job.write_text(f'[[models]]\neval_split = "{split}"\n[[tasks]]\nname = "t"\nsource = "{source}"\n'
                   f'behavior = "{source}:behavior"\n')
    env = dict(__import__("os").environ, PYTHONPATH=f"{tmp_path}:{REPO}")
    out = subprocess.run([sys.executable, "-m", "actorjet.cli.main", "start", "--config", str(job),
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60,
                         env=env, cwd=REPO)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_one_backoff_policy_for_every_restart():
    """runtime/backoff.py: a child that ran a while restarts at once; a crash loop waits
    0.05, 0.1, 0.2 … s, capped; one healthy run resets it."""
    from actorjet.runtime.backoff import Backoff

    b = Backoff(initial_s=0.05, max_s=0.15, healthy_s=1.0)
    assert b.delay("x", started_at=0.0, now=5.0) == 0.0                      # ran 5 s: at once
    assert [b.delay("x", 10.0, 10.2) for _ in range(4)] == [0.05, 0.1, 0.15, 0.15]
    assert b.delay("y", 10.0, 10.2) == 0.05                                  # per child
    assert b.delay("x", 20.0, 22.0) == 0.0 and b.delay("x", 30.0, 30.1) == 0.05   # reset by a healthy run
