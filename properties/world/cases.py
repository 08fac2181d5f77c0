"""The checks of the small world's claims WD-1..WD-3, each a function of the checker, model,
cards or counts it judges: ``properties/world/test_world_grammar.py`` and ``properties/world/test_world_models.py``
give them the shipped checker, checkpoints and cards, ``properties/world/test_world_rejections.py``
known-bad ones (a checker blind to agreement, the wrong checkpoint for a card, cards and counts
off the claim). Each raises AssertionError naming what it missed."""
from __future__ import annotations

import random
from typing import Callable

from scipy.stats import binomtest

from inference_conformance.conformance.tolerance import assert_scalar
from inference_conformance.smallworld import data, grammar

#: WD-1: the share of single-token corruptions the checker must reject.
WD1_MIN_REJECTED = 0.8
#: WD-2: the good draft's NLL within 3% of the target's; the poor draft's at least 8% above it.
WD2_GOOD_WITHIN, WD2_POOR_ABOVE = 1.03, 1.08
#: WD-3's rule: a claim is refuted when a one-sided exact binomial test rejects it at this level.
WD3_LEVEL = 0.001
#: WD-3's claims: model -> (the claimed bound on the grammatical fraction, the side refuting it).
WD3_CLAIMS = {"target": (0.9, "less"), "draft_poor": (0.3, "greater")}
#: The float64 NLL of a card's fixed test subset: summation order may differ across BLAS builds
#: and thread counts, a relative 1e-9 of float64 rounding over ~1500 tokens.
SUBSET_REL = 1e-9


def corruptions(n: int = 600, seed: int = 13, pick_seed: int = 0) -> list[list[str]]:
    """``n`` generated documents (``seed``), each with one random word replaced by a different
    random vocabulary word (``pick_seed``)."""
    rng = random.Random(pick_seed)
    vocab = grammar.vocabulary()
    out = []
    for d in grammar.generate_documents(n, seed):
        i = rng.randrange(len(d))
        e = list(d)
        e[i] = rng.choice([v for v in vocab if v != d[i]])
        out.append(e)
    return out


def check_wd1(accepts: Callable[[list[str]], bool], docs: list[list[str]] | None = None) -> float:
    """WD-1 on a grammar checker ``accepts(words) -> bool``: it accepts every generated document
    (200, seed 12) and rejects at least 80% of the single-token corruptions ``docs`` (default
    :func:`corruptions`). Returns the rejected fraction."""
    bad = [d for d in grammar.generate_documents(200, 12) if not accepts(d)]
    assert not bad, f"WD-1: the checker rejects {len(bad)} of 200 generated documents, e.g. {' '.join(bad[0])}"
    docs = corruptions() if docs is None else docs
    rate = sum(not accepts(e) for e in docs) / len(docs)
    assert rate >= WD1_MIN_REJECTED, (f"WD-1: the checker rejects {rate:.3f} of {len(docs)} single-token "
                                      f"corruptions (claim: most, >= {WD1_MIN_REJECTED})")
    return rate


def check_wd2_subset(model, card: dict, name: str) -> float:
    """WD-2 on a loaded model against a card: its float64 NLL of the card's fixed test subset
    equals the card's figure (relative :data:`SUBSET_REL`). Returns the NLL."""
    nll = data.nll(model, data.split("test", card["test_subset_documents"]))
    assert_scalar(nll, card["test_subset_nll_float64"], rel=SUBSET_REL, what=f"WD-2: {name} subset NLL (float64) vs card")
    return nll


def check_wd2_cards(cards: dict[str, dict]) -> None:
    """WD-2 on the three cards' test NLLs: the good draft within 3% of the target, the poor one
    clearly worse (at least 8% above the target)."""
    target, good, poor = (cards[n]["test_nll"] for n in ("target", "draft_good", "draft_poor"))
    assert good <= WD2_GOOD_WITHIN * target, f"WD-2: good draft NLL {good:.4f} not within 3% of the target's {target:.4f}"
    assert poor >= WD2_POOR_ABOVE * target, f"WD-2: poor draft NLL {poor:.4f} not clearly above the target's {target:.4f}"


def wd3_p_value(name: str, k: int, n: int) -> float:
    """The one-sided exact binomial p-value of ``k`` grammatical documents of ``n`` against
    WD-3's claim for ``name`` (small: the count refutes the claim)."""
    bound, side = WD3_CLAIMS[name]
    return binomtest(k, n, bound, alternative=side).pvalue


def check_wd3(name: str, k: int, n: int, what: str = "sample") -> float:
    """WD-3 on a count: ``k`` grammatical of ``n`` sampled documents of ``name`` do not refute its
    claim (target >= 90%, poor draft < 30%) by a one-sided exact binomial test at level
    :data:`WD3_LEVEL`. Returns the p-value."""
    p = wd3_p_value(name, k, n)
    claim = {"target": ">= 90%", "draft_poor": "< 30%"}[name]
    assert p >= WD3_LEVEL, f"WD-3: {name}: the {what}'s {k}/{n} refutes {claim} (p = {p:.3g})"
    return p
