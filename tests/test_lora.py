"""LoRA (rl/lora.py) and weight versions as files (serving/weights.py), on the real tiny model:
a step trains the adapter only, the engine serves base + published adapter with the
learner's logprobs, export merges it into a plain model, and a publish killed midway leaves
the old version serving."""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actorjet.cli.main import main
from actorjet.errors import UserError
from actorjet.config import normalize
from actorjet.rl import lora
from actorjet.rl.algorithms import Algorithm
from actorjet.rl.grpo import collate, grpo_step, term_logprobs
from actorjet.rl.pack import call_sample
from actorjet.serving import engine_wire, weights
from actorjet.models import zoo
from actorjet.serving.transformers_engine import GenRequest, TransformersEngine

CFG = lora.check({"r": 4, "alpha": 8}, "test")


@pytest.fixture(scope="module")
def model_dir():
    return zoo.tiny_arith(0)


def adapted(model_dir, seed=0):
    """The tiny model with a fresh adapter whose B is random (a trained-looking adapter)."""
    torch.manual_seed(seed)
    peft_model = lora.attach(AutoModelForCausalLM.from_pretrained(model_dir), CFG)
    with torch.no_grad():
        for name, p in lora.adapter_tensors(peft_model.get_base_model()).items():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return peft_model


def sampled(engine, text="23+45=", n=8, seed=11):
    prompt = engine.tokenizer(text)["input_ids"]
    results = engine.generate([GenRequest(prompt, max_tokens=4, temperature=1.0, n=n, seed=seed)])[0]
    return [{"prompt_ids": prompt, "completion_ids": r.completion_ids, "logprobs": r.logprobs,
             "temperature": 1.0, "weight_version": r.weight_version} for r in results]


def test_a_lora_step_changes_only_the_adapter(model_dir):
    peft_model = lora.attach(AutoModelForCausalLM.from_pretrained(model_dir), CFG)
    model = peft_model.get_base_model()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n)
    engine = TransformersEngine(model_dir, seed=3, start_thread=False)
    calls = sampled(engine)
    samples = [call_sample(c, 1.0 if k % 2 else -1.0) for k, c in enumerate(calls)]
    grpo_step(model, torch.optim.AdamW(trainable, lr=1e-2), samples, Algorithm(), pad_id=0)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)                # the base is untouched
    assert any("lora_B" in k for k in changed)                           # B left zero: the adapter learned


def test_the_engine_serves_the_published_adapter_with_the_learners_logprobs(model_dir, tmp_path):
    model = adapted(model_dir).get_base_model()
    path = tmp_path / "v000001.safetensors"
    size = weights.publish(lora.adapter_tensors(model), path)
    full = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    assert size < full / 5                                               # a version is the adapter, not the model
    engine = TransformersEngine(model_dir, seed=3, start_thread=False, lora=CFG)
    base_calls = sampled(engine)
    engine.load_weights(1, str(path))
    engine._apply_weights()
    calls = sampled(engine)
    assert all(c["weight_version"] == 1 for c in calls)
    for call in calls:
        with torch.no_grad():
            lp = term_logprobs(model, collate([call_sample(call, 1.0)], 0))
        assert torch.allclose(lp, torch.tensor(call["logprobs"]), atol=1e-4)
    # and the adapter matters: the same seeds under the base model give other logprobs
    assert any(abs(a - b) > 1e-3 for x, y in zip(base_calls, calls) for a, b in zip(x["logprobs"], y["logprobs"]))


def test_export_writes_the_merged_model_that_transformers_loads(model_dir, tmp_path):
    peft_model = adapted(model_dir, seed=1)
    folder = tmp_path / "run" / "checkpoints" / "policy" / "step_000004"
    peft_model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)
    (folder / "state.json").write_text(json.dumps({"step": 4, "weight_version": 4}))
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "run"), str(out), "--model", "policy"]) == 0
    assert json.loads((out / "actorjet.json").read_text())["lora_merged"] is True
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in k for k in merged.state_dict())             # plain transformers, no peft
    # its greedy answers are the ones the engine serves with the adapter
    path = tmp_path / "v000004.safetensors"
    weights.publish(lora.adapter_tensors(peft_model.get_base_model()), path)
    served = TransformersEngine(model_dir, start_thread=False, lora=CFG)
    served.load_weights(4, str(path))
    served._apply_weights()
    plain = TransformersEngine(str(out), start_thread=False)
    for text in ("12+34=", "7+8=", "40+2=", "99+1="):
        prompt = served.tokenizer(text)["input_ids"]
        a = served.generate([GenRequest(prompt, 4, 0.0)])[0][0].completion_ids
        b = plain.generate([GenRequest(prompt, 4, 0.0)])[0][0].completion_ids
        assert a == b, text


def test_export_mistakes_are_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    (tmp_path / "run").mkdir()
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out"), "--model", "policy"]) == 2
    err = capsys.readouterr().err
    assert "no such run directory" in err and "no checkpoint of model 'policy'" in err and "Traceback" not in err


def test_lora_fields_are_checked():
    assert normalize({"models": [{"lora": {"r": 8}}]})["models"][0]["lora"]["target_modules"] == "all-linear"
    assert normalize({"models": [{}]})["models"][0]["lora"] == {}
    for bad, says in (({"r": 0}, "r must be"), ({"r": 10**9}, "r must be"), ({"r": True}, "r must be"),
                      ({"rank": 8}, "unknown field 'rank'"), ({"alpha": float("nan")}, "alpha must be a finite"),
                      ({"alpha": float("inf")}, "alpha must be a finite"), ({"alpha": "32"}, "alpha must be"),
                      ({"target_modules": []}, "target_modules"), ({"target_modules": ""}, "target_modules"),
                      ({"dropout": 1.5}, "dropout"), ({"dropout": float("nan")}, "dropout")):
        with pytest.raises(UserError, match=says):
            normalize({"models": [{"lora": bad}]})
    with pytest.raises(UserError, match="model name '../x'"):       # it names folders: weights/NAME/
        normalize({"models": [{"name": "../x"}]})


def test_weights_round_trip_with_tied_tensors_once(model_dir, tmp_path):
    from safetensors.torch import load_file

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.25)
    path = tmp_path / "v000003.safetensors"
    weights.publish(model.state_dict(), path, {"version": "3"})
    assert set(load_file(str(path))) <= set(model.state_dict())         # a standard safetensors file
    other = AutoModelForCausalLM.from_pretrained(model_dir)
    weights.load_into(other.state_dict(), path)
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="does not have"):
        weights.load_into({}, path)


KILLED_WRITER = """
import sys, torch
from actorjet.serving import weights
tensors = {f"t{i}": torch.full((64, 1024, 1024), float(i)) for i in range(int(sys.argv[2]))}   # 256 MB each
print("ready", flush=True)
weights.publish(tensors, sys.argv[1])
"""


def test_a_publish_killed_midway_leaves_the_old_version_serving(model_dir, tmp_path):
    """The learner is SIGKILLed while it writes version 2: no v2 file exists (only its partial),
    the engine and a restarted engine serve version 1, and the next publish arrives whole."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    weights.publish(model.state_dict(), tmp_path / "v000001.safetensors")
    target = tmp_path / "v000002.safetensors"
    partial = tmp_path / ("v000002.safetensors" + weights.PARTIAL)
    for count in (4, 8, 12):            # bigger until the kill lands while the file is written
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target), str(count)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            deadline = time.time() + 60
            while not partial.exists() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.001)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        if not target.exists():
            break
        target.unlink()
    assert partial.exists() and not target.exists()
    engine = TransformersEngine(model_dir, start_thread=False)          # an engine (re)started meanwhile
    assert weights.newest(tmp_path).name == "v000001.safetensors"
    engine.load_weights(2, str(target))                                 # announced, never completed
    engine._apply_weights()
    assert engine.weight_version == 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    weights.publish(model.state_dict(), target)                         # the next publish: whole
    partial.unlink(missing_ok=True)
    engine.load_weights(2, str(target))
    engine._apply_weights()
    assert engine.weight_version == 2
    for a, b in zip(engine.model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_a_lora_job_trains_survives_a_learner_kill_and_exports(swarm, tmp_path):
    """A LoRA job end to end: versions are adapters, a SIGKILLed learner resumes from its
    adapter checkpoint, and the run exports a merged model."""
    from actorjet.runtime.head import attach_root, status as head_status
    from jobs import tiny_arith
    from swarm import REPO, pid_of, wait_until

    # 16 groups a step: slow enough (~1 s a step) that the kill lands mid-training
    (tmp_path / "job.toml").write_text(tiny_arith(16, groups_per_step=16, model='checkpoint_every = 4\n'
                                                  'checkpoint_keep_last = 2\ncheckpoint_keep_best = 0\n'
                                                  'lora = { r = 4, alpha = 8 }'))
    run = tmp_path / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    wait_until(lambda: status()["models"][0]["learner_step"] >= 4, 180, interval_s=0.2, what="4 learner steps")
    os.kill(pid_of(port, "model.policy/learner"), signal.SIGKILL)
    killed_at = status()["models"][0]["learner_step"]
    wait_until(lambda: status()["training_finished"], 240, interval_s=1, what="16 learner steps")
    wait_until(lambda: status()["restarts"].get("root/model.policy/learner", 0) >= 1, 30, what="the learner restarted")
    assert killed_at < 16, killed_at
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    full = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(zoo.tiny_arith(0)).parameters())
    assert train and all(0 < r["publish_bytes"] < full / 5 for r in train)      # every version an adapter
    # resumed from an adapter checkpoint (steps fly on a quiet machine: the kill may land late)
    assert re.search(r"policy resumed at step (4|8|12|16) ", (run / "logs" / "head" / "actors.log").read_text())
    kept = sorted((run / "checkpoints" / "policy").glob("step_*"))
    assert [p.name for p in kept] == ["step_000012", "step_000016"]      # the newest 2 (and no "best")
    last = kept[-1]
    assert (last / "adapter_config.json").exists() and not (last / "model.safetensors").exists()
    out = tmp_path / "exported"
    assert main(["export", str(run), str(out)]) == 0
    assert json.loads((out / "actorjet.json").read_text())["step"] == 16
    AutoModelForCausalLM.from_pretrained(out)


def test_a_recycled_file_read_meanwhile_is_a_torn_read_and_the_engine_loads_the_newest(model_dir, tmp_path,
                                                                                      monkeypatch):
    """The learner overwrites the file of version v-3; an engine that was still reading it
    (two versions behind) must notice and load a whole version, never serve the mix."""
    learner = AutoModelForCausalLM.from_pretrained(model_dir)
    state = learner.state_dict()

    def publish(v):
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(0.001)
        return weights.publish(state, tmp_path / f"v{v:06d}.safetensors", {"version": f"{v:012d}"},
                               recycle=tmp_path / f"v{v - 3:06d}.safetensors")

    sizes = {publish(v) for v in (1, 2, 3)}
    inode = (tmp_path / "v000001.safetensors").stat().st_ino
    publish(4)
    assert len(sizes) == 1 and not (tmp_path / "v000001.safetensors").exists()
    assert (tmp_path / "v000004.safetensors").stat().st_ino == inode      # the same file, overwritten
    engine = TransformersEngine(model_dir, start_thread=False)
    real_pread, calls = weights._pread, []

    def pread_while_the_learner_publishes(fd, into, offset):
        calls.append(offset)
        if len(calls) == 3:
            publish(5)               # recycles v000002, the file being read
        return real_pread(fd, into, offset)

    monkeypatch.setattr(weights, "_pread", pread_while_the_learner_publishes)
    with pytest.raises(weights.TornRead):
        weights.load_into(engine.model.state_dict(), tmp_path / "v000002.safetensors")
    calls.clear()
    engine.load_weights(4, str(tmp_path / "v000004.safetensors"))      # the engine reads v4; v7 recycles it
    monkeypatch.setattr(weights, "_pread", lambda fd, into, offset: (
        calls.append(offset), len(calls) == 3 and publish(7), real_pread(fd, into, offset))[-1])
    publish(6)
    engine._apply_weights()
    assert engine.weight_version == 7 and not (tmp_path / "v000004.safetensors").exists()
    for a, b in zip(engine.model.state_dict().values(), learner.state_dict().values()):
        assert torch.equal(a, b)                                        # whole v7, not the mix


def test_one_engine_serves_two_adapters_of_one_base_each_at_its_own_version(model_dir, tmp_path):
    """base = "other": a second model is a second adapter in the other's engine.  A batch that
    mixes both is served per adapter, with each learner's logprobs and weight version."""
    mine, theirs = adapted(model_dir, seed=1).get_base_model(), adapted(model_dir, seed=2).get_base_model()
    weights.publish(lora.adapter_tensors(mine), tmp_path / "adder.safetensors")
    weights.publish(lora.adapter_tensors(theirs), tmp_path / "rounder.safetensors")
    engine = TransformersEngine(model_dir, start_thread=False, lora=CFG, adapters={"rounder": CFG})
    engine.load_weights(3, str(tmp_path / "adder.safetensors"))
    engine.load_weights(5, str(tmp_path / "rounder.safetensors"), adapter="rounder")
    engine._apply_weights()
    assert engine.versions == {"": 3, "rounder": 5}
    prompt = engine.tokenizer("23+45=")["input_ids"]
    reqs = [GenRequest(prompt, 4, 1.0, n=4, seed=7, adapter=a) for a in ("", "rounder", "", "rounder")]
    results = engine.generate(reqs)
    assert [r[0].weight_version for r in results] == [3, 5, 3, 5]
    for req, res in zip(reqs, results):
        model = theirs if req.adapter else mine
        for r in res:
            call = {"prompt_ids": prompt, "completion_ids": r.completion_ids, "logprobs": r.logprobs,
                    "temperature": 1.0, "weight_version": r.weight_version}
            with torch.no_grad():
                lp = term_logprobs(model, collate([call_sample(call, 1.0)], 0))
            assert torch.allclose(lp, torch.tensor(r.logprobs), atol=1e-4)
    with pytest.raises(ValueError, match="no adapter 'nobody'"):
        engine.generate([GenRequest(prompt, 4, 1.0, adapter="nobody")])


def test_a_shared_base_is_checked_and_its_engine_is_refused_in_the_tree():
    from actorjet.config import engine_of, load_job, sharing
    from actorjet.runtime.head import refuse_engines_of_adapters
    from actorjet.runtime.tree_spec import load_tree
    from swarm import REPO

    lora_ = {"r": 4}
    job = normalize({"models": [{"name": "a", "lora": lora_}, {"name": "b", "base": "a", "lora": lora_}]})
    assert engine_of(job, "b") == "a" and engine_of(job, "a") == "a" and list(sharing(job, "a")) == ["b"]
    for models, says in (
            ([{"name": "a", "lora": lora_}, {"name": "b", "base": "c", "lora": lora_}], "must name another model"),
            ([{"name": "a", "lora": lora_}, {"name": "b", "base": "b", "lora": lora_}], "must name another model"),
            ([{"name": "a"}, {"name": "b", "base": "a", "lora": lora_}], "both models need a lora table"),
            ([{"name": "a", "lora": lora_, "source": "tiny-judge"}, {"name": "b", "base": "a", "lora": lora_}],
             "the source must be the same"),
            ([{"name": "a", "lora": lora_, "engine": "vllm"}, {"name": "b", "base": "a", "lora": lora_}],
             "only the transformers engine")):
        with pytest.raises(UserError, match=says):
            normalize({"models": models})
    tree = load_tree(REPO / "supervisors" / "two_models.toml")        # an engine in every subtree
    shared = normalize({"models": [{"name": "proposer", "lora": lora_},
                                   {"name": "verifier", "base": "proposer", "lora": lora_}]})
    with pytest.raises(UserError, match="model 'verifier' is an adapter served by the engine of 'proposer'"):
        refuse_engines_of_adapters(tree, shared)
    refuse_engines_of_adapters(load_tree(REPO / "supervisors" / "shared_base.toml"),
                               load_job(REPO / "agents" / "shared_base.toml"))      # the shipped pair agrees


def test_a_weight_push_arrives_whole_and_bad_pushes_get_4xx(tmp_path):
    """The engine's weights receiver (serving/weights.py): a version from a learner on another
    node is stored under the engine's own directory; a wrong token, a name that is not a
    version file, or a body cut short is refused with a 4xx and leaves no file."""
    import http.client
    import threading

    receiver = engine_wire.Receiver(tmp_path / "received", "tok")
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{receiver.port}"
        src = tmp_path / "v000001.safetensors"
        weights.publish({"w": torch.arange(3_000_000, dtype=torch.float32)}, src)
        stored = engine_wire.push(src, url, "tok", "policy")
        assert Path(stored) == tmp_path / "received" / "policy" / "v000001.safetensors"
        assert Path(stored).read_bytes() == src.read_bytes()
        with pytest.raises(OSError, match="401"):
            engine_wire.push(src, url, "wrong", "policy")

        def put(path, body, length=None):
            conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=30)
            conn.putrequest("PUT", path)
            conn.putheader("Authorization", "Bearer tok")
            conn.putheader("Content-Length", str(len(body) if length is None else length))
            conn.endheaders()
            conn.send(body)
            if length is not None:        # the learner died mid-push (the receiver may have answered
                with contextlib.suppress(OSError):       # and closed already: a refusal by the header)
                    conn.sock.shutdown(socket.SHUT_WR)
            try:
                return conn.getresponse().status
            finally:
                conn.close()

        assert put("/weights/policy/..%2Fescape.safetensors", b"x") == 400
        assert put("/weights/../v000003.safetensors", b"x") == 400
        assert put("/weights/policy/model.bin", b"x") == 400
        assert put("/weights/policy/v000002.safetensors", b"x" * 10, length=1000) == 400
        assert put("/weights/policy/v000002.safetensors", b"", length=0) == 400          # empty
        assert put("/weights/policy/v000002.safetensors", b"", length=10**19) == 507     # no file that big
        assert sorted(p.name for p in (tmp_path / "received" / "policy").iterdir()) == ["v000001.safetensors"]
        assert [p.name for p in (tmp_path / "received").iterdir()] == ["policy"]
        # versions 2-5 of the same size: the newest three stay, the oldest file is recycled
        for v in (2, 3, 4, 5):
            path = tmp_path / f"v{v:06d}.safetensors"
            weights.publish({"w": torch.full((3_000_000,), float(v))}, path)
            engine_wire.push(path, url, "tok", "policy")
        kept = sorted(p.name for p in (tmp_path / "received" / "policy").iterdir())
        assert kept == ["v000003.safetensors", "v000004.safetensors", "v000005.safetensors"]
        target = {"w": torch.zeros(3_000_000)}
        weights.load_into(target, tmp_path / "received" / "policy" / "v000005.safetensors")
        assert torch.equal(target["w"], torch.full((3_000_000,), 5.0))
    finally:
        receiver.stop()
