"""The learner actor: one per trainable model.  Batches in, weight versions out.

Loop, top to bottom:  BatchReady → load the batch file → drop sampled tokens staler than
``max_staleness`` versions → one GRPO step → save weights as version v+1 → tell the engine
(LoadWeights) and the registry (Trained) → metrics line → every ``eval_every`` steps a
held-out evaluation, every ``checkpoint_every`` steps a checkpoint.
A frozen model (``trainable = false``) gets no learner in the tree.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from actorjet import metrics
from actorjet.job import model_config
from actorjet.ledger import Ledger
from actorjet.models.evaluate import eval_spec, greedy_accuracy
from actorjet.models import exact_attention, threads
from actorjet.models.grpo import GRPOConfig, grpo_step
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
        self.cfg = model_config(job, self.model_name)
        self.train_cfg = job["train"]
        self.run_dir = Path(self.context["run_dir"])
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
        self.ledger = Ledger(self.run_dir)
        self.duplicates_skipped = 0
        self._resume()
        self.evals = [(t["name"], spec) for t in job["tasks"] if (spec := eval_spec(t["source"], self.model_name))]
        self._evaluate()      # step 0: the starting checkpoint's score
        self._announce()

    def _load_kwargs(self) -> dict:
        """float32 master weights; ``attention = "exact"`` swaps in the layout-independent
        attention kernel (models/exact_attention.py)."""
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
        rewound = self.ledger.rewind(self.model_name, self.step)
        # Batches the merger sent to a previous incarnation died with it: pending again.
        rewound += self.ledger.release(self.model_name)
        if checkpoints or published or rewound:
            self.version = max([self.version] + published) + 1
            save_weights(self.model, self.weights_dir / f"v{self.version:06d}.safetensors")
            log.info("%s resumed at step %d as weight version %d; %d trained groups are pending again",
                     self.model_name, self.step, self.version, rewound)

    def _announce(self) -> None:
        self.send(self.registry, m.ServiceUp(self.model_name, "learner", None, self.myAddress))
        self.send(self.registry, m.Subscribe("directory"))

    def on_context(self) -> None:
        self._announce()

    def receiveMsg_Directory(self, msg: m.Directory, sender):
        engine = msg.services.get(self.model_name, {}).get("engine")
        address = engine["address"] if engine else None
        if address is not None and address != self.engine and self.version > 0:
            # a new (or restarted) engine: make sure it serves what this learner holds
            self.send(address, m.LoadWeights(self.version, str(self.weights_dir / f"v{self.version:06d}.safetensors")))
        self.engine = address

    def receiveMsg_BatchReady(self, msg: m.BatchReady, sender):
        if self.step >= self.train_cfg["steps"]:
            return
        if msg.group_ids and not self.ledger.claim(self.model_name, msg.group_ids, self.step + 1):
            self.duplicates_skipped += 1     # its groups were re-batched and trained already
            log.warning("%s: batch %s skipped: some of its groups were trained already", self.model_name, msg.path)
            Path(msg.path).unlink(missing_ok=True)
            return
        t0 = time.perf_counter()
        batch = torch.load(msg.path, weights_only=False)
        samples, stale = [], 0
        floor = self.version - self.train_cfg["max_staleness"]
        for s in batch["samples"]:          # drop sampled tokens that are too old, keep the rest
            fresh = [t for t in s["terms"] if t[4] >= floor]
            stale += len(s["terms"]) - len(fresh)
            if fresh:
                samples.append(dict(s, terms=fresh))
        staleness = [self.version - t[4] for s in samples for t in s["terms"]]
        t_train = time.perf_counter()
        info = grpo_step(self.model, self.optimizer, samples, self.grpo, self.pad_id, self.ref_model) \
            if samples else {"tokens": 0, "sequences": 0, "skipped": True}
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
        self.send(self.registry, m.Trained(self.model_name, self.step, self.version, msg.groups, done, tasks))
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
        metrics.append(self.run_dir, record)
        Path(msg.path).unlink(missing_ok=True)
        if self.step % self.cfg["eval_every"] == 0 or done:
            self._evaluate()
        if self.step % self.cfg["checkpoint_every"] == 0 or done:
            self._checkpoint()

    def _evaluate(self) -> None:
        """Held-out accuracy of this model on every task that has an eval set (one line each)."""
        for task, spec in self.evals:
            t0 = time.perf_counter()
            acc = greedy_accuracy(self.model, self.tokenizer, spec, self.cfg["eval_max_tokens"])
            metrics.append(self.run_dir, {"kind": "eval", "model": self.model_name, "task": task, "step": self.step,
                                          "weight_version": self.version, "accuracy": acc,
                                          "eval_time_s": time.perf_counter() - t0})
            log.info("%s step %d: held-out accuracy on %s %.3f", self.model_name, self.step, task, acc)

    def _checkpoint(self) -> None:
        out = self.run_dir / "checkpoints" / self.model_name / f"step_{self.step:06d}"
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        (out / "state.json").write_text(json.dumps({"step": self.step, "weight_version": self.version}))

    def info(self) -> dict:
        return {"path": self.path, "step": getattr(self, "step", None), "version": getattr(self, "version", None)}
