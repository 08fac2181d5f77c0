"""Medusa-style draft heads on the shipped target (Cai et al. 2024; lecture 002 §6.6).

Head j (j = 1..n_heads) reads the target's final hidden state h_t (after its last RMSNorm) and
predicts the token j + 1 places ahead, x_{t+1+j}, through one residual SiLU layer and the target's
own (tied) output matrix: logits_j = W_out (h + SiLU(A_j h)). Only A_j is trained, on the
target's hidden states of the training split, with the target frozen: a few hundred Adam steps,
deterministic for a seed. The trained heads ship as ``checkpoints/heads/target_medusa2.safetensors``
(``python -m inference_conformance.smallworld.heads`` retrains and rewrites it; :func:`shipped_heads` loads it); any
head is a valid draft for greedy verification (SD-12 holds whatever they predict), training only
raises α (SD-14).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F

from inference_conformance.reference.transformer import Transformer
from inference_conformance.smallworld.checkpoints import CHECKPOINT_DIR


class MedusaHeads(nn.Module):
    """``n_heads`` heads over ``target``'s hidden size: forward(h (N, d_model)) -> (n_heads, N, V)."""

    def __init__(self, target: Transformer, n_heads: int):
        super().__init__()
        d = target.cfg.d_model
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n_heads))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.out_weight = target.output_weight().detach()
        self.dtype = self.out_weight.dtype

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.stack([F.linear(h + F.silu(layer(h)), self.out_weight) for layer in self.layers])

    def over(self, target: Transformer) -> MedusaHeads:
        """A copy of these heads over ``target`` (the same model in another dtype or on another
        device): its layers in the target's dtype and device, its output matrix the target's."""
        import copy

        w = target.output_weight().detach()
        out = copy.deepcopy(self).to(dtype=w.dtype, device=w.device)
        out.out_weight, out.dtype = w, w.dtype
        return out


def hidden_states(target: Transformer, inputs: torch.Tensor) -> torch.Tensor:
    """The target's final hidden states (B, T, d_model) for ``inputs`` (B, T) (hooked on its norm)."""
    kept = []
    hook = target.norm.register_forward_hook(lambda m, i, o: kept.append(o))
    try:
        with torch.no_grad():
            target(inputs)
    finally:
        hook.remove()
    return kept[0]


#: The shipped heads: trained by :func:`train_heads` with its defaults.
HEADS_FILE = CHECKPOINT_DIR / "heads" / "target_medusa2.safetensors"


@lru_cache(maxsize=1)
def shipped_heads() -> MedusaHeads:
    """The shipped two heads over the float32 target (read once per process). Raises
    FileNotFoundError when the file is missing, ValueError when it does not fit the target."""
    from safetensors.torch import load_file

    from inference_conformance.smallworld.checkpoints import load_model

    target = load_model("target", torch.float32)
    heads = MedusaHeads(target, 2)
    state = load_file(str(HEADS_FILE))
    if set(state) != set(heads.layers.state_dict()):
        raise ValueError(f"{HEADS_FILE}: weights do not match two heads over the target")
    heads.layers.load_state_dict(state)
    return _frozen(heads)


def _frozen(heads: MedusaHeads) -> MedusaHeads:
    heads.eval()
    for p in heads.parameters():
        p.requires_grad_(False)
    return heads


def train_heads(n_heads: int = 2, steps: int = 400, docs: int = 512, seed: int = 0) -> MedusaHeads:
    """Heads trained on the shipped float32 target (``docs`` training documents, ``steps`` Adam
    steps of 32 documents, lr 1e-2)."""
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.data import IGNORE, encode, pad_batch, split

    torch.manual_seed(seed)
    target = load_model("target", torch.float32)
    inputs, targets = pad_batch(encode(split("train", docs)))
    h = hidden_states(target, inputs)                                   # (B, T, d)
    heads = MedusaHeads(target, n_heads)
    opt = torch.optim.Adam(heads.layers.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, h.shape[0], (32,), generator=g)
        logits = heads(h[idx])                                          # (n_heads, 32, T, V)
        loss = 0.0
        for j in range(n_heads):
            shift = j + 1
            tgt = targets[idx][:, shift:]
            loss = loss + F.cross_entropy(logits[j][:, :-shift].reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                          ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return _frozen(heads)


def main() -> None:
    """Retrain the shipped heads and write them (with their training settings as metadata)."""
    from safetensors.torch import save_file

    heads = train_heads()
    HEADS_FILE.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in heads.layers.state_dict().items()}, str(HEADS_FILE),
              metadata={"n_heads": "2", "steps": "400", "docs": "512", "seed": "0", "target": "target"})
    print(f"wrote {HEADS_FILE}")


if __name__ == "__main__":
    main()
