"""`actorjet report RUN_DIR`: one self-contained HTML page of a run, made from metrics.jsonl.

Every figure is a PNG embedded in the page (base64), so the file can be mailed or attached to
a paper's appendix as is.  Panels: reward and held-out accuracy against learner step and
against wall-clock time, where each step's time goes, throughput, the context tracker's
savings, faults and restarts over time, which behavior version was live when, and one panel
per task.  The report reads only metrics.jsonl (docs/monitoring.md lists its lines).
"""
from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path

from actorjet.monitor import metrics, timeline
from actorjet.errors import UserError


def build(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write RUN_DIR/report.html (or ``out``) and return its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run directory")
    rows, malformed = metrics.read_counted(run_dir)
    usable = [r for r in rows if _number(r.get("time")) and isinstance(r.get("step", 0), int)]
    rows, malformed = usable, malformed + len(rows) - len(usable)      # a line of the wrong shape is skipped too
    if not rows:
        raise UserError(f"{run_dir / 'metrics.jsonl'} has no metrics yet (is training running there?)")
    import matplotlib
    matplotlib.use("Agg")

    t0 = min(r.get("time", 0) for r in rows)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    swarm = [r for r in rows if r.get("kind") == "swarm" and isinstance(r.get("episodes", {}), dict)
             and isinstance(r.get("restarts", {}), dict)]
    models = sorted({r["model"] for r in train + evals if "model" in r})
    figures = [
        ("Reward and held-out accuracy by learner step", _curves(train, evals, models, "step", t0)),
        ("Reward and held-out accuracy by wall-clock time", _curves(train, evals, models, "time", t0)),
        ("Where each step's time goes", _step_time(train, models)),
        ("The step timeline: the median step, episode by episode", _timeline(rows)),
        ("Learner ranks: each rank's time to train a step", _ranks(train, models)),
        ("Throughput", _throughput(train, swarm, t0)),
        ("Context tracker: training tokens saved", _context(train, models)),
        ("Faults and restarts over time", _faults(swarm, t0)),
        ("Agent code versions live (share of each step's episodes)", _versions(train)),
        ("Per task: reward", _tasks(train)),
    ]
    body = [f"<h1>ActorJet run: {html.escape(run_dir.resolve().name)}</h1>", _summary(run_dir, train, evals, swarm,
                                                                                    malformed)]
    for title, png in figures:
        if png is None:
            continue
        body.append(f"<h2>{html.escape(title)}</h2>"
                    f'<img class="plot" alt="{html.escape(title)}" src="data:image/png;base64,{png}">')
        if title.startswith("The step timeline"):
            body.append(_critical_paths(rows))
    out = Path(out) if out else run_dir / "report.html"
    out.write_text("<!doctype html><html><head><meta charset='utf-8'><title>ActorJet report</title><style>"
                   "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
                   "img.plot{width:100%;border:1px solid #ddd} td,th{padding:2px 12px;text-align:left}"
                   "</style></head><body>" + "\n".join(body) + "</body></html>")
    return out


def _summary(run_dir: Path, train: list, evals: list, swarm: list, malformed: int) -> str:
    items = [("run directory", str(run_dir.resolve())),
             ("report made", time.strftime("%Y-%m-%d %H:%M:%S"))]
    for model in sorted({r["model"] for r in train}):
        mine = [r for r in train if r["model"] == model]
        accs = [r for r in evals if r.get("model") == model]
        line = f"{len(mine)} steps, {mine[-1]['time'] - mine[0]['time']:.0f} s"
        if accs:
            line += f"; held-out accuracy {accs[0]['accuracy']:.1%} → {accs[-1]['accuracy']:.1%}"
        items.append((f"model {model}", line))
    if swarm:
        last = swarm[-1]
        eps = last.get("episodes", {})
        items.append(("episodes", ", ".join(f"{k} {v}" for k, v in eps.items())))
        items.append(("restarts", ", ".join(f"{k} {v}" for k, v in sorted(last.get("restarts", {}).items()))
                      or "none"))
        items.append(("nodes lost", str(last.get("nodes_lost", 0))))
    if malformed:
        items.append(("metrics lines skipped", f"{malformed} malformed"))
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f"<table>{rows}</table>"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value   # not NaN


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _figure():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.grid(alpha=0.3)
    return fig, ax


def _x(r: dict, axis: str, t0: float) -> float:
    return r["step"] if axis == "step" else (r["time"] - t0) / 60


def _curves(train, evals, models, axis, t0) -> str | None:
    if not train:
        return None
    fig, ax = _figure()
    for model in models:
        mine = [r for r in train if r["model"] == model and _number(r.get("reward_mean"))]
        ax.plot([_x(r, axis, t0) for r in mine], [r["reward_mean"] for r in mine], alpha=0.7,
                label=f"{model}: train reward")
        accs = [r for r in evals if r.get("model") == model and _number(r.get("accuracy"))]
        for task in sorted({r.get("task", "") for r in accs}):
            pts = [r for r in accs if r.get("task", "") == task]
            ax.plot([_x(r, axis, t0) for r in pts], [r["accuracy"] for r in pts], "o-",
                    label=f"{model}: held-out accuracy" + (f" ({task})" if task else ""))
    ax.set_xlabel("learner step" if axis == "step" else "minutes since the first metric")
    ax.set_ylim(-0.02, 1.02)
    _legend(ax, loc="lower right", fontsize=8)
    return _png(fig)


def _step_time(train, models) -> str | None:
    parts = ("batch_wait_s", "train_s", "publish_s")
    mine = [r for r in train if all(_number(r.get(k)) for k in parts)]
    if not mine:
        return None
    fig, ax = _figure()
    for model in models:
        pts = [r for r in mine if r["model"] == model]
        bottom = [0.0] * len(pts)
        for key in parts:
            values = [max(0.0, min(r[key], r.get("step_time_s", r[key]) * 10)) for r in pts]
            ax.bar([r["step"] for r in pts], values, bottom=bottom, width=1.0,
                   label=f"{model}: {key[:-2].replace('_', ' ')}")
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("learner step")
    ax.set_ylabel("seconds")
    _legend(ax, fontsize=8)
    return _png(fig)


def _timeline(rows) -> str | None:
    """The median step of each model (monitor/timeline.py): one bar per episode, a colour per
    stage, the learner's marks as lines."""
    all_steps = timeline.steps(rows)
    medians = [s for model in sorted({s.model for s in all_steps})
               if (s := timeline.median_step([x for x in all_steps if x.model == model])) is not None]
    if not medians:
        return None
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(medians), 1, figsize=(10, 3.6 * len(medians)), squeeze=False)
    for ax, step in zip(axes[:, 0], medians):
        timeline.draw(ax, step)
        ax.set_title(f"{step.model}: step {step.step}", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7, loc="lower right")
    return _png(fig)


def _critical_paths(rows) -> str:
    all_steps = timeline.steps(rows)
    lines = []
    for model in sorted({s.model for s in all_steps}):
        step = timeline.median_step([s for s in all_steps if s.model == model])
        if step is not None:
            lines += ["Critical path of the median step:", *timeline.describe(step), ""]
    return f"<pre>{html.escape(chr(10).join(lines))}</pre>" if lines else ""


def _ranks(train, models) -> str | None:
    """One line per learner rank (``learner = { ranks = N }``): a slow rank is the step's time."""
    mine = [r for r in train if isinstance(r.get("rank_step_s"), list) and r["rank_step_s"]]
    if not mine:
        return None
    fig, ax = _figure()
    for model in models:
        pts = [r for r in mine if r["model"] == model]
        for k in range(max((len(r["rank_step_s"]) for r in pts), default=0)):
            xy = [(r["step"], r["rank_step_s"][k]) for r in pts if k < len(r["rank_step_s"])
                  and _number(r["rank_step_s"][k])]
            if xy:
                ax.plot(*zip(*xy), marker=".", label=f"{model}: rank {k}")
    ax.set_xlabel("learner step")
    ax.set_ylabel("seconds")
    _legend(ax, fontsize=8)
    return _png(fig)


def _throughput(train, swarm, t0) -> str | None:
    if len(swarm) < 2 and not train:
        return None
    fig, ax = _figure()
    if len(swarm) >= 2:
        xs, ys = [], []
        for a, b in zip(swarm, swarm[1:]):
            dt = b["time"] - a["time"]
            if dt > 0:
                xs.append((b["time"] - t0) / 60)
                ys.append((b.get("episodes", {}).get("completed", 0) - a.get("episodes", {}).get("completed", 0)) / dt)
        ax.plot(xs, ys, label="episodes completed / s")
    tokens = [r for r in train if _number(r.get("tokens")) and _number(r.get("train_s")) and r["train_s"] > 0]
    if tokens:
        ax2 = ax.twinx()
        ax2.plot([(r["time"] - t0) / 60 for r in tokens], [r["tokens"] / r["train_s"] for r in tokens],
                 color="tab:orange", alpha=0.6, label="trained tokens / s (right)")
        _legend(ax2, loc="upper right", fontsize=8)
    ax.set_xlabel("minutes since the first metric")
    _legend(ax, loc="upper left", fontsize=8)
    return _png(fig)


def _context(train, models) -> str | None:
    mine = [r for r in train if _number(r.get("token_ratio"))]
    if not mine:
        return None
    fig, ax = _figure()
    for model in models:
        pts = [r for r in mine if r["model"] == model]
        ax.plot([r["step"] for r in pts], [r["token_ratio"] for r in pts], label=f"{model}: tokens before / after merging")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("learner step")
    _legend(ax, fontsize=8)
    return _png(fig)


def _faults(swarm, t0) -> str | None:
    if not swarm:
        return None
    fig, ax = _figure()
    xs = [(r["time"] - t0) / 60 for r in swarm]
    ax.step(xs, [sum(r.get("restarts", {}).values()) for r in swarm], where="post", label="restarts (all children)")
    ax.step(xs, [r.get("nodes_lost", 0) for r in swarm], where="post", label="nodes lost")
    ax.step(xs, [r.get("episodes", {}).get("aborted", 0) for r in swarm], where="post", label="episodes aborted")
    ax.step(xs, [r.get("groups", {}).get("quarantined", 0) for r in swarm], where="post", label="groups quarantined")
    ax.set_xlabel("minutes since the first metric")
    ax.set_ylabel("count so far")
    _legend(ax, fontsize=8)
    return _png(fig)


def _versions(train) -> str | None:
    mine = [r for r in train if isinstance(r.get("by_behavior"), dict)]
    tags = sorted({t for r in mine for t in r["by_behavior"]})
    if not tags:
        return None
    fig, ax = _figure()
    steps = [r["step"] for r in mine]
    shares = {t: [r["by_behavior"].get(t, {}).get("episodes", 0) / max(1, sum(v.get("episodes", 0) for v in
                                                                              r["by_behavior"].values()))
                  for r in mine] for t in tags}
    ax.stackplot(steps, *[shares[t] for t in tags], labels=tags)
    ax.set_xlabel("learner step")
    ax.set_ylim(0, 1)
    _legend(ax, fontsize=8, loc="lower left")
    return _png(fig)


def _tasks(train) -> str | None:
    mine = [r for r in train if isinstance(r.get("by_task"), dict)]
    tasks = sorted({t for r in mine for t in r["by_task"]})
    if len(tasks) < 2:
        return None          # one task: the reward panel above is the task's panel
    fig, ax = _figure()
    for task in tasks:
        pts = [r for r in mine if task in r["by_task"] and r["by_task"][task].get("reward_mean") is not None]
        ax.plot([r["step"] for r in pts], [r["by_task"][task]["reward_mean"] for r in pts], label=task)
    ax.set_xlabel("learner step")
    _legend(ax, fontsize=8)
    return _png(fig)
