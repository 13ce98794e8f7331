#!/usr/bin/env bash
# Every GPU path in one run of at most ~8 minutes on one H200 (issue 49), and the same steps on
# this machine's CPU at tiny shapes with --dry-run (minutes; the suite runs it, slow tier).
#
#   bash bench/gpu_check.sh             # on a lent GPU machine (device tool): results in $OUT/gpu-*.json
#   bash bench/gpu_check.sh --dry-run   # here, before spending device time: results in a temp dir
#
# On the GPU machine nothing is downloaded: dependencies missing from its image travel as
# wheels in an ignored .whl/ (../shared/notes/gpu.md lists them) and models are random-init
# of real shapes (actorjet/models/shapes.py) or built here in seconds (tiny-long, tiny-arith).
# Each step has its own time limit and the script goes on after a failure: one broken path
# must not hide the others' figures.  What each step measures:
#   tests          the CUDA tests (engines, kept caches in one batch, fixed-shape decode,
#                  collectives on the group's device, GPU memory shares, long samples)
#   long-episode   one 50-turn episode growing to 32k tokens, 8B shape, default KV budget:
#                  last turn / first turn (target <= 1.5)
#   decode         ms per decode step at batch 1 and 64 (8B shape; target <= 7.5 ms at 1) and
#                  64 conversations with kept caches / without (target >= 0.9)
#   ranks          one FSDP2 rank over nccl against one process (equal within the gloo
#                  test's tolerance), and two engine replicas on one GPU
#   long-sample    the learner on one 32k-token sample: 8B shape + LoRA, 0.5B shape full
#   vs-trl         bench/vs_trl.py, both frameworks on the GPU
#   rl-throughput  0.5B shape, 32 groups of 8, 256-token answers: ActorJet / TRL samples/s
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
if [ $dry = 1 ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXX")
  dev=cpu big="shape:tiny" big_dtype=float32 mid="shape:tiny"
  turns=8 conversations=16 ranks_sizes="--repeats 1 --episodes 4"     # each path once, in seconds
else
  out=${OUT:-/tmp/out}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site || exit 1
  nvidia-smi -L; nproc
  dev=cuda big="shape:llama3-8b" big_dtype=bfloat16 mid="shape:qwen2.5-0.5b"
  turns=50 conversations=64 ranks_sizes="--repeats 2 --episodes 16"
fi
mkdir -p "$out"
export ACTORJET_BENCH_RESULTS="$out"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
failed=""
# Each step's limit keeps one hung path from spending the device's minutes.  The dry run's
# steps take seconds alone but share two cores with the suite's other workers (ranks, 23 s
# alone, once took 94 s there): their limits are 4x, the suite's own timeout bounds the whole.
slack=1
[ $dry = 1 ] && slack=4
step() {   # step NAME SECONDS COMMAND...: run it, keep its log, note a failure and go on
  local name=$1 limit=$(( $2 * slack )); shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  if ! timeout "$limit" "$@" > "$out/gpu-$name.log" 2>&1; then failed="$failed $name"; fi
  tail -4 "$out/gpu-$name.log"
  echo "   $name took $((SECONDS - t0)) s"
}
# (the suite's own run of --dry-run sets GPU_CHECK_SKIP_TESTS=1: it runs these tests anyway)
[ "${GPU_CHECK_SKIP_TESTS:-0}" = 1 ] || step tests 120 python3 -m pytest -q -rs -p no:cacheprovider -n 0 tests/test_engines.py tests/test_gpus.py \
  tests/test_collectives.py tests/test_gpu_memory.py tests/test_long_sample.py -m "not slow"
step long-episode 90 python3 bench/kept_caches.py --model "$big" --device $dev --dtype $big_dtype --conversations 1 \
  --turns "$turns" --context 640 --grow 640 --answer 8 --modes keys --label gpu-long-episode
step decode 90 python3 bench/kept_caches.py --model "$big" --device $dev --dtype $big_dtype --conversations $conversations \
  --turns 3 --context 400 --grow 40 --answer 32 --cache-mb 16384 --label gpu-decode
step ranks 90 python3 bench/scale.py --model tiny-long --device $dev $ranks_sizes --label gpu-ranks
if [ $dry = 1 ]; then
  step long-sample 60 python3 bench/long_sample.py --smoke --lora --label gpu-long-sample-lora
  step long-sample-full 60 python3 bench/long_sample.py --smoke --label gpu-long-sample-full
  step vs-trl 240 python3 bench/vs_trl.py --smoke --label gpu-vs-trl
  step rl-throughput 240 python3 bench/rl_throughput.py --smoke --label gpu-rl-throughput
else
  step long-sample 60 python3 bench/long_sample.py --model "$big" --lora --device cuda --tokens 32768 --repeats 2 \
    --label gpu-long-sample-8b-lora
  step long-sample-full 45 python3 bench/long_sample.py --model "$mid" --device cuda --dtype float32 --tokens 32768 \
    --repeats 2 --label gpu-long-sample-0.5b-full
  step vs-trl 120 python3 bench/vs_trl.py --device cuda --seeds 1 --steps 40 --label gpu-vs-trl
  step rl-throughput 180 python3 bench/rl_throughput.py --device cuda --steps 5 --warmup 1 --timeout 150 \
    --label gpu-rl-throughput
fi
ls "$out"
if [ -n "$failed" ]; then echo "FAILED:$failed"; exit 1; fi
echo "every GPU check ran"
