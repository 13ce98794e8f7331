"""The catalogue of knobs a study may turn, for one base job: every field of the job (each
model's and task's by name) with its type, its value in the job, its meaning and the range a
study explores by default.  Built from actorjet/job_schema.py alone, so it can never disagree
with what config.py accepts; `research knobs` prints it, `research ask` reads questions
against it and shows it to an LLM planner.
"""
from __future__ import annotations

import re

from actorjet import job_schema
from actorjet.errors import UserError

# what people call a field, beside its name (spaces and '-' already read as '_')
ALIASES = {"learning_rate": "lr", "group": "group_size", "groups": "groups_per_step",
           "batch_size": "groups_per_step", "batch": "groups_per_step", "staleness": "max_staleness",
           "clipping": "clip", "clip_range": "clip", "kl_coef": "kl", "kl_penalty": "kl",
           "estimator": "algorithm", "advantage_estimator": "algorithm", "algorithms": "algorithm",
           "context_merging": "merge", "tis": "tis_cap", "gae_lambda": "lam", "lambda": "lam",
           "discount": "gamma", "value_loss_coef": "value_coef", "task_weight": "weight"}


def catalogue(job: dict) -> dict[str, dict]:
    """Knob path → {path, type, value, meaning, explore} for every field of this job."""
    out = {}
    for name, field in job_schema.TRAIN.items():
        out[f"train.{name}"] = _entry(f"train.{name}", field, job["train"][name])
    for section in ("models", "tasks"):
        for item in job[section]:
            for name, field in job_schema.SECTIONS[section].items():
                path = f"{section}.{item['name']}.{name}"
                out[path] = _entry(path, field, item[name])
    return out


def _entry(path: str, field: job_schema.Field, value) -> dict:
    return {"path": path, "type": type(field.default).__name__, "value": value, "meaning": field.meaning,
            "explore": field.explore}


def studiable(job: dict) -> dict[str, dict]:
    """The knobs with a default range: what a question may name without giving one."""
    return {path: e for path, e in catalogue(job).items() if e["explore"] is not None}


def resolve(job: dict, words: str) -> str:
    """The knob path a person means by ``words`` ("learning rate", "lr", "models.policy.lr");
    a UserError naming the choices when it is unknown or ambiguous."""
    table = catalogue(job)
    text = words.strip().strip("'\"`").strip()
    if text in table:
        return text
    key = re.sub(r"[\s\-]+", "_", text.lower())
    key = re.sub(r"^(the|a|an)_", "", key)
    key = ALIASES.get(key, key)
    matches = [path for path in table if path.rsplit(".", 1)[1] == key]
    if len(matches) > 1:        # e.g. groups_per_step: [train]'s is the knob, a model's only overrides it
        matches = [path for path in matches if table[path]["explore"] is not None] or matches
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise UserError(f"{words!r} is a field of several parts of the job: say which ({', '.join(matches)})")
    names = sorted({p.rsplit(".", 1)[1] for p in studiable(job)})
    raise UserError(f"{words!r} is no field of the job; the knobs a study explores: {', '.join(names)} "
                    "(`actorjet research knobs --base-job JOB` lists every field)")
