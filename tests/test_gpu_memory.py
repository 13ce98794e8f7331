"""issue 49: on a GPU the engine's KV budget comes from the device (a declared share less its
weights), a share that cannot hold them fails at start in one line, and ``device = "auto"``
is the default."""
import pytest

from actorjet.config import normalize
from actorjet.errors import UserError
from actorjet.runtime import gpu_memory, gpus

GIB = 1024 ** 3


def model(**fields) -> dict:
    return normalize({"models": [fields]})["models"][0]


def test_the_default_device_is_auto_and_auto_means_a_gpu_where_there_is_one():
    assert model()["device"] == "auto"
    assert gpus.resolve("auto", count=0) == "cpu" and gpus.resolve("auto", count=1) == "cuda"
    assert gpus.resolve("cpu", count=8) == "cpu"
    assert gpus.device_for({"device": "auto"}, count=0) == "cpu"


def test_an_engine_and_a_learner_share_a_gpu_only_when_there_are_too_few():
    cfg = model()
    assert gpu_memory.shares_gpu(cfg, 1) and not gpu_memory.shares_gpu(cfg, 2)
    assert not gpu_memory.shares_gpu(model(trainable=False), 1)          # nothing trains beside it
    assert gpu_memory.shares_gpu(model(learner={"ranks": 2}), 2)          # engine + 2 ranks on 2 GPUs
    assert gpu_memory.engine_share(cfg, 1) == pytest.approx(0.92 - 0.4)
    assert gpu_memory.engine_share(cfg, 2) == pytest.approx(0.92)


def test_the_kv_budget_is_the_engines_share_less_weights_and_headroom():
    from transformers import LlamaConfig

    eight_b = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768)
    headroom = gpu_memory.headroom_bytes(eight_b, 256, 2)
    assert 3 * GIB < headroom < 6 * GIB
    h200, weights = 139 * GIB, 16 * GIB
    alone = gpu_memory.kv_budget_mb(h200, 0.92, weights, headroom) * 2 ** 20
    assert alone == pytest.approx(0.92 * h200 - weights - headroom)
    assert alone > 100 * GIB                     # a 32k-token conversation's KV (4.3 GB) fits 20 times over
    with pytest.raises(UserError, match="does not hold its weights"):
        gpu_memory.kv_budget_mb(24 * GIB, 0.52, weights, headroom, "policy")


def test_shares_outside_their_range_are_refused_in_one_line():
    for bad in ({"gpu_memory_utilization": 1.5}, {"learner_gpu_memory": 0.95}, {"learner_gpu_memory": 0}):
        with pytest.raises(UserError, match="gpu_memory_utilization"):
            model(**bad)
    with pytest.raises(UserError, match="prefix_cache_mb"):
        model(prefix_cache_mb=-3)


def test_the_cpu_keeps_1024_mb_unless_the_job_says():
    from actorjet.models import zoo
    from actorjet.serving.transformers_engine import TransformersEngine

    assert TransformersEngine(zoo.resolve("tiny-long"), start_thread=False).prefix_cache.budget == 1024 * 2 ** 20
    assert TransformersEngine(zoo.resolve("tiny-long"), start_thread=False,
                              prefix_cache_mb=8).prefix_cache.budget == 8 * 2 ** 20
