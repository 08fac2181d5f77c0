"""The garden world's shipped checkpoints: loading and saving (safetensors + a JSON card).

Three models live in ``smallworld/checkpoints/`` (written by ``python -m
inference_conformance.smallworld.train``): ``target`` (d=128, 4 layers, ~806K parameters, lecture 001 §0.3),
``draft_good`` (d=32, 1 layer, ~16K parameters, trained long) and ``draft_poor`` (the same
architecture, trained briefly). Each is ``NAME.safetensors`` (float32 weights of
:class:`inference_conformance.reference.transformer.Transformer`) with ``NAME.json``, its card: config, parameter
count, training steps and seed, test NLL, the NLL of a fixed test subset in float64 (what CI
recomputes), the grammatical fraction of 1000 documents sampled at temperature 1, wall time.
"""
from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and the model are imported where weights are read: the cards need neither
    import torch

    from inference_conformance.reference.transformer import Transformer, TransformerConfig

#: Package data, found through importlib.resources (an installed wheel, an editable install or the checkout).
CHECKPOINT_DIR = Path(str(importlib.resources.files("inference_conformance.smallworld") / "checkpoints"))
NAMES = ("target", "draft_good", "draft_poor")


def resolve(name_or_path: str | Path) -> Path:
    """A shipped model's name, or a path to ``X.safetensors`` / ``X.json`` / ``X`` -> the path
    ``X.safetensors``. Raises FileNotFoundError when the weights or the card are missing."""
    if isinstance(name_or_path, str) and name_or_path in NAMES:
        p = CHECKPOINT_DIR / f"{name_or_path}.safetensors"
    else:
        p = Path(name_or_path)
        if p.suffix in (".json", ".safetensors"):
            p = p.with_suffix(".safetensors")
        else:
            p = p.with_name(p.name + ".safetensors")
    for f in (p, p.with_suffix(".json")):
        if not f.exists():
            raise FileNotFoundError(f"checkpoint file {f} not found (shipped names: {', '.join(NAMES)}; "
                                    "rebuild with `python -m inference_conformance.smallworld.train`)")
    return p


def load_card(name_or_path: str | Path) -> dict:
    """The JSON card of a checkpoint (see the module docstring for its fields)."""
    return json.loads(resolve(name_or_path).with_suffix(".json").read_text())


def config_from_card(card: dict) -> TransformerConfig:
    from inference_conformance.reference.transformer import TransformerConfig

    return TransformerConfig(**card["config"])


def load_model(name_or_path: str | Path, dtype: torch.dtype | None = None,
               device: str | torch.device = "cpu") -> Transformer:
    """A shipped or saved garden model as a reference Transformer in ``dtype`` (default
    float32) on ``device`` (eval mode). Raises FileNotFoundError for a missing checkpoint,
    ValueError when the weights do not match the card's config."""
    import torch
    from safetensors.torch import load_file

    from inference_conformance.reference.transformer import Transformer

    dtype = torch.float32 if dtype is None else dtype
    p = resolve(name_or_path)
    card = load_card(p)
    model = Transformer(config_from_card(card))
    state = load_file(str(p))
    expected = set(model.state_dict())
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"{p}: weights do not match the card's config (missing {missing[:4]}, unexpected {extra[:4]})")
    model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


def save_model(model: Transformer, card: dict, path: str | Path) -> Path:
    """Write ``path``.safetensors (float32, contiguous) and ``path``.json (``card`` plus the
    config and the parameter count). Returns the weights' path."""
    import torch
    from safetensors.torch import save_file

    p = Path(path)
    p = p.with_suffix(".safetensors") if p.suffix in (".json", ".safetensors") else p.with_name(p.name + ".safetensors")
    p.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(p))
    full = {"config": model.cfg.to_dict(), "parameters": sum(x.numel() for x in model.parameters())}
    full.update(card)
    p.with_suffix(".json").write_text(json.dumps(full, indent=2, sort_keys=False) + "\n")
    return p
