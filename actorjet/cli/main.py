"""`actorjet` command line: one sub-command per verb, each with a --help that teaches.

A ``UserError`` anywhere becomes one red line on stderr and exit code 2; a bug keeps its
traceback (and says so), so the two are never confused.
"""
from __future__ import annotations

import argparse
import sys

from actorjet.errors import UserError

EPILOG = """\
typical use:
  actorjet quickstart                          train the tiny arithmetic model locally (~2–4 min on 2 cores)
  actorjet start --config agents/job.toml      head node; prints the join command
  actorjet join HEAD:1900 --token T --slots 4  add a node that runs agent code
  actorjet status                              nodes, runners, models, behaviors, episodes
  actorjet upgrade TASK agent.py:behavior      new agent code on every runner, no restart
  actorjet rollback TASK                       back to the previous version of that code
  actorjet task pause|resume|remove|add TASK   change the task cocktail while training runs
  actorjet top                                 a live view of the swarm (q quits)
  actorjet report RUN_DIR                      one HTML page of a run, plots embedded
  actorjet export RUN_DIR OUT                  the trained model as a Hugging Face directory
  actorjet export-data RUN_DIR OUT.jsonl       the recorded trajectories, for `datasets`
  actorjet research run agents/studies/lr.toml  a multi-stage RL study, unattended, with its report
"""


def build_parser() -> argparse.ArgumentParser:
    from actorjet.cli import behavior_cmds, monitor_cmds, node_cmds, research_cmds, task_cmds, train_cmds

    parser = argparse.ArgumentParser(
        prog="actorjet", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Reinforcement learning of LLM agents as a fault-tolerant actor swarm.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    train_cmds.add_quickstart(sub)
    node_cmds.add_start(sub)
    node_cmds.add_join(sub)
    node_cmds.add_leave(sub)
    node_cmds.add_stop(sub)
    node_cmds.add_status(sub)
    behavior_cmds.add_upgrade(sub)
    behavior_cmds.add_rollback(sub)
    task_cmds.add_task(sub)
    monitor_cmds.add_report(sub)
    monitor_cmds.add_top(sub)
    monitor_cmds.add_export(sub)
    monitor_cmds.add_export_data(sub)
    research_cmds.add_research(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"actorjet {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"actorjet {args.command}: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The ``actorjet`` console script (main, minus the interpreter's teardown: runtime/leave.py)."""
    from actorjet.runtime.leave import run_then_leave

    run_then_leave(main)


if __name__ == "__main__":
    run()
