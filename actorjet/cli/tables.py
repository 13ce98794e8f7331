"""Human-readable status tables (rich), shared by `status` and `top`."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def print_status(data: dict, console: Console | None = None, show_actors: bool = False) -> None:
    console = console or Console()
    line = data.get("watchdog", "")
    if line:
        console.print(("[bold red]" if line.startswith("stalled") else "[bold]") + line + "[/]")
    if data.get("paused"):                      # a full disk (actorjet/disk.py)
        console.print("[bold red]" + escape(data["paused"]) + "[/]")
    for path, placement in sorted((data.get("waiting") or {}).items()):
        want = ", ".join(f"{k} = {v!r}" for k, v in placement.items())
        console.print(f"[yellow]WAITING: {escape(path)} for a node with {escape(want)}[/]")
    nodes = Table(title="nodes")
    for col in ("name", "node_id", "alive", "slots", "trials", "cpus", "gpus", "note"):
        nodes.add_column(col)
    for n in data.get("nodes", []):
        nodes.add_row(n["name"], n["node_id"], "yes" if n["alive"] else "[red]lost[/red]",
                      str(n["slots"]), str(n.get("trials", 0)), str(n.get("cpus", "")), str(n.get("gpus", "")),
                      n.get("lost_reason", ""))
    console.print(nodes)
    active = (data.get("trials") or {}).get("active") or []
    if active:                                  # research trials this swarm hosts (registry/trials.py)
        trials = Table(title="research trials")
        for col in ("trial", "node", "state", "learner step"):
            trials.add_column(col)
        for t in active:
            trials.add_row(t["trial_id"], t["node"], t["state"], str(t["step"]))
        console.print(trials)
    runners = Table(title="runners")
    for col in ("id", "node_id", "state", "behaviors"):
        runners.add_column(col)
    for r in data.get("runners", []):
        behaviors = ", ".join(f"{task}@v{v}" for task, v in sorted(r.get("behaviors", {}).items()))
        runners.add_row(r["id"], str(r.get("node_id") or "-"), r.get("state", ""), behaviors or "-")
    console.print(runners)
    if show_actors:
        actors = Table(title="actors")
        for col in ("path", "node", "host", "pid", "up", "restarts"):
            actors.add_column(col)
        for a in data.get("actors", []):
            actors.add_row(a["path"], a["node"], a["host"], str(a["pid"]), f"{a['up_s']} s", str(a["restarts"]))
        console.print(actors)
    if data.get("models"):
        models = Table(title="models")
        for col in ("name", "weight_version", "learner_step", "engine replicas (served / outstanding)",
                    "learner ranks (last step s)", "devices (KV cache used / budget)"):
            models.add_column(col)
        for mdl in data["models"]:
            replicas = ", ".join(f"{name}: {r['served']} / {r['outstanding']}" + (" [red]out[/red]" if r["out"] else "")
                                 for name, r in (mdl.get("engine_replicas") or {}).items())
            models.add_row(mdl["name"], str(mdl["weight_version"]), str(mdl["learner_step"]), replicas or "-",
                           ranks_cell(mdl), hardware_cell(mdl))
        console.print(models)
    if data.get("behaviors"):
        table = Table(title="behaviors (runners per version)")
        for col in ("task", "current", "versions"):
            table.add_column(col)
        for b in data["behaviors"]:
            versions = ", ".join(f"v{v['version']} {v['state']}: {v['runners']}"
                                 + (f" [red]({v['load_error'][:60]})[/red]" if v.get("load_error") else "")
                                 for v in b.get("versions", []))
            table.add_row(b["name"], f"v{b['version']}" + (" (canary running)" if b.get("canary") else ""), versions)
        console.print(table)
    if len(data.get("tasks", {})) > 1:
        tasks = Table(title="tasks")
        for col in ("task", "weight", "state", "groups issued", "episodes completed", "aborted"):
            tasks.add_column(col)
        for name, t in data["tasks"].items():
            aborted = ", ".join(f"{k} {v}" for k, v in t.get("aborted_by_cause", {}).items()) or "0"
            tasks.add_row(name, f"{t['weight']:g}", t["state"], str(t["issued"]), str(t.get("completed", 0)), aborted)
        console.print(tasks)
    eps = data.get("episodes", {})
    console.print("episodes: " + ", ".join(f"{k} {v}" for k, v in eps.items()))
    causes = data.get("aborted_by_cause", {})
    if causes:
        console.print("aborted by cause: " + ", ".join(f"{k} {v}" for k, v in sorted(causes.items())))
    groups = data.get("groups", {})
    if groups:
        dropped = ", ".join(f"{k} {v}" for k, v in groups.get("dropped_by_cause", {}).items())
        console.print(f"groups: finished {groups.get('finished', 0)}, dropped {groups.get('dropped', 0)}"
                      + (f" ({dropped})" if dropped else "")
                      + f", open {groups.get('groups_open', 0)}, late results rejected "
                      f"{groups.get('late_results_rejected', 0)}")
    if data.get("rejected_frames"):
        console.print(f"[red]unauthenticated actor frames dropped: {data['rejected_frames']}[/red] "
                      "(see each node's actors.log for the senders)")
    if data.get("nodes_lost"):
        console.print(f"nodes lost: {data['nodes_lost']}")
    if data.get("stalls_detected"):
        console.print(f"stalls: found {data['stalls_detected']}, healed {data.get('stalls_healed', 0)}")
    restarts = data.get("restarts", {})
    console.print("restarts: " + (", ".join(f"{k} {v}" for k, v in sorted(restarts.items())) or "none"))
    for name, r in sorted(data.get("recovered", {}).items()):      # the learner's last (re)start
        console.print(f"recovered: {name} resumed at step {r['step']} as weights v{r['weight_version']}, "
                      f"{r['pending_again']} groups trained or taken after that step pending again")


def ranks_cell(mdl: dict) -> str:
    """Each learner rank's time for the last step it trained (``-``: one rank)."""
    return " ".join(f"r{k}:{t:.2f}" if t is not None else f"r{k}:?" for k, t in enumerate(mdl.get("learner_ranks") or [])) or "-"


def hardware_cell(mdl: dict) -> str:
    """Where each of the model's processes runs (``device = "auto"`` decided there) and, for an
    engine, its kept KV caches' use of their budget in MB."""
    cells = []
    for kind, info in sorted((mdl.get("hardware") or {}).items()):
        kv = f" {info['kv_used_mb']:.0f}/{info['kv_budget_mb']:.0f}" if "kv_budget_mb" in info else ""
        cells.append(f"{kind}: {info.get('device', '?')}{kv}")
    return ", ".join(cells) or "-"
