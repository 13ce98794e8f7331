"""Token-level repairs of a model's recorded calls before the context tracker merges them
(rl/align.py, rl/drift.py).  They need the model's tokenizer and its chat template, so they are
built here, with the model, and handed to the learner's batching as one callable."""
from __future__ import annotations

from typing import Callable

from actorjet.rl import align, drift
from actorjet.serving.openai_api import render_prompt


def for_model(tokenizer, cfg: dict) -> Callable[[list], dict]:
    """``prepare(calls) -> counts``: what the model entry asks for (``merge_ignore_tools``,
    ``merge_match = "text"``), then drift repairs; each count says how many calls it changed."""
    def prepare(calls: list) -> dict:
        counts = {}
        if cfg.get("merge_ignore_tools"):
            counts["tools_unified"] = align.unify_tools(calls, lambda msgs, tools: render_prompt(tokenizer, msgs, tools))
        if cfg.get("merge_match") == "text":
            counts["text_aligned"] = align.align_text(calls, lambda ids: tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
        counts["drift_repairs"] = drift.repair_drift(calls, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        return counts
    return prepare
