"""Chat messages → prompt ids, tokenizing only what is new in a long conversation.

An agent sends its whole conversation on every call.  Tokenizing all of it again costs
O(context) per call (TRL measured re-tokenization at 56% of generation time at 128 turns).
Here each (episode, role) remembers its last call's rendered text and ids.  The chat template
still renders the whole text (a template is a program over the whole conversation; rendering
is string building, ~µs per message), but only the text after the last special token that
the previous call's text and this one share is tokenized:

    ids = previous ids up to that special token + tokenize(the rest of the new text)

That equals tokenizing the whole text when the tokenizer never merges across a special token
(special tokens are split out before the model's pre-tokenizer runs) and adds nothing at the
start of a piece.  Both are checked once per tokenizer on a probe conversation (``stable``);
a tokenizer that fails (a special token that strips the whitespace after it, a SentencePiece
prefix space) always renders whole.  A template that is not prefix-stable (it rewrites an
earlier turn, counts the messages at the top, strips past reasoning) or a conversation that
edits its history or changes its tools gives a text that does not start with the remembered
one: it is rendered whole, and recorded as it is.

The first call of an episode goes through a small cache of whole renders, keyed by the
conversation (as JSON): a GRPO group sends the same first conversation once per member, and
a hit skips the template and the tokenizer.
"""
from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from actorjet.runtime.logs import log
from actorjet.serving import tool_calls

STATES = 4096            # (episode, role) conversations remembered, least recently used dropped...
STATE_TOKENS = 32_000_000   # ...and beyond this many tokens in all (ids + text: ~160 MB)
FIRST_CACHE = 1_000_000  # whole renders kept: characters of their keys + their tokens (~40 MB at most)
PROBE = [{"role": "system", "content": " You help.\n"},
         {"role": "user", "content": "\n Hi  there,\tfriend"},
         {"role": "assistant", "content": " Hello!\n\n"},
         {"role": "user", "content": "  and then?"}]


@dataclass
class _State:
    text: str           # the last call's whole rendered text
    ids: array          # its prompt ids
    cut_text: int       # end of the text's last special token
    cut_ids: int        # the ids up to and including that token


class Renderer:
    def __init__(self, tokenizer, verify: bool = False):
        """``verify``: also render whole on every call and raise if the two differ (tests)."""
        self.tokenizer, self.verify = tokenizer, verify
        self.states: OrderedDict[tuple, _State] = OrderedDict()
        self.state_tokens = 0
        self.first: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()
        self.first_size = 0
        self.specials = sorted({t for t in tokenizer.all_special_tokens if t}
                               | {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                                  if getattr(t, "special", False)}, key=len, reverse=True)
        self.special_ids = {tokenizer.convert_tokens_to_ids(t) for t in self.specials}
        self.stable = bool(self.specials) and self._probe()
        self.incremental = 0        # calls rendered incrementally (for tests and benchmarks)

    # -- whole renders ---------------------------------------------------------------------
    def text(self, messages: list, tools: list | None) -> str:
        messages, tools = tool_calls.render_messages(self.tokenizer, messages, tools)
        return self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _probe(self) -> bool:
        """Does tokenizing after a special token give the ids a whole render gives?"""
        try:
            short, whole = self.text(PROBE[:2], None), self.text(PROBE, None)
        except Exception:  # noqa: BLE001 - a template that rejects the probe: render whole
            return False
        state = self._state(short, array("i", self.encode(short)))
        ok = state is not None and whole.startswith(short[:state.cut_text]) and \
            list(state.ids[:state.cut_ids]) + self.encode(whole[state.cut_text:]) == self.encode(whole)
        if not ok:
            log.info("chat rendering: this tokenizer changes ids across a special token; every call is "
                     "tokenized whole")
        return ok

    def _state(self, text: str, ids: array) -> _State | None:
        """Where the last special token ends, in the text and in the ids (None: no special
        token, or the two do not name the same token)."""
        found = max(((text.rfind(s), s) for s in self.specials), default=(-1, ""))
        if found[0] < 0:
            return None
        cut_ids = len(ids)
        while cut_ids > 0 and ids[cut_ids - 1] not in self.special_ids:
            cut_ids -= 1
        if cut_ids == 0 or ids[cut_ids - 1] != self.tokenizer.convert_tokens_to_ids(found[1]):
            return None
        return _State(text, ids, found[0] + len(found[1]), cut_ids)

    # -- a call ----------------------------------------------------------------------------
    def render(self, key: tuple, messages: list, tools: list | None) -> array:
        """The prompt ids of this call of conversation ``key`` (episode, role), as int32."""
        state = self.states.get(key)
        if state is None:                     # an episode's first call: maybe a group-mate's
            text, ids = self._first(messages, tools)
            ids = array("i", ids)
        else:
            text = self.text(messages, tools)
            if self.stable and text.startswith(state.text[:state.cut_text]):
                ids = state.ids[:state.cut_ids]
                ids.extend(self.encode(text[state.cut_text:]))
                self.incremental += 1
                if self.verify and list(ids) != self.encode(text):
                    raise AssertionError(f"incremental render differs from a whole render for {key}")
            else:
                ids = array("i", self.encode(text))
        self._remember(key, text, ids)
        return ids

    def _first(self, messages: list, tools: list | None) -> tuple[str, list[int]]:
        """(text, ids) of a conversation, from the cache when a group-mate sent it before
        (keyed by the conversation itself: a hit skips the template too)."""
        key = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False)
        hit = self.first.get(key)
        if hit is None:
            text = self.text(messages, tools)
            hit = (text, self.encode(text))
            self.first[key] = hit
            self.first_size += len(key) + len(hit[1])
            while self.first_size > FIRST_CACHE:
                old_key, (_, old_ids) = self.first.popitem(last=False)
                self.first_size -= len(old_key) + len(old_ids)
        else:
            self.first.move_to_end(key)
        return hit

    def _remember(self, key: tuple, text: str, ids: array) -> None:
        old = self.states.pop(key, None)
        self.state_tokens -= len(old.ids) if old else 0
        state = self._state(text, ids) if self.stable else None
        if state is None:
            return
        self.states[key] = state
        self.state_tokens += len(ids)
        while len(self.states) > STATES or self.state_tokens > STATE_TOKENS and len(self.states) > 1:
            _, dropped = self.states.popitem(last=False)
            self.state_tokens -= len(dropped.ids)

