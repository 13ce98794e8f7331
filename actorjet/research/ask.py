"""`actorjet research ask "QUESTION" --base-job JOB`: a research question in, a draft study out.

Two ways to read the question, one result: a study spec (study_spec.py) checked like any
other, written as TOML for a person to review (``--yes`` runs it at once).

- **An LLM planner** (``--planner URL``, any OpenAI-compatible endpoint, an ActorJet gateway
  included) is shown the question and the catalogue of knobs (catalogue.py) and answers the
  metric and the knobs with their ranges as JSON.  Its draft is only a proposal: a knob that
  is no field of the job, a range whose ends make an invalid job, or an answer that is not
  JSON is refused with the reason, never run.
- **Without one, a small grammar** covers the common forms:

      does KNOB matter [for METRIC]
      best KNOB between A and B [for METRIC]
      compare ALGO, ALGO and ALGO on TASK [by METRIC]
      how does METRIC scale with KNOB

  METRIC is accuracy (final held-out accuracy), auc / learning speed (area under the
  held-out curve), or "steps to N%".  Anything else is refused in one line that lists these.

The budget is sized from the plan (trials and the time estimate, with half again for slack),
so the draft passes `research plan` as written.
"""
from __future__ import annotations

import json
import math
import os
import re
import tomllib
from pathlib import Path

from actorjet.errors import UserError
from actorjet.research.catalogue import catalogue, resolve, studiable
from actorjet.research.plan import check_budget, make_plan
from actorjet.research.study_spec import check_study

FORMS = ("does KNOB matter", "best KNOB between A and B", "compare ALGO, ALGO and ALGO on TASK",
         "how does METRIC scale with KNOB")
METRIC_WORDS = {"accuracy": "final_accuracy", "final accuracy": "final_accuracy", "held-out accuracy":
                "final_accuracy", "test accuracy": "final_accuracy", "success": "final_accuracy",
                "final_accuracy": "final_accuracy", "auc": "auc", "area under the curve": "auc",
                "learning speed": "auc", "speed": "auc", "sample efficiency": "auc"}
PATTERNS = [
    ("matter", r"does (?P<knob>.+?) (?:matter|make a difference)(?: (?:for|to) (?P<metric>.+))?"),
    ("best", r"(?:what is |which is |find )?(?:the )?best (?P<knob>.+?) between (?P<a>\S+) and (?P<b>\S+?)"
             r"(?: (?:for|by) (?P<metric>.+))?"),
    ("compare", r"compare (?P<arms>.+?) on (?:the )?(?P<task>\S+?)(?: task)?(?: (?:by|for) (?P<metric>.+))?"),
    ("scale", r"how does (?P<metric>.+?) (?:scale|change|vary) with (?P<knob>.+)"),
]
EXPLORE_TRIALS = {"matter": 6, "best": 8, "scale": 8}


def draft(question: str, job_path: Path, out: Path, planner: str = "", planner_model: str = "") -> tuple[dict, str]:
    """The draft study for ``question`` on the job at ``job_path`` (checked, budget sized) and
    a line saying how it was read.  UserError for anything it cannot turn into a valid study."""
    from actorjet.config import load_job

    if not question.strip():
        raise UserError("ask a question, e.g. \"does lr matter\" (forms: " + "; ".join(FORMS) + ")")
    job = load_job(job_path)
    out.parent.mkdir(parents=True, exist_ok=True)      # (the base job's path is written relative to it)
    raw = tomllib.loads(job_path.read_text())
    if planner:
        part, how = _from_planner(question, job, planner, planner_model)
    else:
        part, how = _from_grammar(question, job, raw)
    base = part.pop("base_job", None) or os.path.relpath(job_path.resolve(), out.resolve().parent)
    spec = {"question": question.strip(), "base_job": base, "metric": part["metric"], "knobs": part["knobs"],
            "explore": {"trials": part.get("explore_trials", 8), "min_evals": 1},
            "seeds": {"baseline": 3, "explore": 1, "confirm": 3, "ablate": 3}, "decision": {"confidence": 0.95}}
    spec["budget"] = {"max_trials": 1000, "max_wall_s": 1e9, "parallel": 1}
    study = _check(spec, out.resolve().parent, how)
    plan = make_plan(study)
    spec["budget"] = {"max_trials": plan["trials_at_most"],
                      "max_wall_s": float(60 * math.ceil(1.5 * plan["estimate_s"] / 60)), "parallel": 1}
    check_budget(_check(spec, out.resolve().parent, how), plan)
    return spec, how


def _check(spec: dict, base_dir: Path, how: str) -> dict:
    try:
        return check_study(json.loads(json.dumps(spec)), "draft", base_dir=base_dir)
    except UserError as e:
        raise UserError(f"{how}, but the draft is not a valid study: {e}") from None


# -- the grammar -------------------------------------------------------------------------------
def _from_grammar(question: str, job: dict, raw: dict) -> tuple[dict, str]:
    text = re.sub(r"\s+", " ", question.strip().rstrip("?.! ")).lower()
    for index, (form, pattern) in enumerate(PATTERNS):
        m = re.fullmatch(pattern, text)
        if m:
            parts = {k: v for k, v in m.groupdict().items() if v}
            return getattr(_Forms, form)(job, raw, parts), f"read as \"{FORMS[index]}\" (the grammar)"
    raise UserError(f"cannot read {question.strip()!r} as a study; ask one of: " + "; ".join(FORMS)
                    + " (or give --planner URL, an OpenAI-compatible endpoint, for free-form questions)")


def metric(words: str | None) -> dict:
    if not words:
        return {"kind": "final_accuracy"}
    words = re.sub(r"^the ", "", words.strip())
    if words in METRIC_WORDS:
        return {"kind": METRIC_WORDS[words]}
    m = re.fullmatch(r"(?:the )?(?:number of )?steps to (?:reach )?(\d+(?:\.\d+)?)\s*%?(?: accuracy)?", words)
    if m:
        threshold = float(m.group(1)) / (100 if float(m.group(1)) > 1 else 1)
        if not 0 < threshold < 1:
            raise UserError(f"steps to {m.group(1)}: the accuracy threshold must be between 0% and 100%")
        return {"kind": "steps_to", "threshold": threshold}
    raise UserError(f"no metric called {words!r}: accuracy (final held-out accuracy), auc or learning speed "
                        "(area under the held-out curve), or \"steps to N%\"")


def _knob_with_range(job: dict, words: str) -> tuple[str, dict]:
    path = resolve(job, words)
    entry = catalogue(job)[path]
    if entry["explore"] is None:
        raise UserError(f"{path} ({entry['meaning']}) is not a learning knob with a default range; "
                        f"name one: \"best {words} between A and B\"")
    return path, dict(entry["explore"])


def _value(text: str, kind: str):
    text = text.strip(",;")
    if kind in ("float", "int"):
        try:
            number = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
        except ValueError:
            raise UserError(f"{text!r} is not a number") from None
        return int(number) if kind == "int" and number.is_integer() else number
    if kind == "bool":
        if text not in ("true", "false"):
            raise UserError(f"{text!r}: this knob is true or false")
        return text == "true"
    return text


class _Forms:
    """Each grammar form → the parts of a study: metric, knobs, explore trials (and an inline
    base job when the question narrows the job)."""

    @staticmethod
    def matter(job: dict, raw: dict, p: dict) -> dict:
        path, rule = _knob_with_range(job, p["knob"])
        return {"metric": metric(p.get("metric")), "knobs": {path: rule}, "explore_trials": EXPLORE_TRIALS["matter"]}

    @staticmethod
    def scale(job: dict, raw: dict, p: dict) -> dict:
        path, rule = _knob_with_range(job, p["knob"])
        return {"metric": metric(p["metric"]), "knobs": {path: rule}, "explore_trials": EXPLORE_TRIALS["scale"]}

    @staticmethod
    def best(job: dict, raw: dict, p: dict) -> dict:
        path = resolve(job, p["knob"])
        entry = catalogue(job)[path]
        a, b = sorted((_value(p["a"], entry["type"]), _value(p["b"], entry["type"])),
                      key=lambda v: (not isinstance(v, (int, float)), v))
        if entry["type"] in ("float", "int"):
            if a == b:
                raise UserError(f"best {p['knob']} between {p['a']} and {p['b']}: the two ends are the same")
            kind = ("int_uniform" if entry["type"] == "int" else
                    "log_uniform" if (entry["explore"] or {}).get("log_uniform") and a > 0 else "uniform")
            rule = {kind: [a, b]}
        else:
            rule = {"choice": [a, b]}
        return {"metric": metric(p.get("metric")), "knobs": {path: rule}, "explore_trials": EXPLORE_TRIALS["best"]}

    @staticmethod
    def compare(job: dict, raw: dict, p: dict) -> dict:
        from actorjet.rl.algorithms import ALGORITHMS

        arms = [a for a in re.split(r"\s*(?:,|\band\b|\bvs\.?|\bversus\b|\bor\b)\s*", p["arms"]) if a]
        unknown = [a for a in arms if a.replace("-", "_").replace("++", "_pp") not in ALGORITHMS]
        if unknown or len(arms) < 2:
            raise UserError(f"compare: name two or more algorithms ({', '.join(ALGORITHMS)}); "
                            f"{'unknown: ' + ', '.join(unknown) if unknown else 'got one'}")
        arms = list(dict.fromkeys(a.replace("-", "_").replace("++", "_pp") for a in arms))
        trained = [m["name"] for m in job["models"] if m["trainable"]]
        if len(trained) != 1:
            raise UserError(f"compare: the base job trains {len(trained)} models ({', '.join(trained)}); give a base "
                            "job with one trained model, or a planner")
        from actorjet.config import examples_name

        tasks = [t for t in job["tasks"] if p["task"] in (t["name"], t["source"], t["source"].rsplit(".", 1)[-1])
                 or examples_name(p["task"]) == t["source"]]
        if not tasks:
            raise UserError(f"compare: the base job has no task {p['task']!r} (its tasks: "
                            f"{', '.join(t['name'] for t in job['tasks'])}); give a base job that trains it")
        part = {"metric": metric(p.get("metric")), "knobs": {f"models.{trained[0]}.algorithm": {"choice": arms}},
                "explore_trials": max(4, 2 * len(arms))}
        if len(job["tasks"]) > 1:       # the question is about one task: the study's job trains it alone
            part["base_job"] = {**raw, "tasks": [t for t in raw.get("tasks", []) if t.get("name") == tasks[0]["name"]]}
        return part


# -- the LLM planner ---------------------------------------------------------------------------
PROMPT = """You design a reinforcement-learning study for ActorJet.
Question: {question}
Knobs (job fields a study may vary; path, type, value in the base job, meaning, default range):
{knobs}
Metrics: final_accuracy (held-out accuracy at the end), auc (area under the held-out curve),
steps_to (steps to reach an accuracy threshold, needs "threshold" between 0 and 1).
A knob's range is one of {{"log_uniform": [low, high]}}, {{"uniform": [low, high]}},
{{"int_uniform": [low, high]}}, {{"choice": [values]}}.
Answer with one JSON object only, e.g.
{{"metric": {{"kind": "final_accuracy"}}, "knobs": {{"models.policy.lr": {{"log_uniform": [1e-5, 1e-3]}}}},
"explore_trials": 8, "why": "one sentence"}}"""


def _from_planner(question: str, job: dict, url: str, model: str) -> tuple[dict, str]:
    from actorjet.research.planner import ask_json

    knobs = "\n".join(f"- {e['path']} ({e['type']}, now {e['value']!r}): {e['meaning']}; {json.dumps(e['explore'])}"
                      for e in studiable(job).values())
    try:
        part, model, text = ask_json(url, model, PROMPT.format(question=question.strip(), knobs=knobs))
    except ValueError as e:
        raise UserError(str(e)) from None
    how = f"drafted by the planner at {url} (model {model})"
    if not isinstance(part.get("knobs"), dict) or not part["knobs"]:
        raise UserError(f"{how}, but its answer names no knobs: {text[:200]!r}")
    explore = part.get("explore_trials", 8)
    out = {"metric": part.get("metric") if isinstance(part.get("metric"), dict) else {"kind": "final_accuracy"},
           "knobs": part["knobs"], "explore_trials": explore if isinstance(explore, int) and 1 <= explore <= 64 else 8}
    why = part.get("why")
    return out, how + (f"; its reason: {why.strip()[:300]}" if isinstance(why, str) and why.strip() else "")


def to_toml(spec: dict, how: str, out: Path) -> str:
    import tomli_w

    header = [f"# Drafted by `actorjet research ask`: {how}.",
              "# Review it (the knobs, their ranges, the budget), then:",
              f"#   actorjet research plan {out}", f"#   actorjet research run {out}"]
    return "\n".join(header) + "\n" + tomli_w.dumps(spec)
