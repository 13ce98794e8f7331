"""Automated research: a study spec, a plan fixed before the first trial, real ActorJet
trials, a durable study registry and a report generated from that registry alone.

    spec.py        the study TOML, checked (errors name the file and the field)
    plan.py        the stages and their trials, drawn once and stored
    registry.py    study.sqlite: every trial, its config, seed, state, metrics, decisions
    trial.py       one trial: an embedded head running a job (its own process, port, run dir)
    controller.py  runs the plan unattended, resumable after a kill at any moment
    stats.py       bootstrap confidence intervals and effect sizes
    study_report.py report.md, results.json and figures, from the registry only
"""
