"""A study's plan: its stages, how many trials each may run, how long that should take.
Fixed before the first trial (the seeds of every stage included) and stored in the registry,
so a resumed study never re-draws it.

    baseline   the base job, ``seeds.baseline`` seeds
    explore    ``explore.trials`` Optuna (TPE) trials over the knobs, one seed each, losing
               trials stopped early on their periodic evals (successive halving)
    confirm    the best explored config and the base job, ``seeds.confirm`` fresh seeds each
    ablate     each knob the best config changed, reverted alone, ``seeds.ablate`` fresh seeds
    report     from the registry alone
"""
from __future__ import annotations

from actorjet.errors import UserError

SEED_BASE = {"baseline": 1000, "explore": 2000, "confirm": 3000, "ablate": 4000}
STARTUP_S = 25.0          # an embedded head, its model and its first evaluation (2-core machine)
STEP_S = 0.45             # one quickstart-sized learner step, on the same machine


def seeds(stage: str, n: int) -> list[int]:
    return [SEED_BASE[stage] + i for i in range(n)]


def make_plan(study: dict) -> dict:
    s, steps = study["seeds"], study["base_job"]["train"]["steps"]
    stages = [("baseline", s["baseline"]), ("explore", study["explore"]["trials"] * s["explore"]),
              ("confirm", 2 * s["confirm"]), ("ablate", len(study["knobs"]) * s["ablate"])]
    trials = sum(n for _, n in stages)
    per_trial = STARTUP_S + steps * STEP_S
    estimate = trials * per_trial / study["budget"]["parallel"]
    return {"stages": [{"name": name, "trials_at_most": n} for name, n in stages] + [{"name": "report"}],
            "trials_at_most": trials, "seconds_per_trial": per_trial, "estimate_s": estimate,
            "seeds": {stage: seeds(stage, s[stage]) for stage in SEED_BASE}}


def check_budget(study: dict, plan: dict) -> None:
    budget = study["budget"]
    if plan["trials_at_most"] > budget["max_trials"]:
        raise UserError(f"the plan needs up to {plan['trials_at_most']} trials but budget.max_trials is "
                        f"{budget['max_trials']}: raise it, or lower explore.trials or the seeds")
    if plan["seconds_per_trial"] * (study["seeds"]["baseline"] + 2 * study["seeds"]["confirm"]) \
            / budget["parallel"] > budget["max_wall_s"]:
        raise UserError(f"budget.max_wall_s = {budget['max_wall_s']:.0f} s cannot even fit the baseline and "
                        f"confirm stages (~{plan['seconds_per_trial']:.0f} s per trial)")
