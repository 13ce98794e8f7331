"""Runs a study's plan unattended: baseline → explore → confirm → ablate → report.

Every trial is a real ActorJet job in its own process (trial.py); at most
``budget.parallel`` run at once.  What happened is only ever read back from the registry,
so killing the controller at any moment and running it again resumes: finished trials are
never run again, trials that were in flight are stopped (by the PID the registry holds)
and re-run, and the plan is not re-drawn.  A trial that fails is retried once, then
recorded as failed with the tail of its log; the study goes on.
"""
from __future__ import annotations

import copy
import itertools
import json
import time
from pathlib import Path

from actorjet.research import plan as planning
from actorjet.research import stats
from actorjet.research.launchers import LocalTrials
from actorjet.research.study_db import StudyRegistry
from actorjet.research.study_spec import apply, distributions, within

POLL_S = 1.0


def score(evals: list, metric: dict, steps: int) -> float | None:
    """The study's metric of one trial from its evals [(step, accuracy)]; higher is better
    (``steps_to`` is negated: fewer steps to the threshold is better)."""
    if not evals:
        return None
    if metric["kind"] == "final_accuracy":
        return evals[-1][1]
    if metric["kind"] == "auc":
        return sum(a for _, a in evals) / len(evals)
    reached = [s for s, a in evals if a >= metric["threshold"]]
    return -float(reached[0] if reached else 2 * steps)     # never reached: twice the budget


class Controller:
    """``launcher``: where trials run (launchers.py): this machine by default, or a swarm's nodes."""

    def __init__(self, study: dict, study_dir: str | Path, say=print, launcher=None):
        self.study, self.dir, self.say = study, Path(study_dir), say
        self.reg = StudyRegistry(self.dir)
        self.reg.bind(study, planning.make_plan(study))
        self.plan = self.reg.get("plan")
        self.deadline = self.reg.get("started") + study["budget"]["max_wall_s"]
        self.launcher = launcher or LocalTrials(study, self.dir)
        self.running: dict[int, tuple[object, object]] = {}     # trial id → (launcher's handle, optuna trial)
        self.steps = study["base_job"]["train"]["steps"]
        self.out_of_budget = ""
        self.model_paths = {}             # on a swarm each node builds the study's model from its seed
        if isinstance(self.launcher, LocalTrials):
            from actorjet.models.prepare import prepare

            prepared = prepare(copy.deepcopy(study["base_job"]))
            self.model_paths = {m["name"]: m["path"] for m in prepared["models"]}

    # -- the stages ---------------------------------------------------------------------------
    def run(self, progress=None) -> dict:
        self._recover()
        self.progress = progress
        try:
            self._stage_baseline()
            best = self._stage_explore()
            adopted = self._stage_confirm(best)
            self._stage_ablate(best, adopted)
        finally:
            self.launcher.close()
        if self.out_of_budget:
            self.reg.put("stopped", self.out_of_budget)
        return {"best": best, "adopted": adopted}

    def _stage_baseline(self) -> None:
        for seed in self.plan["seeds"]["baseline"]:
            self.reg.add_trial("baseline", "baseline", seed, {}, self._job({}, seed))
        self._run_queued("baseline")
        if not self.reg.decided("baseline"):
            values = self._values("baseline", "baseline")
            mean, low, high = stats.mean_ci(values, self.study["decision"]["confidence"])
            self.reg.decide("baseline", f"baseline {self._name()}: {mean:.3f} [{low:.3f}, {high:.3f}] "
                            f"over {len(values)} seeds", {"values": values})

    def _stage_explore(self) -> dict:
        decided = [d for d in self.reg.decisions() if d["stage"] == "explore"]
        if decided:
            return decided[0]["evidence"]["params"]
        import optuna

        self.knobs = self._explore_knobs()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        n = self.study["explore"]["trials"]
        sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=max(2, n // 3))
        eval_every = self.study["base_job"]["models"][0]["eval_every"]
        first_cut = eval_every * self.study["explore"]["min_evals"]     # steps before a trial may be stopped
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=first_cut, reduction_factor=3)
        storage = f"sqlite:///{self.dir / 'optuna.sqlite'}"
        self.optuna = optuna.create_study(study_name="explore", storage=storage, load_if_exists=True,
                                          direction="maximize", sampler=sampler, pruner=pruner)
        for stale in self.optuna.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            self.optuna._storage.set_trial_state_values(stale._trial_id, optuna.trial.TrialState.FAIL)
        seed = self.plan["seeds"]["explore"][0]
        base = {k: v["base"] for k, v in self.study["knobs"].items()}
        if not self.reg.trials("explore"):
            for params in self._first_asks(base, n):
                self.optuna.enqueue_trial(params)
        while True:
            asked = len(self.reg.trials("explore"))
            for t in self.reg.trials("explore", "queued"):     # in flight when the controller died, or retried
                if self._free() and not self._over():
                    self._start(t, self._ask(t["params"]))
            while not self.reg.trials("explore", "queued") and self._free() and asked < n and not self._over():
                trial = self._ask(None)
                params = {name: trial.params[name] for name in self.study["knobs"]}
                job = self._job(params, seed, "validation")
                tid = self.reg.add_trial("explore", f"t{trial.number}", seed, params, job, trial.number)
                self._start(self._trial(tid), trial)
                asked += 1
            if not self.running and (asked >= n or self._over()):
                break
            self._poll()
        done = [t for t in self.reg.trials("explore", "done") if t["metric"] is not None]
        if not done:
            best = {}
            self.reg.decide("explore", "explore: no trial finished; the base config stays", {"params": best})
            return best
        top = max(done, key=lambda t: t["metric"])
        pruned = len(self.reg.trials("explore", "pruned"))
        self.reg.decide("explore", f"explore: best of {len(done)} finished trials ({pruned} stopped early) is "
                        f"{_show(top['params'])} with {self._name()} {self._natural(top['metric']):.3f}",
                        {"params": top["params"], "trial": top["id"], "metric": top["metric"]})
        return top["params"]

    def _first_asks(self, base: dict, n: int) -> list[dict]:
        """The base config competes too; and when every knob is a choice and the trials can
        cover every combination, each is tried once (TPE alone may never draw an arm of a
        comparison)."""
        first = [base] if all(within(v["base"], v) for v in self.knobs.values()) else []
        if all(k["kind"] == "choice" for k in self.knobs.values()):
            grid = [dict(zip(self.knobs, values)) for values in itertools.product(
                *(k["values"] for k in self.knobs.values()))]
            if len(grid) <= n:
                first += [g for g in grid if g not in first]
        return first

    def _explore_knobs(self) -> dict:
        """The ranges to explore: the spec's, or the LLM planner's narrower ones if it proposed
        valid ones (decided once, before the first explore trial, and kept on resume)."""
        kept = self.reg.get("explore_knobs")
        if kept is not None:
            return kept
        knobs = self.study["knobs"]
        if self.study.get("planner"):
            from actorjet.research import planner

            baseline = self._values("baseline", "baseline")
            try:
                proposal = planner.propose(self.study, baseline)
                knobs = planner.validate(self.study, proposal)
                self.reg.decide("plan", f"planner: accepted: {json.dumps(proposal.get('knobs'))} "
                                f"({str(proposal.get('why', ''))[:200]})", {"proposal": proposal})
            except ValueError as e:
                self.reg.decide("plan", f"planner: proposal rejected ({e}); the playbook's ranges are used",
                                {"reason": str(e)})
        self.reg.put("explore_knobs", knobs)
        return knobs

    def _stage_confirm(self, best: dict) -> bool:
        decided = [d for d in self.reg.decisions() if d["stage"] == "confirm"]
        if decided:
            return decided[0]["evidence"]["adopted"]
        if not self._changed(best):
            self.reg.decide("confirm", "confirm: the base config is the best explored; nothing to confirm, "
                            "the baseline stays", {"adopted": False})
            return False
        for seed in self.plan["seeds"]["confirm"]:
            self.reg.add_trial("confirm", "best", seed, best, self._job(best, seed))
            self.reg.add_trial("confirm", "baseline", seed, {}, self._job({}, seed))
        self._run_queued("confirm")
        a, b = self._values("confirm", "best"), self._values("confirm", "baseline")
        d = stats.diff_ci(a, b, self.study["decision"]["confidence"])
        adopted = bool(best) and d["detectable"] and d["diff"] > 0
        verdict = ("adopted: the best config beats the baseline" if adopted else
                   "not compared: too few finished trials, the baseline stays" if min(d["n"]) < 2 else
                   "no detectable difference: the baseline stays" if not d["detectable"] else
                   "rejected: the best config is worse than the baseline on fresh seeds")
        self.reg.decide("confirm", f"confirm: {_show(best)} vs baseline: {self._name()} difference "
                        f"{self._diff_text(d)}; {verdict}", {"adopted": adopted, "best": a, "baseline": b, **d})
        return adopted

    def _changed(self, params: dict) -> list[str]:
        return [k for k, v in params.items() if v != self.study["knobs"][k]["base"]]

    def _stage_ablate(self, best: dict, adopted: bool) -> None:
        """Each knob changed alone, from the config the study recommends (the adopted one, else
        the base): a knob the explored best set differently takes that value; an adopted change
        is reverted; a choice knob left as it was is switched to another choice.  So every knob
        gets an answer — it matters, or "no detectable difference" — whatever confirm decided."""
        base = {k: v["base"] for k, v in self.study["knobs"].items()}
        recommended = best if adopted else base
        # the recommended config's own trials on fresh seeds: confirm's, or the baseline stage's
        # when confirm had nothing to run (the base config was the best explored)
        against = self._values("confirm", "best" if adopted else "baseline") or self._values("baseline", "baseline")
        arms = {}
        for knob, k in self.study["knobs"].items():
            explored = best.get(knob, k["base"])
            if explored != recommended[knob]:
                arms[knob] = (f"{knob} = {_show(explored)}", explored)
            elif recommended[knob] != k["base"]:
                arms[knob] = (f"without {knob}", k["base"])
            elif k["kind"] == "choice" and len(k["values"]) > 1:
                other = next(v for v in k["values"] if v != recommended[knob])
                arms[knob] = (f"{knob} = {_show(other)}", other)
        for knob, (arm, value) in arms.items():
            for seed in self.plan["seeds"]["ablate"]:
                params = dict(recommended, **{knob: value})
                self.reg.add_trial("ablate", arm, seed, params, self._job(params, seed))
        self._run_queued("ablate")
        if self.reg.decided("ablate"):
            return
        where = "the adopted config" if adopted else "the base config"
        for knob, (arm, value) in arms.items():
            d = stats.diff_ci(against, self._values("ablate", arm), self.study["decision"]["confidence"])
            change = f"set to {_show(value)} alone in {where} (there: {_show(recommended[knob])})"
            text = (f"{knob} matters: {change}, {self._name()} changes by {self._diff_text(d, sign=-1)}"
                    if d["detectable"] else
                    f"{knob}: not compared: too few finished trials (n = {d['n'][1]} vs {d['n'][0]})"
                    if min(d["n"]) < 2 else
                    f"{knob}: no detectable difference when {change}: {self._diff_text(d, sign=-1)}")
            self.reg.decide("ablate", "ablate: " + text, {"knob": knob, "arm": arm, **d})
        for knob in (k for k in self.study["knobs"] if k not in arms):
            self.reg.decide("ablate", f"ablate: {knob}: nothing to vary it to, not ablated", {"knob": knob})

    # -- trials ---------------------------------------------------------------------------------
    def _job(self, params: dict, seed: int, split: str = "test") -> dict:
        """A trial's job: the knob values, its own training seed, the study's one starting model
        (built once from the base job's seed: a seed varies training, not the model), and the
        held-out split it is measured on: explore selects on ``validation``, every other stage
        compares on ``test``, so the report's figures are not the ones selection was tuned to."""
        job = apply(self.study["base_job"], params)
        job["train"]["seed"] = seed
        for model in job["models"]:
            if model["name"] in self.model_paths:
                model["path"] = self.model_paths[model["name"]]
            model["eval_split"] = split
        return job

    def _ask(self, params: dict | None):
        if params is not None:             # re-run a trial that was in flight: the same values
            self.optuna.enqueue_trial(params)
        return self.optuna.ask(distributions(self.knobs))

    def _run_queued(self, stage: str) -> None:
        while True:
            for t in self.reg.trials(stage, "queued"):
                if not self._free() or self._over():
                    break
                self._start(t, None)
            if not self.running and (self._over() or not self.reg.trials(stage, "queued")):
                return                   # (a swarm with no free trial slot yet: its trials wait)
            self._poll()

    def _trial(self, tid: int) -> dict:
        return next(t for t in self.reg.trials() if t["id"] == tid)

    def _free(self) -> bool:
        return self.launcher.room()

    def _over(self) -> bool:
        launched = sum(1 for t in self.reg.trials() if t["attempts"] > 0)
        if time.time() > self.deadline:
            self.out_of_budget = f"budget.max_wall_s ({self.study['budget']['max_wall_s']:.0f} s) used up"
        elif launched >= self.study["budget"]["max_trials"]:
            self.out_of_budget = f"budget.max_trials ({self.study['budget']['max_trials']}) used up"
        return bool(self.out_of_budget)

    def _start(self, t: dict, optuna_trial) -> None:
        started = self.launcher.start(t)
        if started is None:               # no room after all (a swarm shared with others): stays queued
            if optuna_trial is not None:
                from optuna.trial import TrialState

                self.optuna.tell(optuna_trial, state=TrialState.FAIL)
            return
        handle, fields, where = started
        self.reg.update(t["id"], state="running", attempts=t["attempts"] + 1, started=time.time(), evals=[], **fields)
        if optuna_trial is not None:
            self.reg.update(t["id"], optuna=optuna_trial.number)
        self.running[t["id"]] = (handle, optuna_trial)
        self.say(f"trial {t['id']} ({t['stage']}, {t['arm']}, seed {t['seed']}) started{where}")

    def _poll(self) -> None:
        time.sleep(POLL_S)
        import optuna

        for tid, (handle, ot) in list(self.running.items()):
            t = self._trial(tid)
            look = self.launcher.look(t, handle)
            evals = look.evals
            if len(evals) != len(t["evals"]):
                self.reg.update(tid, evals=evals)
                if ot is not None and evals[-1][0] > 0 and not look.over:
                    ot.report(evals[-1][1], evals[-1][0])
                    if ot.should_prune():
                        self.launcher.stop(t, handle)
                        del self.running[tid]
                        metric = score(evals, self.study["metric"], self.steps)
                        self.reg.update(tid, state="pruned", finished=time.time(), metric=metric)
                        self.optuna.tell(ot, state=optuna.trial.TrialState.PRUNED)
                        self.say(f"trial {tid} stopped early at step {evals[-1][0]} (pruner)")
                        self._advance(t)
                        continue
            if not look.over:
                continue
            del self.running[tid]
            value = score(evals, self.study["metric"], self.steps)
            if look.lost:                 # not the trial's fault: it runs again, and counts once
                self.reg.update(tid, state="queued", pid=None, attempts=t["attempts"] - 1, log_tail=look.tail)
                if ot is not None:
                    self.optuna.tell(ot, state=optuna.trial.TrialState.FAIL)
                self.say(f"trial {tid} lost ({look.tail}); it runs again on another node")
                continue
            if look.code == 0 and value is not None:
                self.reg.update(tid, state="done", metric=value, finished=time.time(), pid=None)
                if ot is not None:
                    self.optuna.tell(ot, value)
                self.say(f"trial {tid} done: {self._name()} {self._natural(value):.3f}")
            elif t["attempts"] < 2:
                self.reg.update(tid, state="queued", pid=None, log_tail=look.tail)
                if ot is not None:
                    self.optuna.tell(ot, state=optuna.trial.TrialState.FAIL)
                self.say(f"trial {tid} failed (exit {look.code}); retrying once")
            else:
                self.reg.update(tid, state="failed", pid=None, finished=time.time(), log_tail=look.tail)
                if ot is not None:
                    self.optuna.tell(ot, state=optuna.trial.TrialState.FAIL)
                self.say(f"trial {tid} failed twice; recorded as failed (see {t['run_dir']}/trial.log)")
            self._advance(t)

    def _advance(self, t: dict) -> None:
        if self.progress is not None:
            self.progress(t["stage"])

    def _recover(self) -> None:
        """After a killed controller: the trials it left running are stopped (by the PIDs the
        registry holds: only processes this study started) and queued again, unless they
        finished meanwhile where the launcher can tell (a swarm's head keeps their end)."""
        for t in self.reg.trials(state="running"):
            look = self.launcher.recover(t)
            value = look and score(look.evals, self.study["metric"], self.steps)
            if look is not None and not look.lost and look.code == 0 and value is not None:
                self.reg.update(t["id"], state="done", evals=look.evals, metric=value, finished=time.time(), pid=None)
                self.say(f"trial {t['id']} finished while the controller was down: {self._name()} "
                         f"{self._natural(value):.3f}")
                continue
            self.reg.update(t["id"], state="queued", pid=None, attempts=max(0, t["attempts"] - 1))
            self.say(f"trial {t['id']} was in flight when the controller stopped: it runs again")
        self._stop_strays()

    def _stop_strays(self) -> None:
        self.launcher.strays()

    # -- numbers ------------------------------------------------------------------------------------
    def _values(self, stage: str, arm: str) -> list[float]:
        return [t["metric"] for t in self.reg.trials(stage, "done") if t["arm"] == arm and t["metric"] is not None]

    def _name(self) -> str:
        m = self.study["metric"]
        return {"final_accuracy": "final held-out accuracy", "auc": "mean held-out accuracy over the run",
                "steps_to": f"steps to {m['threshold'] or 0:.0%} held-out accuracy"}[m["kind"]]

    def _natural(self, value: float) -> float:
        return -value if self.study["metric"]["kind"] == "steps_to" else value

    def _diff_text(self, d: dict, sign: int = 1) -> str:
        flip = -1 if self.study["metric"]["kind"] == "steps_to" else 1
        lo, hi = sorted((sign * flip * d["low"], sign * flip * d["high"]))
        blo, bhi = sorted((sign * flip * d["boot_low"], sign * flip * d["boot_high"]))
        return (f"{sign * flip * d['diff']:+.3f} ({self.study['decision']['confidence']:.0%} CI {lo:+.3f} … {hi:+.3f} "
                f"(Welch t; bootstrap {blo:+.3f} … {bhi:+.3f}), d = {sign * flip * d['d']:.2f}, "
                f"n = {d['n'][0]} vs {d['n'][1]}, test split)")


def _show(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} = {_show(v)}" for k, v in value.items()) or "the base config"
    return f"{value:.3g}" if isinstance(value, float) else repr(value)
