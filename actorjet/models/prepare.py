"""Before a job starts, and on every node that hosts a model: the job's task code imports
and pickles (a typo is one line at start, not a crashing registry), and every model is a
local directory (built by the zoo in a child process, one process at a time per node).

The job's schema itself is plain data, checked in actorjet/config.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

from actorjet.config import examples_name, model_config
from actorjet.errors import UserError
from actorjet.models.heldout import eval_spec


def check_tasks(job: dict) -> None:
    """Import every task source and behavior and pickle the behavior, as the registry will,
    so a typo or unshippable code is one line at start instead of a crashing registry."""
    import importlib

    from actorjet.behaviors import Unshippable, pickle_function

    for task in job["tasks"]:
        where = f"task {task['name']!r}"
        try:
            source = importlib.import_module(examples_name(task["source"]))
            module_name, _, fn_name = examples_name(task["behavior"]).partition(":")
            module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001 - user code may fail to import in any way
            raise UserError(f"{where}: cannot import its code: {type(e).__name__}: {e}") from None
        if not callable(getattr(source, "tasks", None)):
            raise UserError(f"{where}: {task['source']} has no tasks(seed) function")
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            raise UserError(f"{where}: {module_name} has no function {fn_name!r}")
        try:
            pickle_function(module, fn)
        except Unshippable as e:
            raise UserError(f"{where}: {e}") from None
        for model in job["models"]:
            _check_split(task, model)


def _check_split(task: dict, model: dict) -> None:
    """The held-out split a model reports must exist in every task source that evaluates it."""
    where, split = f"task {task['name']!r}: model {model['name']!r}", model["eval_split"]
    try:
        spec = eval_spec(task["source"], model["name"], split)
        if spec is not None:
            spec[0]()
    except Exception as e:  # noqa: BLE001 - user code may fail in any way
        raise UserError(f"{where}: held-out split {split!r}: {type(e).__name__}: {e}") from None
    if spec is None and eval_spec(task["source"], model["name"]) is not None:
        raise UserError(f"{where} asks for the held-out split {split!r}, but {task['source']}.eval_tasks "
                        "has one set only (give it a split parameter)")


def build_model(source: str, seed: int, progress=None) -> str:
    """A model's local directory, built or unpacked by the zoo in a child process (see prepare)."""
    import subprocess

    cmd = [sys.executable, "-m", "actorjet.models.zoo", source, str(seed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = None
    for line in proc.stdout:
        kind, _, rest = line.strip().partition(" ")
        if kind == "progress" and progress is not None:
            done, total = rest.split()
            progress(int(done), int(total))
        elif kind == "path":
            path = rest
    err = proc.stderr.read().strip().splitlines()
    if proc.wait() != 0 or path is None:
        raise UserError(f"model source {source!r}: {err[-1] if err else 'could not be prepared'}")
    return path


def model_config_here(job: dict, name: str, claim_gpu: bool = False) -> dict:
    """The model's config with ``path`` valid on *this* node.  The head resolved the path on
    its own disk; a model subtree placed on another node builds (zoo models) or finds (a local
    directory given as the source) its own copy, one process at a time.  ``claim_gpu``: this
    process runs the model (an engine, a learner or rank): a bare ``device = "cuda"`` becomes
    the GPU of this machine it claims (runtime/gpus.py)."""
    import fcntl

    cfg = dict(model_config(job, name))
    if claim_gpu:
        from actorjet.runtime import gpus

        cfg["device"] = gpus.device_for(cfg)
    if Path(cfg.get("path", "")).is_dir():
        return cfg
    if Path(cfg["source"]).is_dir():
        cfg["path"] = cfg["source"]
        return cfg
    from actorjet.models.zoo import cache_dir

    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".build.lock", "w") as lock:      # engine, gateway and learner start together
        fcntl.flock(lock, fcntl.LOCK_EX)
        cfg["path"] = build_model(cfg["source"], job["train"]["seed"])
    return cfg


def prepare(job: dict, progress=None, seed: int | None = None) -> dict:
    """Resolve every model to a local directory before the tree starts, so actors never race
    to build the same model.  ``seed``: build the models from this seed rather than the job's
    own (a research trial on another machine builds the study's one starting model).

    Building runs in a child process: torch's thread pools must never start in the head
    process, because every actor is forked from it and a forked OpenMP pool deadlocks."""
    check_tasks(job)
    for model in job["models"]:
        try:
            model["path"] = build_model(model["source"], job["train"]["seed"] if seed is None else seed, progress)
        except UserError as e:
            raise UserError(f"model {model['name']!r}: {str(e).partition(': ')[2]}") from None
    return job


def preload_libraries(job: dict) -> None:
    """Import, never run, what the job's engines, learners and gateways import lazily:
    transformers' auto classes, each model's architecture module, peft for LoRA models.

    Called in the process that forks the actors (runtime/kinds.py), so each of them does not
    pay ~1.8 s of CPU for it again (and again at every restart).  Only imports: no weights
    are loaded and no torch op runs here (see ``prepare`` on forked OpenMP pools)."""
    import contextlib

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    for model in job.get("models", []):
        config = Path(model.get("path") or "") / "config.json"
        with contextlib.suppress(Exception):        # an odd model is loaded, and reported, by its actor
            if config.is_file():
                MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(config.parent))]
        if model.get("lora"):
            import peft  # noqa: F401
