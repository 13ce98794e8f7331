"""What to study next, from the evidence of the study that just ended (``research run
--follow-ups N``).  The playbook, in order:

1. **A change was adopted** (confirm's interval excluded 0): confirm it again at 3× the steps
   and with more seeds before anything is built on it (``followed_by = "long confirm"``).
2. **Otherwise, or once a change survived the long confirm**, build on the config the chain
   recommends and explore the next knob: the knob the last study's PED-ANOVA importance
   ranks first, narrowed to half its range around its best explored value, if that study
   varied several knobs and found any spread above ``min_effect``; else the next knob of
   ``PRIORITY`` the chain has not studied, over its catalogue range.
3. **Stop** when no knob of the playbook is left, or when the last two studies both found
   nothing above ``min_effect`` (their explored spread and every confirmed difference).

An LLM planner (``--planner URL``) may propose the next study instead; it is shown the
chain's story and the catalogue, and its proposal is checked like any spec.  An invalid one
is rejected with its reason and the playbook decides.  Every proposal carries its ``why``,
which the chain's report prints under the question it led to.
"""
from __future__ import annotations

import copy
import json
import math

from actorjet.research.catalogue import catalogue
from actorjet.research.study_spec import apply

PRIORITY = ("lr", "group_size", "clip_high", "max_staleness", "kl", "groups_per_step", "algorithm")
LONG = 3          # the long confirm's steps, as a multiple of the study's


def evidence(study: dict, reg) -> dict:
    """What a finished study found, in the numbers the playbook and the report use."""
    from actorjet.research.study_report import knob_importance

    decisions = reg.decisions()
    confirm = next((d["evidence"] for d in decisions if d["stage"] == "confirm"), {})
    best = next((d["evidence"].get("params", {}) for d in decisions if d["stage"] == "explore"), {})
    explored = [t["metric"] for t in reg.trials("explore", "done") if t["metric"] is not None]
    effects = [abs(d["evidence"]["diff"]) for d in decisions
               if d["stage"] in ("confirm", "ablate") and d["evidence"].get("detectable")]
    return {"adopted": bool(confirm.get("adopted")), "best": best,
            "spread": max(explored) - min(explored) if len(explored) > 1 else 0.0,
            "effect": max(effects, default=0.0), "importance": knob_importance(reg.trials(), study),
            "decisions": [d["text"] for d in decisions]}


def recommended_job(study: dict, found: dict) -> dict:
    """The base job the chain goes on from: the study's, with an adopted change applied (and
    the chain's own length again after a long confirm)."""
    job = copy.deepcopy(study["base_job"])
    if study.get("followed_by") == "long confirm":
        job["train"]["steps"] = max(1, job["train"]["steps"] // LONG)
    return apply(job, found["best"]) if found["adopted"] and found["best"] else job


def propose(study: dict, found: dict, chain: list[dict], min_effect: float) -> tuple[dict | None, str]:
    """The next study's spec (as data) and why; or (None, why the chain stops).  ``chain``: the
    finished links ({question, knobs, found}), this study's last."""
    steps = study["base_job"]["train"]["steps"]
    if found["adopted"] and study.get("followed_by") != "long confirm":
        changed = {k: v for k, v in found["best"].items() if v != study["knobs"][k]["base"]}
        job = apply(study["base_job"], {"train.steps": steps * LONG})
        knobs = {k: {"choice": [study["knobs"][k]["base"], v]} for k, v in changed.items()}
        seeds = {s: n + 2 for s, n in study["seeds"].items() if s != "explore"} | {"explore": 1}
        why = (f"the study adopted {show(changed)}; before building on it, confirm it at {LONG}× the steps "
               f"({steps * LONG}) with {seeds['confirm']} seeds a side")
        return spec_data(study, job, f"Does {show(changed)} still win over {steps * LONG} steps?", knobs,
                     max(2, len(knobs) * 2), seeds, "long confirm"), why
    quiet = [c for c in chain[-2:-1] if c["found"]["spread"] < min_effect and c["found"]["effect"] < min_effect]
    if quiet and found["spread"] < min_effect and found["effect"] < min_effect and not found["adopted"]:
        return None, (f"the last two studies found nothing above the stated effect size ({min_effect:g}): "
                      "the chain stops")
    job = recommended_job(study, found)
    ranked = [k for k, _ in sorted(found["importance"].items(), key=lambda kv: -kv[1])]
    if len(study["knobs"]) > 1 and ranked and found["spread"] >= min_effect:
        knob, rule = ranked[0], study["knobs"][ranked[0]]
        narrowed = _narrow(rule, found["best"].get(knob, rule["base"]))
        if narrowed is not None:
            why = (f"{knob} ranks first by PED-ANOVA importance ({found['importance'][knob]:.2f}) and the explored "
                   f"spread ({found['spread']:.3f}) is above {min_effect:g}: explore it again, narrowed around its "
                   f"best value {show(found['best'].get(knob))}")
            return spec_data(study, job, f"Which {knob} in {narrowed[next(iter(narrowed))]} is best?", {knob: narrowed},
                         study["explore"]["trials"], study["seeds"], "narrow"), why
    studied = {path.rsplit(".", 1)[1] for c in chain for path in c["knobs"]}
    table = catalogue(job)
    for name in PRIORITY:
        paths = [p for p, e in table.items() if p.rsplit(".", 1)[1] == name and e["explore"]
                 and not p.startswith("tasks.")]
        if paths and name not in studied:
            why = (f"nothing above {min_effect:g} is left to refine in {show(list(study['knobs']))} "
                   f"({'adopted and confirmed' if found['adopted'] else 'nothing adopted'}; explored spread "
                   f"{found['spread']:.3f}): study the playbook's next knob, {name}, on the recommended config")
            return spec_data(study, job, f"Does {name} matter?", {paths[0]: table[paths[0]]["explore"]},
                         study["explore"]["trials"], study["seeds"], "next knob"), why
    return None, "every knob of the playbook has been studied: the chain stops"


def _narrow(rule: dict, best) -> dict | None:
    if rule["kind"] == "choice" or not isinstance(best, (int, float)):
        return None
    low, high = rule["values"][0], rule["values"][1]
    if rule["kind"] == "log_uniform":
        half = (math.log(high) - math.log(low)) / 4
        new = [max(low, best * math.exp(-half)), min(high, best * math.exp(half))]
    else:
        half = (high - low) / 4
        new = [max(low, best - half), min(high, best + half)]
    if rule["kind"] == "int_uniform":
        new = [int(math.floor(new[0])), int(math.ceil(new[1]))]
    return {rule["kind"]: new} if new[0] < new[1] else None


def spec_data(study: dict, job: dict, question: str, knobs: dict, explore_trials: int, seeds: dict,
          followed_by: str) -> dict:
    """A follow-up's spec as data: the base job inline, the first study's metric, decision rule,
    budget per study and trial placement."""
    rules = {k: ({v["kind"]: v["values"]} if "kind" in v else v) for k, v in knobs.items()}
    return {"question": question, "base_job": {k: job[k] for k in ("models", "tasks", "train")},
            "metric": {k: v for k, v in study["metric"].items() if v is not None}, "knobs": rules,
            "explore": {"trials": explore_trials, "min_evals": study["explore"]["min_evals"]},
            "seeds": dict(seeds), "decision": dict(study["decision"]), "budget": dict(study["budget"]),
            "trials": dict(study["trials"]), "followed_by": followed_by}


def show(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} = {show(v)}" for k, v in value.items()) or "nothing"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# -- the LLM planner's turn ------------------------------------------------------------------------
PROMPT = """You direct a chain of reinforcement-learning studies on one job.
The chain so far (each study's question and its decisions):
{story}
Knobs of the recommended job (path, type, value, meaning, default range):
{knobs}
Propose the next study, or stop. Answer with one JSON object only:
{{"question": "...", "knobs": {{"PATH": {{"log_uniform" | "uniform" | "int_uniform" | "choice": [...]}}}},
"explore_trials": 6, "why": "one sentence"}}   or   {{"stop": "why"}}"""


def ask_planner(url: str, model: str, study: dict, found: dict, chain: list[dict]) -> tuple[dict | None, str]:
    """The planner's next study (checked by the caller) and its why; ValueError if unusable."""
    from actorjet.research.planner import ask_json

    job = recommended_job(study, found)
    story = "\n".join(f"{i + 1}. {c['question']}\n   " + "\n   ".join(c["found"]["decisions"])
                      for i, c in enumerate(chain))
    knobs = "\n".join(f"- {e['path']} ({e['type']}, now {e['value']!r}): {e['meaning']}; {json.dumps(e['explore'])}"
                      for e in catalogue(job).values() if e["explore"])
    part, model, text = ask_json(url, model, PROMPT.format(story=story, knobs=knobs))
    why = str(part.get("why") or part.get("stop") or "")[:300]
    if "stop" in part:
        return None, f"the planner stops the chain: {why}"
    if not isinstance(part.get("question"), str) or not isinstance(part.get("knobs"), dict) or not part["knobs"]:
        raise ValueError(f"the planner's proposal needs a question and knobs: {text[:200]!r}")
    trials = part.get("explore_trials", study["explore"]["trials"])
    trials = trials if isinstance(trials, int) and 1 <= trials <= 64 else study["explore"]["trials"]
    spec = spec_data(study, job, part["question"], part["knobs"], trials, study["seeds"], "planner")
    return spec, f"the planner at {url} (model {model}): {why}"
