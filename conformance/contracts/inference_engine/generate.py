"""The ``inference_engine`` contract's ``generate`` call, its arguments and their check: the
requests (:class:`Request`), the call's settings (:class:`Params`, with
:data:`SPECULATIVE_METHODS` and :data:`PADDING_SIDES`) and ``validate(requests, params)``, the
check every engine runs first (TypeError or ValueError naming the field, in the order the
contract's text gives). The contract's text is the module docstring of ``contract.py``
("generate", "Errors"); the ``serve`` call's schedule and check are in ``serve.py``, which uses
these."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

SPECULATIVE_METHODS = ("draft", "ngram")
PADDING_SIDES = ("left", "right")


@dataclass(frozen=True)
class Request:
    """One generation: ``prompt`` token ids (tuple of ints), ``max_new_tokens`` >= 1, ``seed``;
    ``temperature`` / ``top_p``: None (the call's :class:`Params`), or this request's own."""

    prompt: tuple
    max_new_tokens: int
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None


@dataclass(frozen=True)
class Params:
    """The settings of one ``generate`` call (see the module docstring)."""

    model: str
    temperature: float = 0.0
    top_p: float = 1.0
    speculative: str | None = None
    draft: str | None = None
    num_speculative_tokens: int = 3
    prefix_caching: bool = False
    chunked_prefill: int | None = None
    padding: str | None = None
    block_size: int | None = None
    kv_blocks: int | None = None


def _check_sampling(temperature, top_p, name: str) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"{name}temperature must be a float, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"{name}temperature must be finite and >= 0, got {temperature}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        raise TypeError(f"{name}top_p must be a float, got {type(top_p).__name__}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{name}top_p must lie in (0, 1], got {top_p!r}")


def _check_int(x, name: str, low: int) -> None:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < low:
        raise ValueError(f"{name} must be >= {low}, got {x}")


def _check_folder(folder, name: str) -> None:
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"{name} must be a folder path (str or Path), got {type(folder).__name__}")
    if not (Path(folder) / "config.json").is_file():
        raise ValueError(f"{name}: {folder} holds no config.json (a Hugging Face model folder is expected)")


def validate(requests, params) -> None:
    """The contract's checks of one ``generate`` call, in the order the module docstring gives."""
    if not isinstance(requests, list):
        raise TypeError(f"requests must be a list of Request, got {type(requests).__name__}")
    if not requests:
        raise ValueError("requests must hold at least one Request")
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"requests[{i}] must be a Request, got {type(r).__name__}")
        if not isinstance(r.prompt, (tuple, list)):
            raise TypeError(f"requests[{i}].prompt must be a tuple of ints, got {type(r.prompt).__name__}")
        if not r.prompt:
            raise ValueError(f"requests[{i}].prompt must hold at least one token id")
        for t in r.prompt:
            _check_int(t, f"requests[{i}].prompt ids", 0)
        _check_int(r.max_new_tokens, f"requests[{i}].max_new_tokens", 1)
        if r.seed is not None:
            _check_int(r.seed, f"requests[{i}].seed", 0)
        _check_sampling(0.0 if r.temperature is None else r.temperature, 1.0 if r.top_p is None else r.top_p,
                        f"requests[{i}].")
    if not isinstance(params, Params):
        raise TypeError(f"params must be a Params, got {type(params).__name__}")
    if isinstance(params.top_p, bool) or not isinstance(params.top_p, (int, float)):
        raise ValueError(f"params.top_p must lie in (0, 1], got {params.top_p!r}")
    _check_sampling(params.temperature, params.top_p, "params.")
    if params.speculative is not None and params.speculative not in SPECULATIVE_METHODS:
        raise ValueError(f"params.speculative must be None or one of {SPECULATIVE_METHODS}, got {params.speculative!r}")
    if params.speculative == "draft" and params.draft is None:
        raise ValueError("params.draft must name the draft's folder for speculative='draft'")
    _check_int(params.num_speculative_tokens, "params.num_speculative_tokens", 1)
    if params.chunked_prefill is not None:
        _check_int(params.chunked_prefill, "params.chunked_prefill", 1)
    if params.padding is not None and params.padding not in PADDING_SIDES:
        raise ValueError(f"params.padding must be None or one of {PADDING_SIDES}, got {params.padding!r}")
    for name in ("block_size", "kv_blocks"):
        if getattr(params, name) is not None:
            _check_int(getattr(params, name), f"params.{name}", 1)
    _check_folder(params.model, "params.model")
    if params.speculative == "draft":
        _check_folder(params.draft, "params.draft")


