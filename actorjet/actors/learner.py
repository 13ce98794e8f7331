"""The learner actor: one per trainable model.  Batches in, weight versions out.

Loop, top to bottom:  BatchReady → Claim its groups at the merger (which holds the ledger)
→ Claimed → fetch the batch over HTTP → drop sampled tokens staler than ``max_staleness``
versions → one GRPO step → save weights as version v+1 → tell the engine (LoadWeights) and
the registry (Trained, and the metrics line) → every ``eval_every`` steps a held-out
evaluation, every ``checkpoint_every`` steps a checkpoint.
Weights and checkpoints live on the learner's own node (its model subtree may be placed on
a GPU node); nothing here reads a file of the head's.  A (re)started learner first tells
the merger where it resumes (Rewind) and claims nothing before the answer.
A frozen model (``trainable = false``) gets no learner in the tree.
"""
from __future__ import annotations

import io
import json
import time
import urllib.request
from pathlib import Path

import torch

from actorjet.job import model_config_here
from actorjet.serving.evaluate import eval_spec, greedy_accuracy
from actorjet.rl import exact_attention
from actorjet.serving import threads
from actorjet.rl.grpo import BadBatch, GRPOConfig, grpo_step
from actorjet.runtime import endpoints
from actorjet.runtime import messages as m
from actorjet.runtime.child import ManagedActor
from actorjet.runtime.logs import log


def save_weights(model, path: Path) -> None:
    from safetensors.torch import save_file

    # clone: tied embeddings share storage, which safetensors refuses
    save_file({k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}, str(path))


class Learner(ManagedActor):
    def on_init(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        job = self.context["job"]
        self.model_name = self.args["model"]
        self.cfg = model_config_here(job, self.model_name)
        self.train_cfg = job["train"]
        self.run_dir = endpoints.local_run_dir(self.context)      # this node's: weights, checkpoints
        torch.manual_seed(self.train_cfg["seed"])
        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg["path"])
        self.model = AutoModelForCausalLM.from_pretrained(self.cfg["path"], **self._load_kwargs())
        self.model.to(self.cfg["device"])
        threads.configure(self.cfg["threads"], self.cfg["device"], self.model.num_parameters())
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg["lr"], weight_decay=0.0)
        self.grpo = GRPOConfig(clip=self.cfg["clip"], kl=self.cfg["kl"], grad_clip=self.cfg["grad_clip"])
        self.ref_model = None
        if self.cfg["kl"] > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.cfg["path"], **self._load_kwargs())
            self.ref_model.to(self.cfg["device"]).eval()
        self.step = self.version = 0
        self.weights_dir = self.run_dir / "weights" / self.model_name
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.engine = None
        self.merger = None
        self.rewound = False          # the merger knows where this learner resumes
        self.queue: list[m.BatchReady] = []
        self.claiming: m.BatchReady | None = None
        self.duplicates_skipped = 0
        self._resume()
        self.evals = [(t["name"], spec) for t in job["tasks"] if (spec := eval_spec(t["source"], self.model_name))]
        self._evaluate()      # step 0: the starting checkpoint's score
        self._announce()

    def _load_kwargs(self) -> dict:
        """float32 master weights; ``attention = "exact"`` swaps in the layout-independent
        attention kernel (rl/exact_attention.py)."""
        kwargs = {"dtype": torch.float32}
        if self.cfg.get("attention") == "exact":
            kwargs["attn_implementation"] = exact_attention.register()
        return kwargs

    def _resume(self) -> None:
        """After a crash (learner or head): continue from the last checkpoint.  Groups trained
        after it were lost with the weights that saw them, so the ledger makes them pending
        again; the resumed weights are published under a new version, newer than anything
        the engine may still serve."""
        checkpoints = sorted((self.run_dir / "checkpoints" / self.model_name).glob("step_*/state.json"))
        published = [int(p.stem[1:]) for p in self.weights_dir.glob("v*.safetensors")]
        if checkpoints:
            from transformers import AutoModelForCausalLM

            folder = checkpoints[-1].parent
            state = json.loads(checkpoints[-1].read_text())
            self.model = AutoModelForCausalLM.from_pretrained(folder, **self._load_kwargs()).to(self.cfg["device"])
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.cfg["lr"], weight_decay=0.0)
            self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False))
            self.step = state["step"]
        if checkpoints or published:
            self.version = max([self.version] + published) + 1
            save_weights(self.model, self.weights_dir / f"v{self.version:06d}.safetensors")
            log.info("%s resumed at step %d as weight version %d", self.model_name, self.step, self.version)

    def _announce(self) -> None:
        self.send(self.registry, m.ServiceUp(self.model_name, "learner", None, self.myAddress))
        self.send(self.registry, m.Subscribe("directory"))

    def on_context(self) -> None:
        self._announce()

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        merger = msg.services.get("", {}).get("merger")
        merger = merger["address"] if merger else None
        if merger is not None and merger != self.merger and not self.rewound:
            self.send(merger, m.Rewind(self.model_name, self.step))
        self.merger = merger
        engine = msg.services.get(self.model_name, {}).get("engine")
        address = engine["address"] if engine else None
        if address is not None and address != self.engine and self.version > 0:
            # a new (or restarted) engine: make sure it serves what this learner holds
            self.send(address, m.LoadWeights(self.version, str(self.weights_dir / f"v{self.version:06d}.safetensors")))
        self.engine = address

    def receiveMsg_Rewound(self, msg: m.Rewound, sender):
        if not self.rewound:
            log.info("%s: the merger resumes it at step %d (%d groups pending again)", self.model_name,
                     self.step, msg.groups)
        self.rewound = True
        self._claim_next()

    def receiveMsg_BatchReady(self, msg: m.BatchReady, sender):
        self.queue.append(msg)
        self._claim_next()

    def _claim_next(self) -> None:
        """One batch at a time: claim it at the merger, train it when the claim holds."""
        if self.claiming is not None or not self.queue or not self.rewound or self.merger is None:
            return
        if self.step >= self.train_cfg["steps"]:
            self.queue.clear()
            return
        self.claiming = self.queue.pop(0)
        self.send(self.merger, m.Claim(self.model_name, self.claiming.group_ids, self.step + 1, self.claiming.url))

    def receiveMsg_Claimed(self, msg: m.Claimed, sender):
        batch, self.claiming = self.claiming, None
        if batch is None or batch.url != msg.url:
            return
        if not msg.ok:
            self.duplicates_skipped += 1     # its groups were re-batched and trained already
            log.warning("%s: batch %s skipped: some of its groups were trained already", self.model_name, msg.url)
        else:
            self._train(batch)
        self._claim_next()

    def _fetch(self, url: str) -> dict:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.context['token']}"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return torch.load(io.BytesIO(resp.read()), weights_only=False)

    def _train(self, msg: m.BatchReady) -> None:
        t0 = time.perf_counter()
        batch = self._fetch(msg.url)
        samples, stale = [], 0
        floor = self.version - self.train_cfg["max_staleness"]
        for s in batch["samples"]:          # drop sampled tokens that are too old, keep the rest
            fresh = [t for t in s["terms"] if t[4] >= floor]
            stale += len(s["terms"]) - len(fresh)
            if fresh:
                samples.append(dict(s, terms=fresh))
        staleness = [self.version - t[4] for s in samples for t in s["terms"]]
        t_train = time.perf_counter()
        try:
            info = grpo_step(self.model, self.optimizer, samples, self.grpo, self.pad_id, self.ref_model) \
                if samples else {"tokens": 0, "sequences": 0, "skipped": True}
        except (BadBatch, ValueError, IndexError, TypeError) as e:   # the data's fault, not the learner's
            log.error("%s: batch %s cannot be trained (%s); its groups are quarantined", self.model_name, msg.url, e)
            self.send(self.merger, m.Quarantine(self.model_name, list(msg.group_ids), f"learner: {type(e).__name__}: {e}"))
            return
        t_publish = time.perf_counter()
        self.step += 1
        self.version += 1
        path = self.weights_dir / f"v{self.version:06d}.safetensors"
        save_weights(self.model, path)
        if self.engine is not None:
            self.send(self.engine, m.LoadWeights(self.version, str(path)))
        old = self.weights_dir / f"v{self.version - 3:06d}.safetensors"
        old.unlink(missing_ok=True)
        done = self.step >= self.train_cfg["steps"]
        tasks = {t: v["groups"] for t, v in msg.stats.get("by_task", {}).items()}
        record = {"kind": "train", "model": self.model_name, "step": self.step, "weight_version": self.version,
                  "reward_mean": msg.stats.get("reward_mean"), "groups": msg.groups,
                  "episodes": msg.stats.get("episodes"), "zero_variance_groups": msg.stats.get("zero_variance_groups"),
                  "stale_tokens_dropped": stale, "staleness_mean": sum(staleness) / max(1, len(staleness)),
                  "staleness_max": max(staleness, default=0), "step_time_s": time.perf_counter() - t0,
                  "train_s": t_publish - t_train, "publish_s": time.perf_counter() - t_publish,
                  "batch_wait_s": time.time() - msg.stats.get("created", time.time()),
                  "duplicate_batches_skipped": self.duplicates_skipped,
                  **{k: v for k, v in info.items() if k != "skipped"}}
        record.update({k: msg.stats[k] for k in ("calls", "merge", "sequences_before", "sequences_after",
                                                  "tokens_before", "tokens_after", "token_ratio", "drift_repairs",
                                                  "tools_unified", "text_aligned",
                                                  "by_behavior", "by_task") if k in msg.stats})
        self._metric(record)          # before Trained: whoever sees the step in status finds its line
        self.send(self.registry, m.Trained(self.model_name, self.step, self.version, msg.groups, done, tasks))
        if self.step % self.cfg["eval_every"] == 0 or done:
            self._evaluate()
        if self.step % self.cfg["checkpoint_every"] == 0 or done:
            self._checkpoint()

    def _evaluate(self) -> None:
        """Held-out accuracy of this model on every task that has an eval set (one line each)."""
        for task, spec in self.evals:
            t0 = time.perf_counter()
            acc = greedy_accuracy(self.model, self.tokenizer, spec, self.cfg["eval_max_tokens"])
            self._metric({"kind": "eval", "model": self.model_name, "task": task, "step": self.step,
                          "weight_version": self.version, "accuracy": acc, "eval_time_s": time.perf_counter() - t0})
            log.info("%s step %d: held-out accuracy on %s %.3f", self.model_name, self.step, task, acc)

    def _metric(self, record: dict) -> None:
        """metrics.jsonl is the head's (the registry writes it): this node may be another."""
        self.send(self.registry, m.Metric({"time": time.time(), **record}))

    def _checkpoint(self) -> None:
        out = self.run_dir / "checkpoints" / self.model_name / f"step_{self.step:06d}"
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        (out / "state.json").write_text(json.dumps({"step": self.step, "weight_version": self.version}))

    def info(self) -> dict:
        return {"path": self.path, "step": getattr(self, "step", None), "version": getattr(self, "version", None)}
