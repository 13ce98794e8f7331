"""What `pip install` puts where: ActorJet installs `actorjet` and `actorjet_agents` (the
repository's agents/ folder) and no top-level package another library owns — in particular
not `agents`, which is the OpenAI Agents SDK's."""
import configparser
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from setuptools import find_packages

from swarm import REPO


def listed_packages() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg["options"]["packages"].split()


def test_setup_cfg_lists_every_package_and_only_ours():
    """The packages are listed (the agents/ folder installs under another name), so a new
    subpackage of actorjet must be listed too, or the wheel would lack it."""
    found = find_packages(str(REPO), include=["actorjet", "actorjet.*"])
    examples = ["actorjet_agents"] + [f"actorjet_agents.{p}" for p in find_packages(str(REPO / "agents"))]
    assert sorted(listed_packages()) == sorted(found + examples)
    assert all(p.split(".")[0] in ("actorjet", "actorjet_agents") for p in listed_packages())


@pytest.mark.slow
def test_the_wheel_installs_beside_the_openai_agents_sdk_and_both_work(tmp_path):
    """As a user installs it (a wheel, not editable) into a site-packages that holds the Agents
    SDK: the SDK's files stay its own, `from agents import Agent, Runner` works, and the
    quickstart's behavior trains (`actorjet quickstart --steps 2`, away from the repository).
    Nothing is downloaded: the SDK is copied from this environment, and the other
    dependencies are read from it through a .pth file."""
    here = Path(sysconfig.get_paths()["purelib"])
    if not (here / "agents" / "run.py").exists():
        pytest.skip("pip install -e '.[frameworks]' (openai-agents) for this test")
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("actorjet-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    shutil.copytree(here / "agents", site / "agents")                          # the SDK, as pip put it here
    for dist in here.glob("openai_agents-*.dist-info"):
        shutil.copytree(dist, site / dist.name)
    sdk_files = sorted(p.relative_to(site) for p in (site / "agents").rglob("*.py"))
    (site / "zz_dependencies.pth").write_text(str(here) + "\n")                 # after its own site-packages
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                                "-q", str(wheel)], capture_output=True, text=True, env=env, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert sorted(p.relative_to(site) for p in (site / "agents").rglob("*.py")) == sdk_files   # untouched
    tops = {p.name for p in site.iterdir() if p.is_dir() and not p.name.endswith(("-info", "__pycache__"))}
    assert {"actorjet", "actorjet_agents"} <= tops and "agents" in tops

    both = ("from agents import Agent, Runner\n"
            "import agents, actorjet_agents.arithmetic as a\n"
            "print(Runner.__module__, agents.__file__.startswith(%r), a.__file__.startswith(%r))\n" % (str(site), str(site)))
    out = subprocess.run([str(py), "-c", both], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["agents.run", "True", "True"], out.stdout + out.stderr
    run = subprocess.run([str(venv / "bin" / "actorjet"), "quickstart", "--steps", "2", "--run-dir",
                          str(tmp_path / "qs")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "after 2 steps" in run.stdout, run.stdout[-2000:] + run.stderr[-3000:]
