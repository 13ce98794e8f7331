"""A study's report, generated from its registry alone: ``report.md``, ``results.json`` and
figures (learning curves per arm with 95% bands; the explored values, finished vs stopped
early).  Nothing here reads a trial's terminal output or the controller's memory."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from actorjet.research import stats
from actorjet.research.registry import StudyRegistry


def build(study_dir: str | Path) -> Path:
    reg = StudyRegistry(study_dir)
    study, plan = reg.get("spec"), reg.get("plan")
    if study is None:
        from actorjet.errors import UserError

        raise UserError(f"{study_dir} holds no study (run `actorjet research run STUDY.toml --dir {study_dir}`)")
    out = Path(study_dir)
    trials, decisions = reg.trials(), reg.decisions()
    figures = [_curves(out, trials), _explored(out, trials, study)]
    conclusion = _conclusion(decisions)
    results = {"question": study["question"], "metric": study["metric"], "conclusion": conclusion,
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
    lines += ["", "## Arms (test split)", "", "| stage | arm | seeds done | mean | 95% CI (t) |", "|---|---|---|---|---|"]
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
