"""Train the garden world's model pair and write the shipped checkpoints (CPU, deterministic).

    python -m inference_conformance.smallworld.train                       # all three: ~32 min wall on a busy 2-core machine
    python -m inference_conformance.smallworld.train --models draft_poor   # one of them
    python -m inference_conformance.smallworld.train --out /tmp/world --scale 0.05   # a quick smoke run

Models (lecture 001 §0.3: target d=128, 4 layers, 806,144 parameters; draft d=32, 1 layer,
15,968 parameters, a good draft trained 6 epochs and a poor one trained 1):

- ``target``: d=128, 4 layers, 4 heads, SwiGLU d_ff=328, tied embeddings (804,736 parameters);
- ``draft_good``: d=32, 1 layer, 2 heads, d_ff=24, tied (15,904 parameters, 50.6x fewer);
- ``draft_poor``: the draft's architecture, trained for a small fraction of the good draft's steps.

Plain PyTorch, float32, AdamW with warmup and cosine decay, batches of documents bucketed by
length. Deterministic: weights are initialised by :func:`inference_conformance.reference.transformer.init_weights`
from the model's seed, batches are drawn with ``random.Random(seed)``, and the thread count is
fixed (``--threads``, default 1; results can differ in the last bits with another count).
After training, each model's card gets: test NLL (the whole test split, float32), the float64
NLL of the first ``TEST_SUBSET`` test documents (what CI recomputes), the grammatical fraction
of 1000 documents sampled at temperature 1 (seed 0), and wall times.
"""
from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from inference_conformance.reference.transformer import Transformer, TransformerConfig, init_weights
from inference_conformance.smallworld import checker, data
from inference_conformance.smallworld.checkpoints import CHECKPOINT_DIR, save_model
from inference_conformance.smallworld.sample import sample_documents
from inference_conformance.smallworld.tokenizer import tokenizer

MAX_SEQ_LEN = 128


@dataclass(frozen=True)
class Recipe:
    config: TransformerConfig
    seed: int
    steps: int
    batch_size: int
    lr: float
    warmup: int
    weight_decay: float = 0.01


def _cfg(d_model, n_layers, n_heads, d_ff) -> TransformerConfig:
    return TransformerConfig(vocab_size=tokenizer().vocab_size, d_model=d_model, n_layers=n_layers,
                             n_heads=n_heads, n_kv_heads=n_heads, d_ff=d_ff, max_seq_len=MAX_SEQ_LEN,
                             tie_embeddings=True)


RECIPES = {
    "target": Recipe(_cfg(128, 4, 4, 328), seed=1, steps=4000, batch_size=64, lr=3e-3, warmup=200),
    "draft_good": Recipe(_cfg(32, 1, 2, 24), seed=2, steps=6000, batch_size=64, lr=1e-2, warmup=100),
    "draft_poor": Recipe(_cfg(32, 1, 2, 24), seed=2, steps=400, batch_size=64, lr=1e-2, warmup=100),
}
SAMPLES = 1000
SAMPLE_SEED = 0


def bucketed_batches(seqs: list[list[int]], batch_size: int, seed: int, chunk: int = 50):
    """Endless padded batches: shuffle every epoch with ``random.Random(seed)``, sort chunks of
    ``chunk`` batches by length (less padding), shuffle the batches of each chunk."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(seqs)))
        rng.shuffle(order)
        for c in range(0, len(order), batch_size * chunk):
            part = sorted(order[c: c + batch_size * chunk], key=lambda i: len(seqs[i]))
            groups = [part[i: i + batch_size] for i in range(0, len(part), batch_size)]
            rng.shuffle(groups)
            for grp in groups:
                yield data.pad_batch([seqs[i] for i in grp])


def lr_at(step: int, r: Recipe) -> float:
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    progress = (step - r.warmup) / max(1, r.steps - r.warmup)
    return r.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_model(name: str, r: Recipe, seqs: list[list[int]], progress) -> tuple[Transformer, dict]:
    model = init_weights(Transformer(r.config), r.seed).float().train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=r.lr, betas=(0.9, 0.98))
    batches = bucketed_batches(seqs, r.batch_size, r.seed)
    task = progress.add_task(name, total=r.steps, loss=float("nan"))
    t0 = time.perf_counter()
    tokens = 0
    ema = None
    for step in range(r.steps):
        inputs, targets = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, r)
        logits = model(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=data.IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += int((targets != data.IGNORE).sum())
        lv = float(loss.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        progress.update(task, advance=1, loss=ema)
    wall = time.perf_counter() - t0
    model.eval()
    return model, {"training_steps": r.steps, "batch_size": r.batch_size, "training_tokens": tokens,
                   "epochs": round(r.steps * r.batch_size / len(seqs), 4), "lr": r.lr, "warmup": r.warmup,
                   "weight_decay": r.weight_decay, "seed": r.seed, "train_wall_s": round(wall, 1)}


def evaluate(model: Transformer, samples: int = SAMPLES) -> dict:
    t0 = time.perf_counter()
    test = data.split("test")
    out = {"test_documents": len(test), "test_nll": data.nll(model, test)}
    out["test_subset_documents"] = data.TEST_SUBSET
    out["test_subset_nll_float64"] = data.nll(model.double(), test[: data.TEST_SUBSET])
    model.float()
    docs = sample_documents(model, samples, temperature=1.0, seed=SAMPLE_SEED)
    out.update({"samples": samples, "sample_temperature": 1.0, "sample_seed": SAMPLE_SEED,
                "grammatical_fraction": checker.grammatical_fraction(docs),
                "sample_mean_length": sum(len(d) for d in docs) / max(1, len(docs)),
                "eval_wall_s": round(time.perf_counter() - t0, 1)})
    return out


def main(argv=None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    ap = argparse.ArgumentParser(prog="python -m inference_conformance.smallworld.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--out", default=str(CHECKPOINT_DIR), help="folder for NAME.safetensors + NAME.json")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (fixed for determinism)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every recipe's steps (smoke runs)")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="documents sampled for the grammatical fraction")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    console = Console()
    t0 = time.perf_counter()
    seqs = data.encode(data.split("train"))
    console.print(f"train split: {len(seqs)} documents, {sum(len(s) - 1 for s in seqs)} tokens "
                  f"({time.perf_counter() - t0:.1f} s); entropy rate of the grammar (test subset): "
                  f"{checker.entropy_rate(data.split('test', 500)):.4f} nats/token")
    columns = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn(), TimeRemainingColumn())
    for name in args.models:
        r = RECIPES[name]
        if args.scale != 1.0:
            r = Recipe(**{**r.__dict__, "steps": max(1, round(r.steps * args.scale))})
        with Progress(*columns, console=console) as progress:
            model, card = train_model(name, r, seqs, progress)
        card = {"name": name, **card, **evaluate(model, args.samples),
                "entropy_rate_estimate": checker.entropy_rate(data.split("test", 500)),
                "threads": args.threads, "torch": torch.__version__}
        path = save_model(model, card, Path(args.out) / name)
        console.print(f"{name}: test NLL {card['test_nll']:.4f}, grammatical {card['grammatical_fraction']:.3f}, "
                      f"train {card['train_wall_s']} s, eval {card['eval_wall_s']} s -> {path}")
    console.print(f"total wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
