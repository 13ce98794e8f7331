"""Watching a run: `report` (an HTML page of a run) and `top` (a live view of a swarm); and
taking its result out: `export` (the trained model as a Hugging Face directory)."""
from __future__ import annotations


def add_report(sub) -> None:
    p = sub.add_parser("report", help="write one self-contained HTML page of a run (plots embedded)",
                       description="Read RUN_DIR/metrics.jsonl and write RUN_DIR/report.html: reward and "
                       "held-out accuracy by step and by time, step-time breakdown, throughput, context "
                       "tracker savings, faults and restarts, live agent-code versions, per-task panels. "
                       "Works on a finished run and on one that is still training.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (the one `actorjet start` or `quickstart` printed)")
    p.add_argument("--out", default=None, metavar="FILE", help="where to write the page (default RUN_DIR/report.html)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from actorjet.monitor import report

    print(f"wrote {report.build(args.run_dir, args.out)}")
    return 0


def add_top(sub) -> None:
    from actorjet.cli.node_cmds import add_head_options

    p = sub.add_parser("top", help="a live view of a swarm: models, nodes, runners, tasks, restarts",
                       description="Full-screen view of a head, refreshed every --interval seconds, from this "
                       "machine or any other that reaches the head's door (the port after the head's). "
                       "Keys: 0 overview, 1 models, 2 nodes, 3 runners, 4 tasks, 5 supervision, q quit.")
    add_head_options(p)
    p.add_argument("--door", default=None, metavar="URL",
                   help="the head's door URL (default: from --run-dir/head.json, else http://HOST:PORT+1 of --head)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default %(default)s)")
    p.set_defaults(func=cmd_top)


def door_url(args) -> str:
    from pathlib import Path

    from actorjet.cli.node_cmds import _read_json
    from actorjet.errors import UserError

    if args.door:
        return args.door
    if args.head:
        host, _, port = args.head.rpartition(":")
        if not host or not port.isdigit():
            raise UserError(f"--head must look like HOST:PORT, got {args.head!r}")
        return f"http://{host}:{int(port) + 1}"
    info = _read_json(Path(args.run_dir) / "head.json", "pass --head HOST:PORT (and --token) or --run-dir")
    host = info.get("host", "127.0.0.1")
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{info.get('door_port', info['port'] + 1)}"


def cmd_top(args) -> int:
    from actorjet.cli import top
    from actorjet.cli.node_cmds import head_token
    from actorjet.errors import UserError

    if not 0.1 <= args.interval <= 3600:          # also refuses nan and inf
        raise UserError("--interval must be between 0.1 and 3600 seconds")
    return top.run(door_url(args), head_token(args), args.interval)


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write a run's trained model as a Hugging Face directory (LoRA merged)",
                       description="Load the newest checkpoint of MODEL in RUN_DIR and write it to OUT with "
                       "save_pretrained, tokenizer included. A LoRA adapter is merged into its base first, so "
                       "OUT loads in transformers or vLLM as is. Run it on the node that ran the learner "
                       "(its checkpoints are there).",
                       epilog="example: actorjet export runs/quickstart --model policy exported/")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    p.add_argument("out", metavar="OUT", help="a new (or empty) directory to write")
    p.add_argument("--model", default="policy", help="the model's name in the job config (default %(default)s)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from actorjet.models.export import export

    info = export(args.run_dir, args.model, args.out)
    merged = ", LoRA merged" if info["lora_merged"] else ""
    print(f"wrote {info['out']}: model {info['model']!r} at step {info['step']} ({info['checkpoint']}{merged})")
    return 0


def add_export_data(sub) -> None:
    import argparse

    p = sub.add_parser("export-data", formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="write a run's recorded trajectories as JSONL or Parquet (datasets loads it)",
                       description="One row per LLM call: messages, tools, prompt and completion ids, logprobs,\n"
                       "weight version, the episode's reward and the learner step that trained it.\n"
                       "Reads the episode stores of RUN_DIR and, with [train] keep_trajectories = true,\n"
                       "the trajectories/ archives retention wrote before it deleted trained groups.\n"
                       "Run it on the node that ran the model's subtree.",
                       epilog="example: actorjet export-data runs/quickstart data/quickstart.jsonl\n"
                              "then: datasets.load_dataset('json', data_files='data/quickstart.jsonl')")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    p.add_argument("out", metavar="OUT", help="OUT.jsonl, or OUT.parquet (needs pyarrow)")
    p.set_defaults(func=cmd_export_data)


def cmd_export_data(args) -> int:
    from actorjet.store.trajectories import export_data

    info = export_data(args.run_dir, args.out)
    print(f"wrote {info['out']}: {info['episodes']} episodes, {info['calls']} calls")
    return 0
