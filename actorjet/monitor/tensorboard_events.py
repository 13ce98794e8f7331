"""TensorBoard event files next to metrics.jsonl (``[train] tensorboard = true``, extra ``tb``).

The registry writes them into the run directory itself, so ``tensorboard --logdir runs/``
shows every run.  The tags are metrics.jsonl's keys (docs/monitoring.md): a train line's
``reward_mean`` of model ``policy`` becomes ``policy/reward_mean`` at its step, an eval line
``policy/eval/TASK/accuracy``, a swarm line's counters ``swarm/episodes/completed`` and so on.
"""
from __future__ import annotations

from pathlib import Path

from actorjet.errors import UserError


class EventWriter:
    def __init__(self, run_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("[train] tensorboard = true needs the tensorboard package: "
                            "pip install 'actorjet[tb]'") from None
        self.writer = SummaryWriter(log_dir=str(run_dir), flush_secs=5)

    def write(self, record: dict) -> None:
        kind, step = record.get("kind"), record.get("step")
        if not isinstance(step, int):
            return
        model = str(record.get("model", ""))
        if kind == "train":
            prefix = f"{model}/"
        elif kind == "eval":
            prefix = f"{model}/eval/{record.get('task') or 'default'}/"
        elif kind == "swarm":
            prefix = "swarm/"
        else:
            return
        for tag, value in flatten(record, prefix):
            self.writer.add_scalar(tag, value, step, walltime=record.get("time"))

    def close(self) -> None:
        self.writer.close()


def flatten(record: dict, prefix: str) -> list[tuple[str, float]]:
    """Numeric leaves of a metrics line, nested keys joined by "/"."""
    out = []
    for key, value in record.items():
        if key in ("time", "step", "kind", "model", "task"):
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out.append((prefix + key, float(value)))
        elif isinstance(value, dict):
            out += flatten(value, f"{prefix}{key}/")
    return out
