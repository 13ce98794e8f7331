"""The study spec (TOML), checked before anything runs.

    question = "Which learning rate trains tiny-arith fastest?"
    base_job = "agents/job.toml"          # or an inline [base_job] table
    [metric]  kind = "final_accuracy" | "auc" | "steps_to"; threshold = 0.5 (steps_to only)
    [budget]  max_trials = 30; max_wall_s = 2400; parallel = 1
    [knobs."models.policy.lr"]   log_uniform = [1e-5, 1e-2]
    [knobs."train.checkpoint_every"]  choice = [50, 1000]
    [seeds]   baseline = 3; explore = 1; confirm = 3; ablate = 3
    [explore] trials = 12; min_evals = 1          # successive halving on the periodic evals
    [decision] confidence = 0.95                  # adopt only when the CI of the gain excludes 0
    [trials]  host = "10.0.0.5"; port = 1900; token_file = "swarm.token"; slots = 0   # optional

A knob is a path into the job: ``train.FIELD``, ``models.NAME.FIELD`` or ``tasks.NAME.FIELD``;
both ends of its range must make a valid job.  ``[trials]`` says where trials run, not what
they measure, so it is left out of the spec's hash (a study may resume elsewhere).  Every
mistake is a UserError naming the file and the field, never a traceback.
"""
from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from pathlib import Path

from actorjet.checks import int_in, is_number
from actorjet.errors import UserError
from actorjet.config import load_job, normalize

METRICS = ("final_accuracy", "auc", "steps_to")
KINDS = ("log_uniform", "uniform", "int_uniform", "choice")
SEED_STAGES = ("baseline", "explore", "confirm", "ablate")
FOLLOWED_BY = ("", "long confirm", "narrow", "next knob", "planner")     # research/follow_up.py


def load_study(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such study file") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None
    return check_study(data, str(path), base_dir=path.parent)


def check_study(data: dict, where: str = "study", base_dir: Path = Path(".")) -> dict:
    known = {"question", "base_job", "metric", "budget", "knobs", "seeds", "explore", "decision", "planner",
             "trials", "followed_by"}
    for key in data:
        if key not in known:
            raise UserError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: field 'question': say what the study asks, in a sentence")
    base = data.get("base_job")
    if isinstance(base, str):
        job_path = (base_dir / base) if not Path(base).is_absolute() else Path(base)
        if not job_path.exists():
            raise UserError(f"{where}: field 'base_job': no job config at {job_path}")
        job = load_job(job_path)
    elif isinstance(base, dict):
        job = normalize(base, f"{where}: base_job")
    else:
        raise UserError(f"{where}: field 'base_job': a path to a job config, or an inline [base_job] table")
    metric = _table(data, "metric", where)
    kind = metric.get("kind", "final_accuracy")
    if kind not in METRICS:
        raise UserError(f"{where}: field 'metric.kind': one of {', '.join(METRICS)}, got {kind!r}")
    if kind == "steps_to" and not isinstance(metric.get("threshold"), (int, float)):
        raise UserError(f"{where}: field 'metric.threshold': steps_to needs an accuracy threshold, e.g. 0.5")
    _check_splits(job, where)
    budget = _table(data, "budget", where)
    budget = {"max_trials": _int(budget, "max_trials", 30, where, "budget"),
              "max_wall_s": _num(budget, "max_wall_s", 3600.0, where, "budget"),
              "parallel": _int(budget, "parallel", 1, where, "budget")}
    seeds = _table(data, "seeds", where)
    seeds = {stage: _int(seeds, stage, 3 if stage != "explore" else 1, where, "seeds") for stage in SEED_STAGES}
    explore = _table(data, "explore", where)
    explore = {"trials": _int(explore, "trials", 8, where, "explore"),
               "min_evals": _int(explore, "min_evals", 1, where, "explore")}
    decision = _table(data, "decision", where)
    confidence = _num(decision, "confidence", 0.95, where, "decision")
    if not 0.5 <= confidence < 1:
        raise UserError(f"{where}: field 'decision.confidence': between 0.5 and 1, got {confidence}")
    knobs = {}
    for name, rule in _table(data, "knobs", where).items():
        knobs[name] = _knob(job, name, rule, where)
    if not knobs:
        raise UserError(f"{where}: field 'knobs': name at least one knob to study")
    from actorjet.research.planner import check_planner

    planner = check_planner(_table(data, "planner", where), where)
    followed_by = data.get("followed_by", "")
    if followed_by not in FOLLOWED_BY:
        raise UserError(f"{where}: field 'followed_by' (why a chain ran this study): one of {FOLLOWED_BY}")
    study = {"question": question.strip(), "base_job": job, "planner": planner,
             "metric": {"kind": kind, "threshold": metric.get("threshold")}, "budget": budget, "seeds": seeds,
             "explore": explore, "decision": {"confidence": confidence}, "knobs": knobs}
    if followed_by:          # (absent otherwise: a study's hash, and so its directory, stays as it was)
        study["followed_by"] = followed_by
    study["hash"] = hashlib.sha256(json.dumps(study, sort_keys=True).encode()).hexdigest()[:16]
    study["trials"] = _trials(_table(data, "trials", where), where, base_dir)
    return study


TRIAL_DEFAULTS = {"host": "127.0.0.1", "advertise": "", "port": 0, "token_file": "", "tree": "", "slots": 2}


def _trials(table: dict, where: str, base_dir: Path) -> dict:
    """Where each trial's head runs.  By default on this machine, a free port each, runners in
    its own slots.  A head the user names: ``host``/``port``/``token_file`` put every trial's
    head at HOST:PORT (slot i of ``parallel`` at PORT + 2i; PORT + 1 is its door) with one
    token, so nodes joined once with ``actorjet join HOST:PORT`` are re-admitted by each trial
    in turn and run its episodes (``slots = 0``: only they do)."""
    for key, value in table.items():
        if key not in TRIAL_DEFAULTS:
            raise UserError(f"{where}: unknown field 'trials.{key}' (known: {', '.join(TRIAL_DEFAULTS)})")
        if type(value) is not type(TRIAL_DEFAULTS[key]):
            raise UserError(f"{where}: field 'trials.{key}' must be {type(TRIAL_DEFAULTS[key]).__name__}, "
                            f"got {value!r}")
    trials = {**TRIAL_DEFAULTS, **table}
    if not trials["host"].strip():
        raise UserError(f"{where}: field 'trials.host' is empty (an address trial heads bind, e.g. 127.0.0.1)")
    if trials["slots"] < 0 or not 0 <= trials["port"] < 65535:
        raise UserError(f"{where}: field 'trials.{'slots' if trials['slots'] < 0 else 'port'}' is out of range")
    for key in ("token_file", "tree"):
        if trials[key]:
            path = Path(trials[key]) if Path(trials[key]).is_absolute() else base_dir / trials[key]
            if not path.is_file():
                raise UserError(f"{where}: field 'trials.{key}': no file at {path}")
            if key == "token_file" and not path.read_text().strip():
                raise UserError(f"{where}: field 'trials.token_file': {path} is empty")
            trials[key] = str(path.resolve())
    if trials["port"] and not trials["token_file"]:
        raise UserError(f"{where}: field 'trials.token_file': nodes joined to a fixed trials.port need the "
                        "same token for every trial (write one to a file: `openssl rand -hex 16 > swarm.token`)")
    if trials["tree"]:
        from actorjet.runtime.tree_spec import load_tree

        load_tree(trials["tree"])            # its mistakes are UserErrors naming file and line
    return trials


def apply(job: dict, params: dict) -> dict:
    """The job with these knob values set (a deep copy), checked."""
    job = copy.deepcopy(job)
    for path, value in params.items():
        section, field = _locate(job, path)
        section[field] = value
    return normalize(job, "trial")


def _knob(job: dict, name: str, rule, where: str) -> dict:
    here = f"{where}: field 'knobs.{name}'"
    try:
        section, field = _locate(job, name)
    except KeyError as e:
        raise UserError(f"{here}: {e.args[0]}") from None
    if not isinstance(rule, dict) or len([k for k in rule if k in KINDS]) != 1:
        raise UserError(f"{here}: give exactly one of {', '.join(KINDS)}")
    kind = next(k for k in rule if k in KINDS)
    values = rule[kind]
    if kind == "choice":
        if not isinstance(values, list) or not values:
            raise UserError(f"{here}: choice must be a non-empty list")
        ends = values
    else:
        if not (isinstance(values, list) and len(values) == 2
                and all(is_number(v) for v in values)
                and values[0] < values[1]):
            raise UserError(f"{here}: {kind} must be [low, high] with low < high")
        if kind == "log_uniform" and values[0] <= 0:
            raise UserError(f"{here}: log_uniform needs low > 0")
        ends = [int(v) for v in values] if kind == "int_uniform" else values
    for value in ends:
        try:
            apply(job, {name: value})
        except UserError as e:
            raise UserError(f"{here}: {value!r} makes an invalid job ({e})") from None
    return {"kind": kind, "values": values, "base": section[field]}


def _locate(job: dict, path: str) -> tuple[dict, str]:
    parts = path.split(".")
    if parts[0] == "train" and len(parts) == 2:
        if parts[1] not in job["train"]:
            raise KeyError(f"[train] has no field {parts[1]!r}")
        return job["train"], parts[1]
    if parts[0] in ("models", "tasks") and len(parts) == 3:
        items = {x["name"]: x for x in job[parts[0]]}
        if parts[1] not in items:
            raise KeyError(f"the base job has no {parts[0][:-1]} named {parts[1]!r} ({', '.join(items)})")
        if parts[2] not in items[parts[1]]:
            raise KeyError(f"{parts[0][:-1]} {parts[1]!r} has no field {parts[2]!r}")
        return items[parts[1]], parts[2]
    raise KeyError("a knob is train.FIELD, models.NAME.FIELD or tasks.NAME.FIELD")


def _check_splits(job: dict, where: str) -> None:
    """A study selects on the ``validation`` split and reports on ``test``: some task must be
    evaluated, and every evaluated task must have both."""
    from actorjet.models.heldout import eval_spec

    evaluated = 0
    for task in job["tasks"]:
        for model in job["models"]:
            try:
                splits = [eval_spec(task["source"], model["name"], s) for s in ("validation", "test")]
            except ImportError as e:
                raise UserError(f"{where}: base_job task {task['name']!r}: cannot import "
                                f"{task['source']}: {e}") from None
            if splits[0] is not None and splits[1] is None:
                raise UserError(f"{where}: base_job task {task['name']!r}: {task['source']}.eval_tasks has no 'test' "
                                "split; a study selects on 'validation' and reports on 'test' (give eval_tasks "
                                "a split parameter)")
            evaluated += splits[0] is not None
    if not evaluated:
        raise UserError(f"{where}: field 'metric': no task of the base job has a held-out evaluation "
                        "(eval_tasks/messages/score), so the metric cannot be measured")


def _table(data: dict, key: str, where: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"{where}: field {key!r} must be a table")
    return value


def _int(table: dict, key: str, default: int, where: str, section: str) -> int:
    value = table.get(key, default)
    if not int_in(value, 1):
        raise UserError(f"{where}: field '{section}.{key}' must be a positive integer, got {value!r}")
    return value


def _num(table: dict, key: str, default: float, where: str, section: str) -> float:
    value = table.get(key, default)
    if not is_number(value) or value <= 0:
        raise UserError(f"{where}: field '{section}.{key}' must be a positive number, got {value!r}")
    return float(value)


def distributions(knobs: dict) -> dict:
    """Each knob's Optuna distribution (the search asks with these; the report rebuilds the
    explore trials with them)."""
    import optuna

    out = {}
    for name, k in knobs.items():
        low, high = (k["values"][0], k["values"][-1])
        out[name] = (optuna.distributions.FloatDistribution(low, high, log=True) if k["kind"] == "log_uniform" else
                     optuna.distributions.FloatDistribution(low, high) if k["kind"] == "uniform" else
                     optuna.distributions.IntDistribution(int(low), int(high)) if k["kind"] == "int_uniform" else
                     optuna.distributions.CategoricalDistribution(k["values"]))
    return out


def within(value, knob: dict) -> bool:
    """Whether a value lies in a knob's range (or is one of its choices)."""
    if knob["kind"] == "choice":
        return value in knob["values"]
    return isinstance(value, (int, float)) and knob["values"][0] <= value <= knob["values"][1]
