"""Job configs (TOML): which models, which tasks, how to train.  Plain data, checked here
(no subprocess, no lock, no import of user code: models/prepare.py does those).

    [[models]]                       # one subtree (engine, gateway, learner) per model
    name = "policy"
    source = "tiny-arith"            # tiny-arith | smollm2-135m | a local HF directory
    [[tasks]]
    name = "arithmetic"
    source = "actorjet_agents.arithmetic"     # module: tasks(seed), optional eval_tasks/messages/score
    behavior = "actorjet_agents.arithmetic:behavior"
    [train]
    steps = 100
"""
from __future__ import annotations

import copy
import math
import re
import sys
import tomllib
from pathlib import Path

from actorjet import job_schema
from actorjet.checks import is_int
from actorjet.errors import UserError
from actorjet.rl import algorithms, lora

# Every field's default, meaning and study range: job_schema.py (one source of truth).
MODEL_DEFAULTS = job_schema.defaults(job_schema.MODEL)
TASK_DEFAULTS = job_schema.defaults(job_schema.TASK)
TRAIN_DEFAULTS = job_schema.defaults(job_schema.TRAIN)


def tree_path(name: str) -> Path:
    """Find a bundled supervisor tree: the repo checkout first, then the installed share dir."""
    for base in (Path(__file__).resolve().parent.parent / "supervisors",
                 Path(sys.prefix) / "share" / "actorjet" / "supervisors"):
        if (base / name).exists():
            return base / name
    raise UserError(f"bundled supervisor tree {name} not found; pass --tree FILE")


def load_job(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read job config {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
    return normalize(data, str(path))


def _learner(section: dict, where: str) -> dict:
    """``learner = { ranks = N, placement = [...] }``: how many processes train the model
    (FSDP2 ranks, rl/ranks.py) and, optionally, one placement table per rank."""
    unknown = set(section) - {"ranks", "placement"}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {sorted(unknown)} (expected ranks, placement)")
    ranks, places = section.get("ranks", 1), section.get("placement", [])
    if not is_int(ranks) or not 1 <= ranks <= 64:
        raise UserError(f"{where}: ranks must be a whole number from 1 to 64, got {ranks!r}")
    if places and (not isinstance(places, list) or len(places) != ranks or not all(
            isinstance(p, dict) and set(p) <= {"node", "gpus", "cpus"} for p in places)):
        raise UserError(f"{where}: placement must list one placement table per rank ({ranks}), "
                        "each with node, gpus or cpus")
    return {"ranks": ranks, "placement": list(places)}


def normalize(data: dict, where: str = "job") -> dict:
    """Fill defaults and check every field, naming the one that is wrong."""
    job = {"models": [], "tasks": [], "train": _section(data.get("train", {}), TRAIN_DEFAULTS, f"{where}: [train]")}
    for i, model in enumerate(data.get("models", [{}])):
        job["models"].append(_section(model, MODEL_DEFAULTS, f"{where}: models[{i}]"))
    for i, task in enumerate(data.get("tasks", [{}])):
        job["tasks"].append(task_section(task, f"{where}: tasks[{i}]"))
    for key in data:
        if key not in ("models", "tasks", "train"):
            raise UserError(f"{where}: unknown section [{key}] (expected models, tasks, train)")
    names = [m["name"] for m in job["models"]]
    for name in names:      # it names files and folders (episodes-NAME.sqlite, weights/NAME/)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name):
            raise UserError(f"{where}: model name {name!r}: use letters, digits, '_', '.', '-' "
                            "(starting with a letter or digit)")
    if len(set(names)) != len(names):
        raise UserError(f"{where}: model names must be unique, got {names}")
    for m in job["models"]:
        if m["merge"] not in ("auto", "none", "prefix", "tree"):
            raise UserError(f"{where}: model {m['name']!r}: merge must be auto, none, prefix or tree")
        if m["attention"] not in ("model", "exact"):
            raise UserError(f"{where}: model {m['name']!r}: attention must be model or exact")
        if m["merge_match"] not in ("ids", "text"):
            raise UserError(f"{where}: model {m['name']!r}: merge_match must be ids or text")
        if m["engine"] not in ("transformers", "vllm"):
            raise UserError(f"{where}: model {m['name']!r}: engine must be transformers or vllm")
        m["lora"] = lora.check(m["lora"], f"{where}: model {m['name']!r}")
        if m["tool_parser"] not in ("", "hermes", "llama3_json", "mistral", "pythonic"):
            raise UserError(f"{where}: model {m['name']!r}: tool_parser must be hermes, llama3_json, mistral or "
                            "pythonic (or absent: read from the chat template)")
        if not 1 <= m["engines"] <= 64:
            raise UserError(f"{where}: model {m['name']!r}: engines must be from 1 to 64, got {m['engines']!r}")
        if not 1 <= m["tensor_parallel_size"] <= 64 or (m["tensor_parallel_size"] > 1 and m["engine"] != "vllm"):
            raise UserError(f"{where}: model {m['name']!r}: tensor_parallel_size must be from 1 to 64, and above 1 "
                            f"only with engine = \"vllm\" (got {m['tensor_parallel_size']!r}, engine {m['engine']!r})")
        places = m["engine_placement"]
        if places and (len(places) != m["engines"] or not all(
                isinstance(p, dict) and set(p) <= {"node", "gpus", "cpus"} for p in places)):
            raise UserError(f"{where}: model {m['name']!r}: engine_placement must list one placement table per "
                            f"engine replica ({m['engines']}), each with node, gpus or cpus")
        for key in ("lr", "grad_clip", "max_batch", "eval_every", "checkpoint_every", "eval_max_tokens",
                    "default_max_tokens"):
            if not m[key] > 0:
                raise UserError(f"{where}: model {m['name']!r}: {key} must be > 0, got {m[key]!r}")
        if m["eval_limit"] < 0:          # (its type is checked with the job's schema)
            raise UserError(f"{where}: model {m['name']!r}: eval_limit must be >= 0 (0: every held-out task), "
                            f"got {m['eval_limit']!r}")
        if m["threads"] < 0 or m["groups_per_step"] < 0:
            raise UserError(f"{where}: model {m['name']!r}: threads and groups_per_step must be >= 0 (0: automatic)")
        m["learner"] = _learner(m["learner"], f"{where}: model {m['name']!r}: learner")
        algorithms.check(m, f"{where}: model {m['name']!r}")
        if m["checkpoint_keep_last"] < 1 or m["checkpoint_keep_best"] < 0:
            raise UserError(f"{where}: model {m['name']!r}: checkpoint_keep_last must be >= 1 (the newest is what a "
                            f"restarted learner resumes from) and checkpoint_keep_best >= 0")
        if m["prefix_cache_mb"] < 0 and m["prefix_cache_mb"] != -1:
            raise UserError(f"{where}: model {m['name']!r}: prefix_cache_mb must be >= 0 (0: keep none) or -1 "
                            "(from the device)")
        if not (0 < m["gpu_memory_utilization"] <= 1 and 0 < m["learner_gpu_memory"] < m["gpu_memory_utilization"]):
            raise UserError(f"{where}: model {m['name']!r}: gpu_memory_utilization must be in (0, 1] and "
                            "learner_gpu_memory above 0 and below it (the engine keeps the rest), got "
                            f"{m['gpu_memory_utilization']!r} and {m['learner_gpu_memory']!r}")
    _check_bases(job["models"], where)
    t = job["train"]
    if t["isolation"] not in ("thread", "process"):
        raise UserError(f"{where}: [train] isolation must be thread or process")
    if t["mix"] not in ("strict", "fill"):
        raise UserError(f"{where}: [train] mix must be strict or fill")
    tasks = [x["name"] for x in job["tasks"]]
    if len(set(tasks)) != len(tasks):
        raise UserError(f"{where}: task names must be unique, got {tasks}")
    for x in job["tasks"]:
        if x["weight"] <= 0:
            raise UserError(f"{where}: task {x['name']!r}: weight must be > 0")
    if not 0 < t["lease_timeout_s"] <= t["episode_max_s"]:
        raise UserError(f"{where}: [train] lease_timeout_s (the idle limit, {t['lease_timeout_s']!r}) must be "
                        f"> 0 and at most episode_max_s (the total limit, {t['episode_max_s']!r})")
    for key in ("group_size", "groups_per_step", "steps", "runner_concurrency"):
        if not isinstance(t[key], int) or t[key] < 1:
            raise UserError(f"{where}: [train] {key} must be a positive integer, got {t[key]!r}")
    return job


def _check_bases(models: list[dict], where: str) -> None:
    """``base = "other"``: this model is a LoRA adapter served by the other model's engine,
    over the other model's (frozen) base.  Two adapters of one base share its memory and its
    batches; the tree gives this model a gateway and a learner but no engine."""
    by_name = {m["name"]: m for m in models}
    for m in models:
        if not m["base"]:
            continue
        here = f"{where}: model {m['name']!r}: base = {m['base']!r}"
        other = by_name.get(m["base"])
        if other is None or other is m:
            raise UserError(f"{here} must name another model of this job ({', '.join(by_name)})")
        if other["base"]:
            raise UserError(f"{here} has a base of its own: name {other['base']!r} instead")
        if not (m["lora"] and other["lora"]):
            raise UserError(f"{here}: both models need a lora table (the shared base stays frozen)")
        if m["source"] != other["source"]:
            raise UserError(f"{here}: the source must be the same ({m['source']!r} vs {other['source']!r})")
        if "vllm" in (m["engine"], other["engine"]):
            raise UserError(f"{here}: only the transformers engine serves several adapters of one base for now")


def sharing(job: dict, name: str) -> dict[str, dict]:
    """The models served as adapters by ``name``'s engine: their lora tables by name."""
    return {m["name"]: m["lora"] for m in job["models"] if m.get("base") == name}


def engine_of(job: dict, name: str) -> str:
    """Whose engine serves model ``name``: its own, or its base's."""
    return model_config(job, name).get("base") or name


EXAMPLES = "actorjet_agents"      # the repository's agents/ folder, as installed (setup.cfg)


def examples_name(ref: str) -> str:
    """A module (or module:function) name as the job gave it → the one to import.  The example
    behaviors live in the repository's ``agents/`` folder and install as ``actorjet_agents``
    (a top-level ``agents`` is the OpenAI Agents SDK's), so ``agents.arithmetic`` — the folder's
    name, as job files and docs wrote it — means ``actorjet_agents.arithmetic`` when that exists."""
    import importlib.util

    module, colon, rest = ref.partition(":")
    if not module.startswith("agents."):
        return ref
    ours = EXAMPLES + module[len("agents"):]
    try:
        found = importlib.util.find_spec(ours) is not None
    except (ImportError, ValueError):
        found = False
    return ours + colon + rest if found else ref


def task_section(given: dict, where: str) -> dict:
    """A task's entry, checked, with its source and behavior named as they are imported."""
    task = _section(given, TASK_DEFAULTS, where)
    for key in ("source", "behavior"):
        if isinstance(task.get(key), str):
            task[key] = examples_name(task[key])
    return task


def _section(given: dict, defaults: dict, where: str) -> dict:
    if not isinstance(given, dict):
        raise UserError(f"{where} must be a table")
    for key, value in given.items():
        if key not in defaults:
            raise UserError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(defaults))})")
        want = type(defaults[key])
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{where}: field {key!r} must be a finite number, got {value!r}")
        if want is float and is_int(value):
            continue
        if not isinstance(value, want) or (want is int and not is_int(value)):
            raise UserError(f"{where}: field {key!r} must be {want.__name__}, got {value!r}")
    return {**copy.deepcopy(defaults), **given}


def model_config(job: dict, name: str) -> dict:
    for model in job["models"]:
        if model["name"] == name:
            return model
    raise UserError(f"the tree names model {name!r} but the job config has only "
                    f"{[m['name'] for m in job['models']]}")
