"""The docs match the product: every `actorjet` command in README.md, docs/*.md and the CLI's
own epilog parses, names files that exist, and — where it can run here — runs against a live
head started the way the README says.

Commands are taken from fenced ``bash`` blocks (a line, or the `actorjet` part of an ``&&``
chain; comments and pipes dropped).  Hosts in the examples (10.0.0.5) become 127.0.0.1.
"""
import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from swarm import REPO, Proc, free_port, wait_until

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLE_HOST = "10.0.0.5"
MADE_UP = {"my_agent.py:behavior", "agent.py:behavior"}    # a reader's own file
RUN_HERE = ("status", "upgrade", "rollback", "task")     # verbs that act on a running head


def fenced_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every shell command in fenced bash blocks."""
    out = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        first = text[:block.start()].count("\n") + 2
        for offset, line in enumerate(block.group(1).splitlines()):
            line = line.split(" | ")[0]
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words:
                    out.append((first + offset, shlex.join(words)))
    return out


def actorjet_commands() -> list[tuple[str, str]]:
    """(where, command) for every `actorjet ...` in the docs and in `actorjet --help`."""
    from actorjet.cli.main import EPILOG

    found = []
    for doc in DOCS:
        for line, cmd in fenced_commands(doc.read_text()):
            if cmd.startswith("actorjet "):
                found.append((f"{doc.relative_to(REPO)}:{line}", cmd))
    for line in EPILOG.splitlines():
        if line.strip().startswith("actorjet ") and "|" not in line:
            found.append(("actorjet --help", re.split(r"\s{2,}", line.strip())[0]))
    return found


COMMANDS = actorjet_commands()


def test_the_docs_have_commands_to_check():
    verbs = {cmd.split()[1] for _, cmd in COMMANDS}
    assert {"quickstart", "start", "join", "status", "upgrade", "rollback", "task", "stop"} <= verbs


@pytest.mark.parametrize("where,cmd", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_documented_command_parses_and_names_files_that_exist(where, cmd):
    from actorjet.cli.main import build_parser

    argv = shlex.split(cmd)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `{cmd}` is not accepted by the CLI")
    for before, word in zip([""] + argv, argv):
        path = word.split(":")[0]
        if word not in MADE_UP and before != "--out" and re.search(r"\.(py|toml)$", path):
            assert (REPO / path).exists(), f"{where}: `{cmd}` names {path}, which does not exist"


def test_the_install_commands_name_extras_and_files_that_exist():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    for doc in DOCS:
        for line, cmd in fenced_commands(doc.read_text()):
            words = shlex.split(cmd)
            if words[:2] != ["pip", "install"]:
                continue
            for i, word in enumerate(words):
                if words[i - 1] == "-c":
                    assert (REPO / word).exists(), f"{doc.name}:{line}: {word} does not exist"
                if m := re.fullmatch(r"\.\[(.*)\]", word):
                    missing = set(m.group(1).split(",")) - extras
                    assert not missing, f"{doc.name}:{line}: no extra {missing} in setup.cfg"


def cocktail_job(tmp: Path) -> Path:
    """agents/job.toml's model with the tasks and [train] of docs/cocktail.md: the job the
    docs' commands (upgrade arithmetic, task pause flaky, ...) act on together."""
    models = (REPO / "agents" / "job.toml").read_text().split("[[tasks]]")[0]
    block = re.search(r"```toml\n(.*?)```", (REPO / "docs" / "cocktail.md").read_text(), re.S).group(1)
    path = tmp / "job.toml"
    path.write_text(models + block)
    return path


def run_cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actorjet.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


@pytest.mark.slow
def test_documented_commands_run_against_a_live_head(swarm, tmp_path):
    """The head is started with README's `actorjet start` line (on a free port), then every
    documented command that acts on a running head is run, in the docs' order."""
    start = next(cmd for _, cmd in COMMANDS if cmd.startswith("actorjet start --config agents/job.toml"))
    args = shlex.split(start.replace(EXAMPLE_HOST, "127.0.0.1"))[1:]
    args[args.index("agents/job.toml")] = str(cocktail_job(tmp_path))
    port, run_dir = free_port(), tmp_path / "run"
    proc = Proc(args + ["--port", str(port), "--run-dir", str(run_dir), "--slots", "2"], swarm.env)
    swarm.procs.append(proc)
    swarm.ports.append(port)
    proc.wait_for(r"--token (\S+)", timeout_s=300)
    target = ["--head", f"127.0.0.1:{port}", "--run-dir", str(run_dir)]

    def json_status() -> dict:
        import json
        out = run_cli(["status", "--json", *target], swarm.env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    wait_until(lambda: json_status()["episodes"]["completed"] > 0, 180, interval_s=1, what="episodes")
    ran = []
    for where, cmd in COMMANDS:
        argv = shlex.split(cmd)[1:]
        if argv[0] not in RUN_HERE or any(w in MADE_UP or w.isupper() for w in argv):   # TASK, T: placeholders
            continue
        out = run_cli(argv + target, swarm.env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, f"{where}: `{cmd}`\n{out.stdout}\n{out.stderr}"
        ran.append(cmd)
        if argv[0] == "upgrade":
            assert "is live on" in out.stdout, f"{where}: {out.stdout}"
    assert len({c.split()[1] for c in ran}) == len(RUN_HERE), ran
    stop = next(cmd for _, cmd in COMMANDS if cmd == "actorjet stop")
    out = run_cli(shlex.split(stop)[1:] + ["--run-dir", str(run_dir)], swarm.env)
    assert out.returncode == 0 and "stopped" in out.stdout and "nothing is running" not in out.stdout, out.stdout
    assert proc.wait_exit(60) == 0


def test_the_one_episode_walk_names_as_many_files_as_its_table_says():
    """docs/architecture.md's walk of one episode names every module on its path (its rule),
    and its table states how many: a change that adds a module to the path must say so."""
    text = (REPO / "docs" / "architecture.md").read_text()
    walk = text[text.index("Follow one episode of the quickstart"):text.index("| on that path | before (merger")]
    named = set(re.findall(r"`((?:[a-z_]+/)?[a-z_]+\.py)`", walk))
    assert all((REPO / "actorjet" / f).exists() for f in named), [f for f in named if not (REPO / "actorjet" / f).exists()]
    stated = re.search(r"\| source files on the path .*\| \*\*(\d+)\*\*", text)
    assert stated and int(stated.group(1)) == len(named), (stated and stated.group(1), sorted(named))
