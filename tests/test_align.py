"""Context tracker pre-steps: text matching for re-tokenizing engines, ignoring tool lists."""
import pytest

from actorjet.rl import align
from actorjet.rl.pack import full_ids, pack
from actorjet.errors import UserError
from actorjet.config import normalize
from extras import needs_smollm2


def _call(prompt, completion, index, tools=None, messages=None):
    return {"model": "m", "role": "agent", "episode_id": "e", "call_index": index, "choice": 0,
            "prompt_ids": list(prompt), "completion_ids": list(completion), "temperature": 1.0,
            "weight_version": 0, "logprobs": [-0.5] * len(completion), "tools": tools, "messages": messages or []}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from actorjet.models import zoo
    return AutoTokenizer.from_pretrained(zoo.resolve("smollm2-135m"))


def chopped(tok, text, every=3):
    """Other ids for the same text: what an engine that re-tokenizes pieces may produce."""
    return [i for k in range(0, len(text), every) for i in tok.encode(text[k:k + every], add_special_tokens=False)]


@needs_smollm2
def test_text_mode_splices_the_sampled_ids_into_a_prompt_that_re_tokenized_them(tokenizer):
    tok = tokenizer
    first = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n"
    answer = "It is 42, of course.<|im_end|>"
    later = first + answer + "\n<|im_start|>user\nAnd 42+1?<|im_end|>\n<|im_start|>assistant\n"
    a = _call(chopped(tok, first), chopped(tok, answer), 0)
    b = _call(tok.encode(later, add_special_tokens=False), tok.encode("43", add_special_tokens=False), 1)
    assert full_ids(a) != b["prompt_ids"][:len(full_ids(a))]          # the ids really differ
    calls = [(a, 1.0), (b, -1.0)]
    assert len(pack(calls, "prefix")) == 2                             # compared by ids: no merge
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    sampled_a = full_ids(a)
    assert align.align_text(calls, decode) == 1
    merged = pack(calls, "prefix")
    assert len(merged) == 1
    seq = merged[0]
    assert seq.input_ids[:len(sampled_a)] == sampled_a                 # exactly what was sampled
    assert decode(seq.input_ids) == later + "43"                       # same text as the later call
    assert len(seq.terms) == len(a["completion_ids"]) + len(b["completion_ids"])
    assert sorted(t[1] for t in seq.terms) == sorted([1.0] * len(a["completion_ids"]) + [-1.0] * len(b["completion_ids"]))


def test_text_mode_leaves_calls_alone_when_texts_differ_or_ids_already_match(tokenizer):
    tok = tokenizer
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    a = _call(enc("Question one?"), enc(" Yes."), 0)
    b = _call(enc("Question two? Yes."), enc(" No."), 1)               # not a continuation of a
    c = _call(enc("Question one? Yes. Next?"), enc(" Ok."), 2)         # ids already match
    assert align.align_text([(a, 1.0), (b, 1.0)], decode) == 0
    before = list(c["prompt_ids"])
    assert c["prompt_ids"][:len(full_ids(a))] == full_ids(a)
    assert align.align_text([(a, 1.0), (c, 1.0)], decode) == 0 and c["prompt_ids"] == before


def test_ignore_tools_re_renders_earlier_turns_with_the_last_tool_list():
    def render(messages, tools):
        head = "T" + ",".join(t["function"]["name"] for t in tools or []) + "|"
        return [ord(ch) for ch in head + "".join(m["content"] + "#" for m in messages)]

    search = [{"type": "function", "function": {"name": "search"}}]
    both = search + [{"type": "function", "function": {"name": "calc"}}]
    turn1 = [{"role": "user", "content": "u1"}]
    turn2 = turn1 + [{"role": "assistant", "content": "c1"}, {"role": "user", "content": "u2"}]
    a = _call(render(turn1, search), [ord("c"), ord("1")], 0, search, turn1)
    b = _call(render(turn2, both), [ord("x")], 1, both, turn2)
    calls = [(a, 1.0), (b, 1.0)]
    assert len(pack(calls, "prefix")) == 2           # the tool list changed: no shared prefix
    assert align.unify_tools(calls, render) == 1
    merged = pack(calls, "prefix")
    assert len(merged) == 1 and len(merged[0].terms) == 3
    assert a["tools"] == both


def test_job_config_checks_the_match_mode():
    assert normalize({"models": [{"merge_match": "text", "merge_ignore_tools": True}]})["models"][0]["merge_match"] == "text"
    with pytest.raises(UserError, match="merge_match must be ids or text"):
        normalize({"models": [{"merge_match": "chars"}]})


def test_job_config_checks_the_attention_kernel():
    assert normalize({"models": [{"attention": "exact"}]})["models"][0]["attention"] == "exact"
    with pytest.raises(UserError, match="attention must be model or exact"):
        normalize({"models": [{"attention": "flash"}]})
