"""PPO's critic: V(state) for every sampled token, trained in the learner's step.

``critic = "trunk"``: a value head (one linear layer) on the policy's own last hidden state —
one forward pass gives both the token's logprob and its value, and the value loss also
shapes the shared trunk (scaled by ``value_coef``).  ``critic = "separate"``: a second copy of
the policy's trunk as training starts, with its own head, so the policy's trunk only learns from the
policy loss (twice the memory and forward passes).

The state a token was sampled in is the hidden state at its predecessor (the position whose
logits predict it: ``term_pred``), so a value is read exactly where rl/grpo.py reads the
token's logprob, and tree packing gives the same values as unpacked sequences for the same
reason it gives the same logprobs.  The head starts at zero (V = 0), so PPO's first advantages
are the plain returns.  The critic is saved in each checkpoint as ``critic.pt`` and resumed
with the policy.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from actorjet.rl.grpo import MIN_ROWS

FILE = "critic.pt"


class Critic(torch.nn.Module):
    def __init__(self, hidden_size: int, trunk=None, lr: float = 1e-4):
        super().__init__()
        self.trunk = trunk          # None: the policy's own trunk (critic = "trunk")
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.optimizer = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)

    def values(self, batch: dict, mask: torch.Tensor, policy_rows: torch.Tensor | None) -> torch.Tensor:
        """V at every term of ``batch`` (rl/grpo.py collate); ``policy_rows``: the policy's hidden
        states at the terms' predecessors (used with critic = "trunk")."""
        rows = policy_rows
        if self.trunk is not None:
            hidden = self.trunk(input_ids=batch["input_ids"], attention_mask=mask,
                                position_ids=batch["position_ids"]).last_hidden_state
            rows = hidden[batch["term_b"], batch["term_pred"]]
        n = rows.shape[0]          # padded like the LM head's rows: same rounding for any layout (rl/grpo.py)
        if n < MIN_ROWS:
            rows = torch.cat([rows, rows.new_zeros(MIN_ROWS - n, rows.shape[-1])])
        return self.head(rows.to(self.head.weight.dtype)).squeeze(-1)[:n]

    def state(self) -> dict:
        return {"model": self.state_dict(), "optimizer": self.optimizer.state_dict()}


def build(policy, cfg: dict, algo, checkpoint: Path | None = None) -> Critic | None:
    """The model's critic (None unless its algorithm is PPO), restored from ``checkpoint``'s
    critic.pt when it has one."""
    if algo.name != "ppo":
        return None
    trunk = None
    if algo.critic == "separate":      # the policy's trunk as it starts, all of it trained (even with LoRA)
        trunk = copy.deepcopy(policy.model)
        for p in trunk.parameters():
            p.requires_grad_(True)
    device = next(policy.parameters()).device           # beside the policy it reads
    critic = Critic(policy.config.hidden_size, trunk, lr=algo.critic_lr or cfg["lr"]).to(device)
    saved = checkpoint / FILE if checkpoint is not None else None
    if saved is not None and saved.exists():
        state = torch.load(saved, map_location=device, weights_only=False)
        critic.load_state_dict(state["model"])
        critic.optimizer.load_state_dict(state["optimizer"])
    return critic


def checkpoint_files(critic: Critic | None) -> dict:
    """What a checkpoint saves of the critic (models/checkpoint_write.py ``extra``)."""
    return {FILE: critic.state()} if critic is not None else {}
