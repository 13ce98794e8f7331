"""The optional LLM planner (``[planner] kind = "llm"``): before the explore stage it is shown
the question, the knobs the spec allows and the baseline so far, and may propose narrower
ranges to explore, as JSON.  A proposal is only ever a proposal: it is validated (known knobs
only, inside the spec's ranges, every end a valid job), and an invalid one is rejected with
its reason logged in the registry; the playbook's ranges are used instead.  The endpoint is
any OpenAI-compatible server (the `openai` SDK)."""
from __future__ import annotations

import json
import os

from actorjet.errors import UserError
from actorjet.research.study_spec import KINDS, _knob

PROMPT = """You plan the explore stage of a reinforcement-learning study.
Question: {question}
Metric: {metric}
Knobs you may narrow (you may not add knobs or widen a range): {knobs}
Baseline results so far: {baseline}
Answer with one JSON object only, e.g. {{"knobs": {{"models.policy.lr": {{"log_uniform": [1e-5, 1e-3]}}}},
"why": "one sentence"}}."""


def check_planner(table: dict, where: str) -> dict | None:
    if not table:
        return None
    if table.get("kind") != "llm":
        raise UserError(f"{where}: field 'planner.kind': only \"llm\" (or leave [planner] out for the playbook)")
    for key in ("base_url", "model"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise UserError(f"{where}: field 'planner.{key}' must be a non-empty string")
    return {"kind": "llm", "base_url": table["base_url"], "model": table["model"],
            "api_key_env": str(table.get("api_key_env", "OPENAI_API_KEY"))}


def ask_json(url: str, model: str, prompt: str, api_key_env: str = "OPENAI_API_KEY") -> tuple[dict, str, str]:
    """One question to an OpenAI-compatible endpoint whose answer holds a JSON object: returns
    (the object, the model that answered, the answer's text).  ``model`` "" = the first the
    endpoint lists.  ValueError naming the cause when there is no usable answer.  The one way
    every planner here (study, ask, chain) speaks to its LLM."""
    import openai

    client = openai.OpenAI(base_url=url, api_key=os.environ.get(api_key_env, "none"), timeout=60, max_retries=1)
    try:
        model = model or client.models.list().data[0].id
        answer = client.chat.completions.create(model=model, temperature=0,
                                                messages=[{"role": "user", "content": prompt}])
        text = answer.choices[0].message.content or ""
    except (openai.OpenAIError, IndexError) as e:
        raise ValueError(f"the planner at {url} did not answer: {type(e).__name__}: {str(e)[:200]}") from None
    try:
        start, end = text.index("{"), text.rindex("}") + 1
        found = json.loads(text[start:end])
    except ValueError:
        raise ValueError(f"the planner's answer is not a JSON object: {text[:200]!r}") from None
    if not isinstance(found, dict):
        raise ValueError(f"the planner's answer is not a JSON object: {text[:200]!r}")
    return found, model, text


def propose(study: dict, baseline: list[float]) -> dict:
    """Ask the planner; returns its parsed JSON (ValueError: no usable answer)."""
    cfg = study["planner"]
    knobs = {name: {k["kind"]: k["values"]} for name, k in study["knobs"].items()}
    prompt = PROMPT.format(question=study["question"], metric=study["metric"], knobs=json.dumps(knobs),
                           baseline=baseline)
    return ask_json(cfg["base_url"], cfg["model"], prompt, cfg["api_key_env"])[0]


def validate(study: dict, proposal: dict) -> dict:
    """The knobs to explore under this proposal (ValueError with the reason if it is invalid)."""
    if not isinstance(proposal, dict) or not isinstance(proposal.get("knobs"), dict) or not proposal["knobs"]:
        raise ValueError("a proposal needs a non-empty 'knobs' object")
    knobs = dict(study["knobs"])
    for name, rule in proposal["knobs"].items():
        if name not in study["knobs"]:
            raise ValueError(f"knob {name!r} is not one of the spec's ({', '.join(study['knobs'])})")
        allowed = study["knobs"][name]
        try:
            new = _knob(study["base_job"], name, rule, "proposal")
        except UserError as e:
            raise ValueError(str(e)) from None
        if new["kind"] != allowed["kind"]:
            raise ValueError(f"knob {name!r}: {new['kind']} instead of the spec's {allowed['kind']}")
        if new["kind"] == "choice":
            if not set(map(json.dumps, new["values"])) <= set(map(json.dumps, allowed["values"])):
                raise ValueError(f"knob {name!r}: choices outside the spec's {allowed['values']}")
        elif not allowed["values"][0] <= new["values"][0] < new["values"][1] <= allowed["values"][1]:
            raise ValueError(f"knob {name!r}: {new['values']} is not inside the spec's {allowed['values']}")
        knobs[name] = new
    assert all(k["kind"] in KINDS for k in knobs.values())
    return knobs
