"""What the gateway records for every LLM call (kept in the model's episode store).

Tokens are the truth: a record holds the exact prompt and completion ids the engine saw
and produced, with the logprob of every sampled token and the weight version, so nothing
downstream ever re-tokenizes text (the classic multi-turn drift bug).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields


@dataclass
class CallRecord:
    episode_id: str
    model: str
    role: str
    call_index: int              # order of the call inside the episode (per gateway)
    choice: int                  # index among the n choices of one request
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    weight_version: int
    temperature: float
    messages: list = field(default_factory=list)
    tools: list | None = None
    params: dict = field(default_factory=dict)
    finish_reason: str = ""
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        # Shallow on purpose: records are never mutated after they are stored, and
        # dataclasses.asdict deep-copies every id list (a fifth of the gateway's CPU).
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(CallRecord))
