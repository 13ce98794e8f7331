"""`actorjet research plan|run|status|report`: a multi-stage RL study, unattended (docs/research.md)."""
from __future__ import annotations

import argparse
import functools
from pathlib import Path


def add_research(sub) -> None:
    p = sub.add_parser("research", help="run a multi-stage RL study unattended and write its report",
                       description="A study (STUDY.toml: question, base job, metric, budget, knobs, seeds, "
                       "decision rule) runs baseline → explore (Optuna TPE, losing trials stopped early) → "
                       "confirm on fresh seeds → ablate → report, every trial a real ActorJet job.  Kill it at "
                       "any moment and `run` again: it resumes.  See docs/research.md and agents/studies/.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n"
                       "  actorjet research plan agents/studies/lr.toml         stages, trial count, time estimate\n"
                       "  actorjet research run agents/studies/lr.toml --dir studies/lr\n"
                       "  actorjet research status studies/lr\n"
                       "  actorjet research report studies/lr                   report.md, results.json, figures\n"
                       "  actorjet research ask \"does lr matter\" --base-job agents/job.toml   a question → a draft\n"
                       "  actorjet research knobs --base-job agents/job.toml    every field a study may turn")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    ask = verbs.add_parser("ask", help="turn a research question into a draft study (and run it with --yes)",
                           description="Draft a study spec from a question about a base job.  Without --planner "
                           "a small grammar reads: 'does KNOB matter [for METRIC]', 'best KNOB between A and B', "
                           "'compare ALGO, ALGO and ALGO on TASK', 'how does METRIC scale with KNOB' (METRIC: "
                           "accuracy, auc / learning speed, 'steps to N%').  With --planner URL (any "
                           "OpenAI-compatible endpoint, an ActorJet gateway included) an LLM drafts it from the "
                           "catalogue of knobs; either draft is checked like any study before it is written.",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="examples:\n"
                           "  actorjet research ask \"does group size matter\" --base-job agents/job.toml\n"
                           "  actorjet research ask \"best lr between 1e-5 and 1e-3\" --base-job agents/job.toml "
                           "--out studies/lr.toml\n"
                           "  actorjet research ask \"compare grpo, ppo and rloo on calculator\" "
                           "--base-job agents/calculator.toml\n"
                           "  actorjet research ask \"which clip setting stops the collapse?\" --base-job JOB "
                           "--planner http://localhost:8000/v1")
    ask.add_argument("question", metavar="QUESTION")
    ask.add_argument("--base-job", required=True, metavar="JOB.toml", help="the job every trial varies")
    ask.add_argument("--out", default=None, metavar="STUDY.toml",
                     help="where the draft is written (default studies/ask-WORDS.toml)")
    ask.add_argument("--planner", default="", metavar="URL", help="an OpenAI-compatible endpoint (…/v1)")
    ask.add_argument("--planner-model", default="", metavar="NAME",
                     help="the planner's model (default: the first the endpoint lists)")
    ask.add_argument("--yes", action="store_true", help="run the draft at once (research run)")
    ask.add_argument("--dir", default=None, help="with --yes: the study directory (default studies/STUDY-NAME)")
    add_swarm_options(ask)
    ask.set_defaults(func=cmd_ask)
    knobs = verbs.add_parser("knobs", help="the catalogue: every job field with its type, value, meaning and range")
    knobs.add_argument("--base-job", required=True, metavar="JOB.toml")
    knobs.add_argument("--all", action="store_true", help="also the fields with no default range")
    knobs.set_defaults(func=cmd_knobs)
    plan = verbs.add_parser("plan", help="print the stages, the trial count and a time estimate; runs nothing")
    plan.add_argument("study", metavar="STUDY.toml")
    plan.set_defaults(func=cmd_plan)
    run = verbs.add_parser("run", help="run (or resume) the study unattended")
    run.add_argument("study", metavar="STUDY.toml")
    run.add_argument("--dir", default=None, help="the study directory (default studies/STUDY-NAME)")
    run.add_argument("--follow-ups", type=int, default=0, metavar="N",
                     help="when the study ends, let the evidence pick the next question and run it, up to N "
                     "more studies (a chain in --dir: chain.sqlite, study-0/, study-1/, chain.md)")
    run.add_argument("--min-effect", type=float, default=0.02, metavar="E",
                     help="with --follow-ups: the chain stops after two studies that found nothing above E "
                     "(metric units; default 0.02)")
    run.add_argument("--planner", default="", metavar="URL",
                     help="with --follow-ups: an OpenAI-compatible endpoint that proposes each next study "
                     "(checked like any spec; the playbook decides when it is invalid)")
    run.add_argument("--planner-model", default="", metavar="NAME")
    add_swarm_options(run)
    run.set_defaults(func=cmd_run)
    status = verbs.add_parser("status", help="trials per stage and state, and the decisions so far")
    status.add_argument("dir", metavar="DIR")
    status.set_defaults(func=cmd_status)
    report = verbs.add_parser("report", help="write DIR/report.md, results.json and figures from the registry")
    report.add_argument("dir", metavar="DIR")
    report.set_defaults(func=cmd_report)


def add_swarm_options(p) -> None:
    p.add_argument("--head", default="", metavar="HOST:PORT",
                   help="run the trials on this swarm's nodes (those joined with --trials N), not on this "
                   "machine: the head's HOST:PORT, or its door's URL http://HOST:DOOR_PORT; only the door is "
                   "contacted, so this machine may be a laptop behind NAT.  As many trials run at once as the "
                   "swarm has free trial slots; a lost node's trial runs again elsewhere")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="with --head: the swarm's token (or ACTORJET_TOKEN)")


def swarm_of(args, study: dict):
    """(head, token) for --head, checked against the spec; None without it."""
    import os

    from actorjet.errors import UserError

    if not getattr(args, "head", ""):
        return None
    if study["trials"].get("port"):
        raise UserError("--head runs trials on a swarm's nodes; the spec's [trials] port names a head of its "
                        "own for every trial: use one or the other")
    token = os.environ.get("ACTORJET_TOKEN", "")
    if args.token_file:
        path = Path(args.token_file)
        if not path.is_file():
            raise UserError(f"--token-file: no file at {path}")
        token = path.read_text().strip()
    if not token:
        raise UserError("--head needs the swarm's token: --token-file FILE or ACTORJET_TOKEN")
    return args.head, token


def cmd_plan(args) -> int:
    from actorjet.research.plan import check_budget, make_plan
    from actorjet.research.study_spec import load_study

    study = load_study(args.study)
    plan = make_plan(study)
    print(f"question: {study['question']}")
    for stage in plan["stages"]:
        print(f"  {stage['name']:<9} {stage.get('trials_at_most', '')}")
    print(f"trials: at most {plan['trials_at_most']} (budget {study['budget']['max_trials']}), "
          f"~{plan['seconds_per_trial']:.0f} s each, {study['budget']['parallel']} at once: "
          f"~{plan['estimate_s'] / 60:.0f} min at most (budget {study['budget']['max_wall_s'] / 60:.0f} min)")
    where = study["trials"]
    if where["port"]:
        ports = ", ".join(str(where["port"] + 2 * i) for i in range(study["budget"]["parallel"]))
        print(f"trial heads at {where['advertise'] or where['host']} port {ports} with the token in "
              f"{where['token_file']}, {where['slots']} runner slots of their own: join nodes there with "
              f"`actorjet join HOST:PORT --token-file {where['token_file']}` once the first trial is up")
    else:
        print(f"trial heads on this machine ({where['host']}, a free port each, {where['slots']} runner slots)")
    check_budget(study, plan)
    return 0


def cmd_run(args) -> int:
    from actorjet.errors import UserError
    from actorjet.research import chain, study_report
    from actorjet.research.plan import check_budget, make_plan
    from actorjet.research.study_spec import load_study

    study = load_study(args.study)
    check_budget(study, make_plan(study))
    if getattr(args, "follow_ups", 0) < 0:
        raise UserError("--follow-ups must be 0 or more")
    if getattr(args, "follow_ups", 0) and not 0 <= args.min_effect < float("inf"):
        raise UserError(f"--min-effect must be a finite number >= 0 (in the metric's units), got {args.min_effect}")
    swarm = swarm_of(args, study)
    if getattr(args, "follow_ups", 0):
        chain_dir = Path(args.dir or f"studies/{Path(args.study).stem}-chain")
        one = functools.partial(run_one, swarm=swarm)
        path = chain.run_chain(study, chain_dir, args.follow_ups, one, min_effect=args.min_effect,
                               planner=args.planner, planner_model=args.planner_model)
        print(f"chain report: {path}")
        return 0
    study_dir = Path(args.dir or f"studies/{Path(args.study).stem}")
    run_one(study, study_dir, swarm)
    print(f"report: {study_report.build(study_dir)}")
    return 0


def run_one(study: dict, study_dir: Path, swarm: tuple | None = None) -> None:
    """One study to its end, with a progress bar per stage; ``swarm`` (head, token): its
    trials run on that swarm's nodes."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    import errno
    import sqlite3

    from actorjet.errors import UserError
    from actorjet.research.controller import Controller
    from actorjet.research.plan import check_budget, make_plan

    check_budget(study, make_plan(study))
    launcher = None
    if swarm is not None:
        from actorjet.research.launchers import SwarmTrials

        launcher = SwarmTrials(study, study_dir, *swarm)
        cap = launcher.check()
        hosts = ", ".join(f"{name}: {c['trials']}" for name, c in cap["nodes"].items())
        print(f"trials on the swarm at {launcher.url}: {cap['free']} of {cap['total']} trial slots free now "
              f"({hosts or 'no node joined with --trials yet: the study waits for one'})")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as bar:
        controller = Controller(study, study_dir, say=bar.console.print, launcher=launcher)
        tasks = {s["name"]: bar.add_task(s["name"], total=s["trials_at_most"])
                 for s in controller.plan["stages"] if "trials_at_most" in s}
        try:
            controller.run(progress=lambda stage: bar.advance(tasks[stage]))
        except (sqlite3.OperationalError, OSError) as e:      # disk full, read-only, gone
            if isinstance(e, OSError) and e.errno not in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):
                raise
            raise UserError(f"the study stopped: its files in {study_dir} cannot be written ({e}); free the "
                            "space or fix the permissions and run the same command again: it resumes") from None


def cmd_status(args) -> int:
    from actorjet.errors import UserError
    from actorjet.research.study_db import StudyRegistry

    if (Path(args.dir) / "chain.sqlite").exists():
        from actorjet.research.chain import ChainRegistry

        reg = ChainRegistry(args.dir)
        for link in reg.links():
            print(f"study {link['n'] + 1} ({link['state']}): {link['question']}\n  why: {link['why']}")
        if reg.get("stopped"):
            print(f"stopped: {reg.get('stopped')}")
        return 0
    if not (Path(args.dir) / "study.sqlite").exists():
        raise UserError(f"{args.dir} holds no study")
    reg = StudyRegistry(args.dir)
    counts: dict = {}
    for t in reg.trials():
        counts.setdefault(t["stage"], {}).setdefault(t["state"], 0)
        counts[t["stage"]][t["state"]] += 1
    print(f"question: {reg.get('spec')['question']}")
    for stage, states in counts.items():
        print(f"  {stage:<9} " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    for d in reg.decisions():
        print(f"  decided: {d['text']}")
    if reg.get("stopped"):
        print(f"  stopped: {reg.get('stopped')}")
    return 0


def cmd_report(args) -> int:
    from actorjet.research import chain, study_report

    chained = (Path(args.dir) / "chain.sqlite").exists()
    print(f"wrote {chain.report(args.dir) if chained else study_report.build(args.dir)}")
    return 0


def cmd_ask(args) -> int:
    import re

    from actorjet.errors import UserError
    from actorjet.research import ask

    job = Path(args.base_job)
    if not job.is_file():
        raise UserError(f"--base-job: no job config at {job}")
    slug = "-".join(re.findall(r"[a-z0-9]+", args.question.lower())[:6]) or "question"
    out = Path(args.out or f"studies/ask-{slug}.toml")
    spec, how = ask.draft(args.question, job, out, args.planner, args.planner_model)
    text = ask.to_toml(spec, how, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    if not args.yes:
        print(f"review it, then: actorjet research run {out}")
        return 0
    return cmd_run(argparse.Namespace(study=str(out), dir=args.dir, follow_ups=0, head=args.head,
                                      token_file=args.token_file))


def cmd_knobs(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from actorjet.config import load_job
    from actorjet.research.catalogue import catalogue

    table = Table("knob", "type", "value", "default range", "meaning")
    for e in catalogue(load_job(args.base_job)).values():
        if e["explore"] is not None or args.all:
            rule = next(iter(e["explore"].items())) if e["explore"] else None
            table.add_row(e["path"], e["type"], repr(e["value"]), f"{rule[0]} {rule[1]}" if rule else "-",
                          e["meaning"])
    Console(width=200).print(table)
    return 0
