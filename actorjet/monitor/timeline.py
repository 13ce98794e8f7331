"""The step timeline: where a training step's time goes, episode by episode.

Each trained step leaves a ``kind = "timeline"`` line in metrics.jsonl (rl/step.py): for every
episode of its batch, when it was leased (the registry's clock), sent its first call and
got its last answer (the gateway's), was stored with its reward, completed with its group and
taken into a batch (the store's); then when the step trained it (the learner's).  Each engine
replica leaves a ``kind = "served"`` line when it begins to serve a weight version.  Joined,
they give the eight stages of every trained episode:

    leased → first_call → last_answer → stored → complete → taken → trained → served

The clocks are each process's wall clock (time.time); on several hosts they are as good as
the hosts' clock sync.  The *critical path* of a step is the chain of its latest episode (the
one whose group completed last: the batch waited for it), stage by stage; the step's period
is the time from the previous step's trained mark to its own.  ``actorjet report`` draws the
median step, and bench/vs_trl.py prints its critical path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

STAGES = ("leased", "first_call", "last_answer", "stored", "complete", "taken", "trained", "served")
SEGMENTS = {          # the gap that ends at a stage, said for a reader
    "first_call": "lease → first call (runner starts the agent)",
    "last_answer": "first call → last answer (the agent's LLM calls)",
    "stored": "last answer → stored (the agent ends; its reward is posted)",
    "complete": "stored → complete (the group's other members finish)",
    "taken": "complete → taken (waits for the learner's pull)",
    "trained": "taken → trained (queue behind the step before + the optimizer step)",
    "served": "trained → served (publish, deliver, the engine loads)",
}
SLACK_S = 0.01        # clocks of two processes may disagree by this much and still count as ordered


@dataclass
class Step:
    model: str
    step: int
    version: int
    episodes: list[dict]            # episode_id and one wall time per stage (None: not known)
    batch_ready: float
    train_start: float
    trained: float
    published: float
    served: float | None
    period: float | None = None     # since the previous step's trained mark
    engine: dict = field(default_factory=dict)

    def critical(self) -> dict | None:
        """The episode the batch waited for: its group completed last."""
        known = [e for e in self.episodes if e.get("complete") is not None]
        return max(known, key=lambda e: e["complete"]) if known else None


def steps(rows: list[dict]) -> list[Step]:
    """Every step with a timeline line, joined with the first replica to serve its version."""
    served: dict[tuple, dict] = {}
    for r in rows:
        if r.get("kind") == "served" and isinstance(r.get("time"), (int, float)):
            key = (r.get("model"), r.get("weight_version"))
            if key not in served or r["time"] < served[key]["time"]:
                served[key] = r
    out: list[Step] = []
    last_trained: dict[str, float] = {}
    for r in sorted((r for r in rows if r.get("kind") == "timeline"), key=lambda r: (r.get("model", ""), r.get("step", 0))):
        try:
            names = list(r["stages"])
            model, version = r["model"], r["weight_version"]
            seen = served.get((model, version), {})
            episodes = []
            for row in r["episodes"]:
                stages = row[1:]
                if "t0" in r:          # milliseconds after t0 (lines before it: Unix seconds)
                    stages = [None if t is None else r["t0"] + t / 1000 for t in stages]
                e = {"episode_id": row[0], **dict(zip(names, stages))}
                e.update(trained=r["trained"], served=seen.get("time"))
                episodes.append(e)
            step = Step(model, r["step"], version, episodes, r["batch_ready"], r["train_start"], r["trained"],
                        r["published"], seen.get("time"), engine=seen.get("engine", {}))
        except (KeyError, TypeError, ValueError):       # a line of another shape: not a timeline
            continue
        if model in last_trained:
            step.period = step.trained - last_trained[model]
        last_trained[model] = step.trained
        out.append(step)
    return out


def problems(step: Step) -> list[str]:
    """What is missing or out of order among this step's episodes (empty: all eight stages,
    in order, for every episode)."""
    out = []
    for e in step.episodes:
        times = [(s, e.get(s)) for s in STAGES]
        missing = [s for s, t in times if t is None]
        if missing:
            out.append(f"{e['episode_id']}: no {', '.join(missing)}")
            continue
        for (a, ta), (b, tb) in zip(times, times[1:]):
            if tb < ta - SLACK_S:
                out.append(f"{e['episode_id']}: {b} ({tb:.3f}) before {a} ({ta:.3f})")
    return out


def median_step(all_steps: list[Step], skip: int = 2) -> Step | None:
    """The step whose period is the median (the first ``skip`` steps warm up and are left out)."""
    timed = sorted((s for s in all_steps[skip:] if s.period is not None), key=lambda s: s.period)
    if not timed:
        timed = [s for s in all_steps if s.period is not None] or all_steps
    return timed[len(timed) // 2] if timed else None


def critical_path(step: Step) -> list[tuple[str, float]]:
    """(segment, seconds) along the critical episode, lease to served."""
    e = step.critical()
    if e is None:
        return []
    out = []
    for a, b in zip(STAGES, STAGES[1:]):
        if e.get(a) is not None and e.get(b) is not None:
            out.append((SEGMENTS[b], e[b] - e[a]))
    return out


def stage_medians(step: Step) -> dict[str, float]:
    """Segment → median seconds over the step's episodes."""
    out = {}
    for a, b in zip(STAGES, STAGES[1:]):
        gaps = [e[b] - e[a] for e in step.episodes if e.get(a) is not None and e.get(b) is not None]
        if gaps:
            out[SEGMENTS[b]] = median(gaps)
    return out


def describe(step: Step) -> list[str]:
    """The critical path of one step, as lines of a table (bench output, docs)."""
    lines = [f"step {step.step} of {step.model}: period {step.period if step.period is not None else float('nan'):.3f} s, "
             f"{len(step.episodes)} episodes; learner: batch ready → train start "
             f"{step.train_start - step.batch_ready:+.3f} s, optimizer step {step.trained - step.train_start:.3f} s, "
             f"publish {step.published - step.trained:.3f} s",
             f"  {'segment':<72} {'critical s':>10} {'median s':>9}"]
    medians = stage_medians(step)
    for segment, seconds in critical_path(step):
        lines.append(f"  {segment:<72} {seconds:>10.3f} {medians.get(segment, float('nan')):>9.3f}")
    e = step.critical()
    if e is not None and e.get("served") is not None and e.get("leased") is not None:
        lines.append(f"  {'lease → served, the critical episode':<72} {e['served'] - e['leased']:>10.3f}")
    return lines


def draw(ax, step: Step) -> None:
    """One bar per episode of ``step``, a colour per segment; the learner's marks as lines."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    colours = plt.get_cmap("tab10")
    episodes = sorted(step.episodes, key=lambda e: (e.get("leased") or 0))
    t0 = min((e["leased"] for e in episodes if e.get("leased") is not None), default=step.batch_ready)
    for k, (a, b) in enumerate(zip(STAGES, STAGES[1:])):
        # One collection a segment, not one rectangle per bar: a step's 256 episodes × 7
        # segments as barh's patches took ~2 s of the quickstart's report to lay out and draw.
        bars = [[(x0, y - 0.4), (x1, y - 0.4), (x1, y + 0.4), (x0, y + 0.4)]
                for y, e in enumerate(episodes) if e.get(a) is not None and e.get(b) is not None
                for x0, x1 in [(e[a] - t0, e[a] - t0 + max(0.0, e[b] - e[a]))]]
        if bars:
            ax.add_collection(PolyCollection(bars, facecolors=colours(k), edgecolors="none", label=SEGMENTS[b]))
    ax.autoscale_view()
    for name, t, style in (("train start", step.train_start, ":"), ("trained", step.trained, "--")):
        ax.axvline(t - t0, color="black", linestyle=style, linewidth=1, label=name)
    ax.set_xlabel("seconds since the step's first lease")
    ax.set_ylabel("episode")
