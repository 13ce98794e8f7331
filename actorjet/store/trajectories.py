"""`actorjet export-data`: a run's recorded trajectories as a file ``datasets`` loads.

Two places hold them: the episode stores (``episodes-MODEL.sqlite``: what is pending, and what
was trained after the newest checkpoint) and, with ``[train] keep_trajectories = true``, the
archives that retention appends to before it deletes trained groups
(``trajectories/MODEL.jsonl``, compact: store/records.py ``portable``).  The export has one
row per LLM call, whole and typed: messages (a list of {role, content, ...}), tools (a list),
prompt and completion ids, logprobs, weight version, the reward as a float and the step that
trained it (null: not trained yet).  A call's row holds
its whole prompt, so the export of a T-turn episode is O(T·C): it is written once, for people,
never on the training path.

JSONL (``OUT.jsonl``) needs nothing; Parquet (``OUT.parquet``) needs pyarrow.  Both load with
``datasets.load_dataset("json" | "parquet", data_files=OUT)``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from actorjet.errors import UserError
from actorjet.rl.rewards import reward_for, total
from actorjet.store.records import from_portable, whole


def _rows(model: str, episode: dict, calls: list[dict]) -> Iterator[dict]:
    """One typed row per call: ``messages`` a list of {role, content, ...}, ``tools`` a list
    (or null), ``reward`` a float (this call's role's or model's share, per-turn rewards
    folded; null: none for it), so ``datasets`` and TRL read the file as conversational data
    as it is.  A reward that is not one number is also kept whole, as JSON text, in
    ``reward_detail``."""
    reward = episode["reward"]
    info = {"model": model, "group_id": episode["group_id"], "task_name": episode["task_name"],
            "behavior": episode["behavior"], "version": episode["version"], "trained_step": episode["trained_step"],
            "reward_detail": None if isinstance(reward, (int, float)) else json.dumps(reward)}
    for c in calls:
        row = whole(c)
        mine = reward_for(reward, model, row.get("role", ""))
        row.update(info, episode_id=episode["episode_id"], reward=None if mine is None else total(mine),
                   tools=row["tools"] or None)
        for key in ("params", "created", "prefix"):
            row.pop(key)
        yield row


def archived(path: Path) -> Iterator[tuple[dict, list[dict]]]:
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                episode = json.loads(line)
                yield episode, from_portable(episode["calls"])
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"{path}:{n}: not an archived episode ({e}); was the file cut short?") from None


def stored(path: Path) -> Iterator[tuple[dict, list[dict]]]:
    from actorjet.store.episode_store import EpisodeStore

    store = EpisodeStore(path)
    try:
        with store.lock:
            rows = store.db.execute(
                "SELECT e.episode_id, e.group_id, e.member, g.task_name, g.behavior, g.version, e.reward, g.trained_step "
                "FROM episodes e JOIN groups g USING (group_id) WHERE e.reward IS NOT NULL "
                "ORDER BY e.stored_at").fetchall()
        for episode_id, group_id, member, task, behavior, version, reward, trained in rows:
            episode = {"episode_id": episode_id, "group_id": group_id, "member": member, "task_name": task,
                       "behavior": behavior,
                       "version": version, "reward": json.loads(reward), "trained_step": trained}
            yield episode, store._compact([episode_id])[episode_id]
    finally:
        store.close_db()


def export_data(run_dir: str | Path, out: str | Path, progress=print) -> dict:
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run directory")
    if out.suffix not in (".jsonl", ".parquet"):
        raise UserError(f"{out}: the output must end in .jsonl or .parquet")
    sources = [(p.stem, archived, p) for p in sorted((run_dir / "trajectories").glob("*.jsonl"))]
    sources += [(p.stem.removeprefix("episodes-"), stored, p) for p in sorted(run_dir.glob("episodes-*.sqlite"))]
    if not sources:
        raise UserError(f"{run_dir}: no episode store (episodes-MODEL.sqlite) and no trajectories/ archive: "
                        "run this on the node that ran the model's subtree")
    rows, seen, episodes = [], set(), 0
    for model, read, path in sources:
        for episode, calls in read(path):
            if (model, episode["episode_id"]) in seen:      # archived twice (a crash mid-retention)
                continue
            seen.add((model, episode["episode_id"]))
            episodes += 1
            rows += _rows(model, episode, calls)
        progress(f"{path}: {episodes} episodes, {len(rows)} calls so far")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError("a .parquet export needs pyarrow (pip install pyarrow); or write OUT.jsonl") from None
        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        with open(out, "w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {"out": str(out), "episodes": episodes, "calls": len(rows)}
