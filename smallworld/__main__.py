"""``python -m inference_conformance.smallworld``: print the shipped models' cards and a few sampled documents.

Training is ``python -m inference_conformance.smallworld.train`` (see :mod:`inference_conformance.smallworld.train`).
"""
from __future__ import annotations

import argparse

from inference_conformance.smallworld import checkpoints
from inference_conformance.smallworld.checker import is_grammatical
from inference_conformance.smallworld.sample import sample_documents


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inference_conformance.smallworld", description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3, help="documents to sample from each model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"{'model':<11} {'params':>8} {'steps':>6} {'test NLL':>9} {'grammatical':>12} {'train s':>8}")
    for name in checkpoints.NAMES:
        try:
            c = checkpoints.load_card(name)
        except FileNotFoundError as exc:
            print(f"{name:<11} missing ({exc})")
            continue
        print(f"{name:<11} {c['parameters']:>8,} {c['training_steps']:>6} {c['test_nll']:>9.4f} "
              f"{c['grammatical_fraction']:>12.3f} {c['train_wall_s']:>8.0f}")
    for name in checkpoints.NAMES:
        try:
            model = checkpoints.load_model(name)
        except FileNotFoundError:
            continue
        print(f"\n{name}:")
        for doc in sample_documents(model, args.samples, temperature=1.0, seed=args.seed):
            print(f"  [{'ok ' if is_grammatical(doc) else 'BAD'}] {' '.join(doc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
