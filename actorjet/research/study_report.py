"""A study's report, generated from its registry alone: ``report.md``, ``results.json`` and
figures (learning curves per arm with 95% bands; the explored values, finished vs stopped
early; knob importance: each knob's ablation effect with its interval, and Optuna's PED-ANOVA
importance over the finished explore trials).  Nothing here reads a trial's terminal output
or the controller's memory."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from actorjet.research import stats
from actorjet.research.study_db import StudyRegistry


def build(study_dir: str | Path) -> Path:
    reg = StudyRegistry(study_dir)
    study, plan = reg.get("spec"), reg.get("plan")
    if study is None:
        from actorjet.errors import UserError

        raise UserError(f"{study_dir} holds no study (run `actorjet research run STUDY.toml --dir {study_dir}`)")
    out = Path(study_dir)
    trials, decisions = reg.trials(), reg.decisions()
    importance = knob_importance(trials, study)
    figures = [_curves(out, trials), _explored(out, trials, study), _importance(out, decisions, importance)]
    conclusion = _conclusion(decisions)
    results = {"question": study["question"], "metric": study["metric"], "conclusion": conclusion,
               "knob_importance": importance,
               "stopped": reg.get("stopped"), "decisions": decisions,
               "trials": [{k: t[k] for k in ("id", "stage", "arm", "seed", "params", "config_hash", "state",
                                             "attempts", "metric", "run_dir")} for t in trials],
               "plan": plan}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [f"# Study: {study['question']}", "", f"**Conclusion.** {conclusion}", ""]
    if reg.get("stopped"):
        lines += [f"**Stopped early:** {reg.get('stopped')}; the stages after it did not run.", ""]
    lines += ["## Plan (fixed before the first trial)", "",
              "| stage | trials at most |", "|---|---|"]
    lines += [f"| {s['name']} | {s.get('trials_at_most', '')} |" for s in plan["stages"]]
    lines += ["", f"Metric: {study['metric']['kind']}"
              + (f" (threshold {study['metric']['threshold']})" if study['metric']['kind'] == 'steps_to' else "")
              + f"; decisions need the {study['decision']['confidence']:.0%} Welch t interval of a difference "
              "to exclude 0 (the bootstrap interval is shown next to it). Explore selects on the "
              "'validation' held-out split; baseline, confirm and ablate are measured on 'test'.",
              "", "## Decisions", ""]
    lines += [f"- **{d['stage']}**: {d['text']}" for d in decisions]
    lines += ["", "## Arms (test split)", "", "| stage | arm | seeds done | mean | 95% CI (t) |",
              "|---|---|---|---|---|"]
    for (stage, arm), values in _arms(trials).items():
        mean, low, high = stats.mean_ci(values)
        lines.append(f"| {stage} | {arm} | {len(values)} | {mean:.3f} | {low:.3f} … {high:.3f} |")
    states = {}
    for t in trials:
        states[t["state"]] = states.get(t["state"], 0) + 1
    lines += ["", "## Trials", "", ", ".join(f"{n} {s}" for s, n in sorted(states.items())), "",
              "| id | stage | arm | seed | state | metric | run dir |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {t['id']} | {t['stage']} | {t['arm']} | {t['seed']} | {t['state']} | {_number(t['metric'])} | "
              f"`{t['run_dir']}` |" for t in trials]
    lines += ["", "## Knob importance", "",
              "Optuna's PED-ANOVA over the finished explore trials: " + (", ".join(
                  f"{k} {v:.2f}" for k, v in importance.items()) if importance else
                  "not computed (fewer than 3 finished explore trials)") + ". The ablation decisions above "
              "give each knob's effect with its interval (importance.png)."]
    lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures if p is not None]
    lines += ["", "Limitations: metrics are the learner's greedy evaluations of one task source's held-out "
              "splits; 3 seeds per arm detect only large effects."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _number(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _arms(trials: list[dict]) -> dict:
    arms: dict = {}
    for t in trials:
        if t["state"] == "done" and t["metric"] is not None and t["stage"] != "explore":
            arms.setdefault((t["stage"], t["arm"]), []).append(t["metric"])
    return arms


def _conclusion(decisions: list[dict]) -> str:
    for stage in ("confirm", "explore", "baseline"):
        found = [d["text"] for d in decisions if d["stage"] == stage]
        if found:
            return found[-1]
    return "no stage finished yet."


def _curves(out: Path, trials: list[dict]) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms: dict = {}
    for t in trials:
        if t["state"] == "done" and t["stage"] in ("confirm", "ablate", "baseline"):
            arms.setdefault(f"{t['stage']}: {t['arm']}", []).append(dict(t["evals"]))
    if not arms:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in arms.items():
        steps = sorted(set.intersection(*(set(r) for r in runs)))
        means = [statistics.fmean(r[s] for r in runs) for s in steps]
        bands = [stats.mean_ci([r[s] for r in runs])[1:] for s in steps]
        ax.plot(steps, means, label=f"{label} (n={len(runs)})")
        if len(runs) > 1:
            ax.fill_between(steps, [b[0] for b in bands], [b[1] for b in bands], alpha=0.2)
    ax.set_xlabel("learner step")
    ax.set_ylabel("held-out accuracy")
    ax.legend(fontsize=7)
    ax.set_title("learning curves per arm (mean, 95% t band)")
    return _save(fig, out / "curves.png")


def _explored(out: Path, trials: list[dict], study: dict) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    explore = [t for t in trials if t["stage"] == "explore" and t["evals"]]
    numeric = [k for k, v in study["knobs"].items() if v["kind"] != "choice"]
    if not explore or not numeric:
        return None
    knob = numeric[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    for state, marker in (("done", "o"), ("pruned", "x"), ("failed", "s")):
        pts = [(t["params"][knob], t["evals"][-1][1]) for t in explore if t["state"] == state]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, label=f"{state} ({len(pts)})")
    if study["knobs"][knob]["kind"] == "log_uniform":
        ax.set_xscale("log")
    ax.set_xlabel(knob)
    ax.set_ylabel("last held-out accuracy")
    ax.legend()
    ax.set_title("explored trials: finished vs stopped early")
    return _save(fig, out / "explored.png")


def knob_importance(trials: list[dict], study: dict) -> dict:
    """Optuna's PED-ANOVA importance of each knob over the finished explore trials, rebuilt from
    the registry (not from Optuna's own file), or {} with fewer than 3 of them."""
    import optuna

    done = [t for t in trials if t["stage"] == "explore" and t["state"] == "done" and t["metric"] is not None]
    if len(done) < 3:
        return {}
    from actorjet.research.study_spec import distributions

    dists = distributions(study["knobs"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rebuilt = optuna.create_study(direction="maximize")
    for t in done:
        params = {k: v for k, v in t["params"].items() if k in dists}
        rebuilt.add_trial(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                    value=t["metric"]))
    try:
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()     # deterministic; no scikit-learn
        return dict(optuna.importance.get_param_importances(rebuilt, evaluator=evaluator))
    except (RuntimeError, ValueError):          # e.g. every finished trial has the same values
        return {}


def _importance(out: Path, decisions: list[dict], anova: dict) -> Path | None:
    """Left: each ablated knob's effect on the metric (changed alone minus the recommended
    config) with its decision interval.  Right: PED-ANOVA importance, when there is one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ablated = [d["evidence"] for d in decisions if d["stage"] == "ablate" and "low" in d.get("evidence", {})
               and min(d["evidence"]["n"]) >= 2]
    if not ablated and not anova:
        return None
    fig, axes = plt.subplots(1, 2 if ablated and anova else 1, figsize=(9 if ablated and anova else 6, 3.5),
                             squeeze=False)
    ax = axes[0][0]
    if ablated:
        names = [e["arm"] for e in ablated]
        effects = [-e["diff"] for e in ablated]
        errors = [[-e["diff"] - -e["high"] for e in ablated], [-e["low"] - -e["diff"] for e in ablated]]
        ax.errorbar(effects, range(len(names)), xerr=errors, fmt="o", capsize=4)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel("change in the metric (Welch 95% CI)")
        ax.set_title("ablation: each knob changed alone")
        ax = axes[0][1] if anova else ax
    if anova:
        ax.barh(list(anova), list(anova.values()))
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel("PED-ANOVA importance")
        ax.set_title("explore: knob importance")
    return _save(fig, out / "importance.png")
