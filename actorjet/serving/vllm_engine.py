"""The vLLM engine for GPU machines (``pip install 'actorjet[vllm]'`` in its own environment:
vLLM pins its own torch).  Imported only when a model config says ``engine = "vllm"``.

Same contract as the transformers engine: token ids in; token ids, the logprob of every
sampled token and the weight version out; new weights between batches.  vLLM schedules the
batch itself (continuous batching, prefix caching); weights are loaded on every worker
through ``collective_rpc`` from the learner's safetensors file.  With LoRA, vLLM's own LoRA
support serves base + adapter: each published adapter becomes a peft-format directory and a
new ``LoRARequest`` (vLLM caches adapters by id, so every version gets a fresh id).
"""
from __future__ import annotations

from actorjet.errors import UserError
from actorjet.serving.batching_engine import BatchingEngine, GenRequest, GenResult


def _load_on_worker(worker, path: str) -> None:
    """Runs inside each vLLM worker process."""
    from safetensors.torch import load_file

    worker.model_runner.model.load_weights(weights=load_file(path).items())


class VLLMEngine(BatchingEngine):
    def __init__(self, model_dir: str, dtype: str = "bfloat16", seed: int = 0, max_batch: int = 1024,
                 window_s: float = 0.004, gpu_memory_utilization: float = 0.6, start_thread: bool = True,
                 crash_on_thread_death: bool = False, lora: dict | None = None, tensor_parallel_size: int = 1):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as e:
            raise UserError(f"engine = 'vllm' needs vLLM ({e}); install actorjet[vllm] in an environment "
                            "with a GPU, or use engine = 'transformers'") from None
        self.SamplingParams = SamplingParams
        kwargs = dict(model=str(model_dir), dtype=dtype, seed=seed, enable_prefix_caching=True,
                      gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size)
        self.model_dir, self.lora, self.lora_request, self.lora_serial = str(model_dir), lora or {}, None, 0
        if self.lora:
            kwargs.update(enable_lora=True, max_lora_rank=max(8, self.lora["r"]), max_loras=2)
        try:    # sampled-token logprobs after temperature, as the learner recomputes them
            self.llm = LLM(logprobs_mode="processed_logprobs", **kwargs)
        except TypeError:
            self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._start_batching(max_batch, window_s, start_thread, crash_on_thread_death=crash_on_thread_death)

    def _generate(self, reqs: list[GenRequest]) -> list[list[GenResult]]:
        self.batches += 1
        params = [self.SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens,
                                      stop=r.stop or None, seed=r.seed, logprobs=r.top_logprobs,
                                      # the stop's tokens stay in the answer, as the transformers engine
                                      # keeps them: the gateway cuts the text itself (a named tool call's
                                      # closing must stay, serving/tool_choice.py)
                                      include_stop_str_in_output=True)
                  for r in reqs]
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in reqs]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)
        results = []
        for req, out in zip(reqs, outputs):
            choices = []
            for c in out.outputs:
                ids = list(c.token_ids)
                steps = c.logprobs or []
                lps = [step[t].logprob for step, t in zip(steps, ids)]
                top = [sorted(((tid, lp.logprob) for tid, lp in step.items()), key=lambda x: -x[1])[:req.top_logprobs]
                       for step in steps] if req.top_logprobs else None
                choices.append(GenResult(ids, lps, "length" if c.finish_reason == "length" else "stop",
                                         self.weight_version, top))
            results.append(choices)
        return results

    def _load(self, path: str, adapter: str = "") -> None:
        if self.lora:
            self._load_adapter(path)
            return
        self.llm.collective_rpc(_load_on_worker, args=(path,))
        self.llm.reset_prefix_cache()     # cached KV blocks belong to the old weights

    def _load_adapter(self, path: str) -> None:
        from pathlib import Path

        from safetensors.torch import load_file
        from vllm.lora.request import LoRARequest

        from actorjet.rl.lora import save_peft_dir

        self.lora_serial += 1
        folder = Path(path).with_suffix(".peft")
        save_peft_dir(load_file(path), self.lora, self.model_dir, folder)
        old, self.lora_request = self.lora_request, LoRARequest(f"v{self.lora_serial}", self.lora_serial, str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
