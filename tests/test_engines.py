"""Engines: batching, weight versions, and the vLLM engine where a GPU and vLLM exist."""
import importlib.util
import time
import pytest
import torch

from actorjet.models import zoo
from actorjet.serving.transformers_engine import BatchingEngine, GenRequest, GenResult, TransformersEngine
from actorjet.serving.weights import publish


def test_concurrent_requests_are_batched_and_weights_swap_between_batches(tmp_path):
    engine = TransformersEngine(zoo.tiny_arith(0), window_s=0.05)
    prompt = engine.tokenizer("12+34=")["input_ids"]
    futures = [engine.submit(GenRequest(prompt, 3, 0.0)) for _ in range(16)]
    results = [f.result(30)[0] for f in futures]
    assert engine.batches <= 2                   # 16 requests, one or two batches
    assert len({tuple(r.completion_ids) for r in results}) == 1 and results[0].weight_version == 0
    from transformers import AutoModelForCausalLM
    changed = AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0))
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(1.5)
    publish(changed.state_dict(), tmp_path / "v1.safetensors")
    busy = [engine.submit(GenRequest(prompt, 3, 1.0)) for _ in range(8)]   # in flight during the swap
    engine.load_weights(1, str(tmp_path / "v1.safetensors"))
    assert all(len(f.result(30)) == 1 for f in busy)                      # none dropped
    after = engine.submit(GenRequest(prompt, 3, 0.0)).result(30)[0]
    assert after.weight_version == 1
    for mine, theirs in zip(engine.model.parameters(), changed.parameters()):
        assert torch.equal(mine, theirs)
    engine.close()


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="the vLLM engine needs a CUDA GPU and `pip install 'actorjet[vllm]'`")
def test_vllm_engine_matches_the_contract(tmp_path):   # pragma: no cover - GPU machines only
    from actorjet.serving.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(zoo.tiny_arith(0)), dtype="float32", gpu_memory_utilization=0.2)
    prompt = engine.tokenizer("12+34=")["input_ids"]
    res = engine.submit(GenRequest(prompt, 4, 1.0, n=4, seed=1)).result(120)
    assert len(res) == 4 and all(len(r.logprobs) == len(r.completion_ids) for r in res)
    engine.close()


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="the vLLM engine needs a CUDA GPU and `pip install 'actorjet[vllm]'`")
def test_vllm_engine_serves_published_lora_adapters(tmp_path):   # pragma: no cover - GPU machines only
    from transformers import AutoModelForCausalLM

    from actorjet.rl import lora
    from actorjet.serving.vllm_engine import VLLMEngine

    cfg = lora.check({"r": 8, "alpha": 16}, "test")
    base = zoo.tiny_arith(0)
    engine = VLLMEngine(str(base), dtype="float32", gpu_memory_utilization=0.2, lora=cfg)
    prompt = engine.tokenizer("12+34=")["input_ids"]
    before = engine.submit(GenRequest(prompt, 4, 0.0)).result(120)[0]
    adapted = lora.attach(AutoModelForCausalLM.from_pretrained(base), cfg).get_base_model()
    with torch.no_grad():
        for name, p in lora.adapter_tensors(adapted).items():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    publish(lora.adapter_tensors(adapted), tmp_path / "v000001.safetensors")
    engine.load_weights(1, str(tmp_path / "v000001.safetensors"))
    after = engine.submit(GenRequest(prompt, 4, 0.0)).result(120)[0]
    assert before.weight_version == 0 and after.weight_version == 1
    assert after.logprobs != before.logprobs                 # the adapter is what serves now
    engine.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_transformers_engine_and_grpo_step_on_cuda():   # pragma: no cover - GPU machines only
    from transformers import AutoModelForCausalLM

    from actorjet.rl.pack import call_sample
    from actorjet.rl.algorithms import Algorithm
    from actorjet.rl.grpo import grpo_step

    path = zoo.tiny_arith(0)
    engine = TransformersEngine(path, device="cuda")
    prompt = engine.tokenizer("12+34=")["input_ids"]
    results = engine.submit(GenRequest(prompt, 4, 1.0, n=8, seed=2)).result(60)
    engine.close()
    model = AutoModelForCausalLM.from_pretrained(path).to("cuda")
    samples = [call_sample({"prompt_ids": prompt, "completion_ids": r.completion_ids, "logprobs": r.logprobs,
                            "temperature": 1.0, "weight_version": 0}, float(k % 2) - 0.5)
               for k, r in enumerate(results)]
    reference = AutoModelForCausalLM.from_pretrained(path).to("cuda").eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    info = grpo_step(model, optimizer, samples, Algorithm(kl=0.1), 0, ref_model=reference)
    assert info["tokens"] == sum(len(r.completion_ids) for r in results) and info["grad_norm"] > 0
    second = grpo_step(model, optimizer, samples, Algorithm(kl=0.1), 0, ref_model=reference)
    assert second["kl"] > 0          # the policy moved away from the reference on the GPU


def test_a_head_will_not_fork_cuda_models_from_a_process_that_used_cuda(monkeypatch):
    """thespian forks actors from the head's process; CUDA does not survive a fork."""
    from actorjet.errors import UserError
    from actorjet.runtime.head import refuse_cuda_before_fork

    on_gpu = {"models": [{"name": "policy", "device": "cuda"}]}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    refuse_cuda_before_fork(on_gpu)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(UserError, match="cannot use CUDA"):
        refuse_cuda_before_fork(on_gpu)
    refuse_cuda_before_fork({"models": [{"name": "policy", "device": "cpu"}]})    # CPU models may fork


class _Recording(BatchingEngine):
    """The batcher alone (its policy is under test, not a model): answers after 5 ms and
    records each batch's size."""

    def __init__(self, window_s: float, busy_window_s: float):
        self.sizes: list[int] = []
        self._start_batching(64, window_s, True, max_wait_s=1.0, busy_window_s=busy_window_s)

    def _generate(self, reqs):
        self.sizes.append(len(reqs))
        time.sleep(0.005)
        return [[GenResult([1], [-0.1], "stop", 0)] for _ in reqs]

    def _load(self, path, adapter=""):
        pass


def test_under_load_the_batcher_waits_longer_and_a_lone_caller_does_not_wait():
    """Requests that trickle in (agents sharing a CPU) are gathered into one batch once the
    engine is busy; a caller alone, one request at a time, is answered at the short window."""
    engine = _Recording(window_s=0.002, busy_window_s=0.5)
    try:
        lone = []
        for _ in range(3):
            start = time.monotonic()
            engine.submit(GenRequest([1], 1)).result(5)
            lone.append(time.monotonic() - start)
        assert max(lone) < 0.3 and engine.sizes == [1, 1, 1]
        burst = [engine.submit(GenRequest([1], 1)) for _ in range(4)]       # load: a batch of 4
        [f.result(5) for f in burst]
        trickle = []
        for _ in range(6):                                                 # then one every 40 ms
            trickle.append(engine.submit(GenRequest([1], 1)))
            time.sleep(0.04)
        [f.result(5) for f in trickle]
        assert engine.sizes[3] == 4 and engine.sizes[4] >= 4, engine.sizes   # gathered, not 6 batches of 1
    finally:
        engine.close()


def test_a_conversation_keeps_its_kv_cache_and_prefills_only_new_tokens():
    """issue 30: the engine keeps a conversation's KV cache between its calls; the next call's
    answer and logprobs equal a whole prefill's (within float32 rounding), a prompt that edits
    earlier tokens reuses only what is shared, and new weights make the cache stale."""
    import random

    from actorjet.serving.transformers_engine import GenRequest, TransformersEngine

    engine = TransformersEngine(zoo.resolve("tiny-long"), start_thread=False, prefix_cache_mb=64)
    rng = random.Random(0)
    prompt = [rng.randint(10, 90) for _ in range(1500)]
    first = engine.generate([GenRequest(prompt, 6, 0.0, cache_key="e/a")])[0][0]
    assert engine.prefix_cache.hits == 0 and "e/a" in engine.prefix_cache.entries
    for turn in range(3):
        kept = len(prompt) + len(first.completion_ids) - 1     # the last sampled token never ran
        prompt = prompt + first.completion_ids + [rng.randint(10, 90) for _ in range(200)]
        if turn == 2:
            prompt[700] = 11 if prompt[700] != 11 else 12        # an edited history: shares 700 tokens
        before = engine.prefix_cache.reused_tokens
        cached = engine.generate([GenRequest(prompt, 6, 1.0, seed=turn, cache_key="e/a")])[0][0]
        whole = engine.generate([GenRequest(prompt, 6, 1.0, seed=turn)])[0][0]
        assert cached.completion_ids == whole.completion_ids
        assert max(abs(a - b) for a, b in zip(cached.logprobs, whole.logprobs)) < 1e-4
        assert engine.prefix_cache.reused_tokens - before == (700 if turn == 2 else kept)
        first = cached
    engine.versions[""] = 7                                   # new weights: every kept cache is stale
    hits = engine.prefix_cache.hits
    engine.generate([GenRequest(prompt, 2, 0.0, cache_key="e/a")])
    assert engine.prefix_cache.hits == hits and engine.prefix_cache.used <= engine.prefix_cache.budget


def test_conversations_with_kept_caches_decode_in_one_batch_and_answer_as_alone():
    """issue 49/50: conversations that resume their kept KV caches decode together with new
    conversations, short prompts and n > 1 requests, in one batch (1 prefill sub-batch per
    new-token size, then one decode step per token), and every answer equals the request's
    answer alone with a whole prefill (ids; logprobs within float32 rounding)."""
    import random

    from actorjet.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine(zoo.resolve("tiny-long"), start_thread=False, prefix_cache_mb=64)
    engine.eos_ids = []                                   # fixed lengths: every row decodes every step
    rng = random.Random(1)
    convs = {f"e{k}/a": [rng.randint(10, 90) for _ in range(rng.randint(100, 300))] for k in range(6)}
    first = engine.generate([GenRequest(p, 5, 0.0, cache_key=key) for key, p in convs.items()])
    for (key, p), [res] in zip(convs.items(), first):
        convs[key] = p + res.completion_ids + [rng.randint(10, 90) for _ in range(rng.randint(5, 40))]
    fresh = [rng.randint(10, 90) for _ in range(180)]     # a conversation's first call, same batch
    batch = [GenRequest(p, 3 + k % 4, 1.0, seed=k, cache_key=key) for k, (key, p) in enumerate(convs.items())]
    batch += [GenRequest(fresh, 6, 0.0, cache_key="new/a"), GenRequest([12, 13, 14], 4, 1.0, seed=9, n=3),
              GenRequest(fresh[:90], 6, 1.0, seed=5, top_logprobs=2)]
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))
    hits = engine.prefix_cache.hits
    together = engine.generate(batch)
    hook.remove()
    assert engine.prefix_cache.hits - hits == 6           # every earlier conversation resumed its cache
    assert len(forwards) <= 3 + 6 - 1                     # prefill sub-batches + one step per token
    for req, got in zip(batch, together):
        alone = engine.generate([GenRequest(req.prompt_ids, req.max_tokens, req.temperature, seed=req.seed,
                                            n=req.n, top_logprobs=req.top_logprobs)])[0]
        for a, b in zip(got, alone):
            assert a.completion_ids == b.completion_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
            assert (a.top_logprobs is None) == (b.top_logprobs is None)
    assert "new/a" in engine.prefix_cache.entries and engine.prefix_cache.used <= engine.prefix_cache.budget


def test_a_groups_identical_prompts_are_prefilled_once_and_each_answers_as_alone():
    """issue 50: a GRPO group's members send the same first prompt; the engine runs it once and
    decodes every member from it, as it does for one request's n samples (SmolLM2, 8 members
    of 220 tokens: 3.2x less engine CPU a batch).  A request that resumes a kept cache is not
    merged, although its prompt is the same; every answer equals the request alone."""
    import random

    engine = TransformersEngine(zoo.resolve("tiny-long"), start_thread=False, prefix_cache_mb=64)
    engine.eos_ids = []
    rng = random.Random(2)
    shared, other = ([rng.randint(10, 90) for _ in range(n)] for n in (150, 120))
    engine.generate([GenRequest(shared[:100], 2, 0.0, cache_key="old/a")])        # a kept cache of its start
    batch = [GenRequest(shared, 5, 1.0, seed=k, cache_key=f"g{k}/a") for k in range(8)]
    batch += [GenRequest(other, 4, 1.0, seed=20 + k) for k in range(2)]
    batch += [GenRequest(shared, 3, 0.0, cache_key="old/a"), GenRequest(shared, 5, 1.0, seed=30, n=2)]
    prefilled = []
    hook = engine.model.register_forward_hook(
        lambda _m, _a, kw, _o: prefilled.append(kw["input_ids"].shape[0]) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)
    hits = engine.prefix_cache.hits
    together = engine.generate(batch)
    hook.remove()
    assert engine.prefix_cache.hits - hits == 1 and sum(prefilled) == 3   # shared, other, the kept one's rest
    assert len({tuple(r[0].completion_ids) for r in together[:8]}) > 1     # the members sampled apart
    for req, got in zip(batch, together):
        alone = engine.generate([GenRequest(req.prompt_ids, req.max_tokens, req.temperature, seed=req.seed, n=req.n)])[0]
        assert len(got) == len(alone) == req.n
        for a, b in zip(got, alone):
            assert a.completion_ids == b.completion_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert all(f"g{k}/a" in engine.prefix_cache.entries for k in range(8))  # each member kept its own cache


def test_a_long_prefix_that_prompts_share_is_prefilled_once_and_each_answers_as_alone():
    """Prompts that open with the same long prefix (a task's system prompt and worked example,
    then each problem) have the prefix run once, on one row; the batch prefills only what
    differs, identical prompts once.  Every answer equals the request alone, whole prefill."""
    import random

    engine = TransformersEngine(zoo.resolve("tiny-long"), start_thread=False, prefix_cache_mb=64)
    engine.eos_ids = []
    rng = random.Random(4)
    prefix = [rng.randint(10, 90) for _ in range(100)]
    tails = [[k + 10] + [rng.randint(10, 90) for _ in range(rng.randint(10, 19))] for k in range(6)]
    batch = [GenRequest(prefix + t, 5, 1.0, seed=k, cache_key=f"p{k}/a") for k, t in enumerate(tails)]
    batch += [GenRequest(prefix + tails[k], 4, 1.0, seed=10 + k) for k in (0, 3)]      # same prompts again
    batch += [GenRequest([rng.randint(10, 90) for _ in range(30)], 4, 0.0)]              # shares nothing
    prefilled = []
    hook = engine.model.register_forward_hook(
        lambda _m, _a, kw, _o: prefilled.append(tuple(kw["input_ids"].shape)) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)
    together = engine.generate(batch)
    hook.remove()
    assert sorted(prefilled) == [(1, 100), (7, 30)], prefilled     # the prefix once; 6 tails + the other
    for req, got in zip(batch, together):
        alone = engine.generate([GenRequest(req.prompt_ids, req.max_tokens, req.temperature, seed=req.seed)])[0][0]
        assert got[0].completion_ids == alone.completion_ids
        assert max(abs(x - y) for x, y in zip(got[0].logprobs, alone.logprobs)) < 1e-4
    kept = engine.prefix_cache.entries["p2/a"]                        # a member's own cache: its whole prompt
    assert len(kept.ids) // 4 == len(batch[2].prompt_ids) + 4


def test_rows_are_grouped_only_when_padding_costs_more_than_a_pass():
    from actorjet.serving.kv_rows import partition

    assert partition([10, 12, 11], 100) == [[0, 1, 2]]                     # padding 3 < one more pass
    groups = partition([30000, 100, 120, 31000, 90], 1000)
    assert sorted(map(sorted, groups)) == [[0, 3], [1, 2, 4]]
    assert partition([5, 500], 600, weights=[1, 8]) == [[0, 1]]            # one short row: pad it
    assert partition([5, 500], 600, weights=[8, 1]) == [[0], [1]]          # eight short rows: apart
    assert partition([], 10) == [[]]


def test_fixed_shape_decode_steps_answer_as_the_growing_cache_does():
    """issue 49: the decode steps a GPU replays as a CUDA graph (kv_rows.StaticDecode: every
    layer attends over its whole reserved buffer, the mask hides what is not written yet) give
    the same tokens and logprobs as the growing cache, kept caches and padding included; here
    they run eagerly on the CPU (the graph itself needs a GPU: bench/gpu_check.sh)."""
    import random

    from actorjet.serving.transformers_engine import TransformersEngine

    rng = random.Random(3)
    convs = [[rng.randint(10, 90) for _ in range(rng.randint(70, 200))] for _ in range(4)]
    answers = {}
    for static in (False, True):
        engine = TransformersEngine(zoo.resolve("tiny-long"), start_thread=False, prefix_cache_mb=64,
                                    static_decode=static)
        engine.eos_ids = []
        first = engine.generate([GenRequest(c, 6, 0.0, cache_key=f"c{k}") for k, c in enumerate(convs)])
        longer = [c + r[0].completion_ids + [11, 12, 13] for c, r in zip(convs, first)]
        again = engine.generate([GenRequest(c, 9, 1.0, seed=k, cache_key=f"c{k}") for k, c in enumerate(longer)]
                                + [GenRequest([12, 13], 5, 1.0, seed=7, n=2)])
        assert engine.prefix_cache.hits == 4
        answers[static] = [r for res in first + again for r in res]
    for a, b in zip(answers[False], answers[True]):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
