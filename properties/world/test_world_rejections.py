"""WD-1..WD-3's checks (properties/world/cases.py) reject a known-bad checker, the wrong
checkpoint for a card, and cards and counts off the claims: each test feeds the claim's own
check the shipped checker, checkpoint, cards or card counts (they must pass) and a known-bad one
(it must fail, by the figure it misses)."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.properties.falsify import rejects
from inference_conformance.properties.world.cases import check_wd1, check_wd2_cards, check_wd2_subset, check_wd3, corruptions
from inference_conformance.smallworld import checkpoints, grammar
from inference_conformance.smallworld.checker import is_grammatical

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def vocabulary_only(words) -> bool:
    """A checker that only checks the vocabulary and the end marker: blind to agreement,
    a/an and the topic."""
    vocab = set(grammar.vocabulary())
    return bool(words) and words[-1] == "<eos>" and all(w in vocab for w in words)


@pytest.mark.claim("WD-1")
def test_wd1_rejects_checker_blind_to_the_grammar():
    docs = corruptions(200, 13, pick_seed=0)
    rejects("WD-1", check_wd1, (is_grammatical, docs), (vocabulary_only, docs),
            match=r"WD-1: the checker rejects \S+ of 200 single-token corruptions")


@pytest.mark.claim("WD-2")
def test_wd2_rejects_the_wrong_checkpoint_for_a_card():
    """The poor draft's weights against the good draft's card (same shape): the subset NLL misses."""
    card = checkpoints.load_card("draft_good")
    good = checkpoints.load_model("draft_good", dtype=torch.float64)
    poor = checkpoints.load_model("draft_poor", dtype=torch.float64)
    rejects("WD-2", check_wd2_subset, (good, card, "draft_good"), (poor, card, "draft_good"),
            match="WD-2: draft_good subset NLL")


@pytest.mark.claim("WD-2")
def test_wd2_rejects_cards_with_a_poor_draft_as_good_as_the_target():
    cards = {n: checkpoints.load_card(n) for n in checkpoints.NAMES}
    flat = {**cards, "draft_poor": {**cards["draft_poor"], "test_nll": cards["target"]["test_nll"] * 1.02}}
    rejects("WD-2", check_wd2_cards, (cards,), (flat,), match="WD-2: poor draft NLL .* not clearly above")


@pytest.mark.claim("WD-2")
def test_wd2_rejects_cards_with_a_good_draft_5_percent_worse():
    cards = {n: checkpoints.load_card(n) for n in checkpoints.NAMES}
    off = {**cards, "draft_good": {**cards["draft_good"], "test_nll": cards["target"]["test_nll"] * 1.05}}
    rejects("WD-2", check_wd2_cards, (cards,), (off,), match="WD-2: good draft NLL .* not within 3%")


@pytest.mark.claim("WD-3")
@pytest.mark.parametrize("name,bad", [("target", 850), ("draft_poor", 350)])
def test_wd3_rejects_a_count_off_the_claim(name, bad):
    """The card's own count of 1000 holds; 85% grammatical for the target (claim >= 90%) and
    35% for the poor draft (claim < 30%) refute the claim."""
    card = checkpoints.load_card(name)
    k_card = round(card["grammatical_fraction"] * card["samples"])
    rejects("WD-3", check_wd3, (name, k_card, card["samples"]), (name, bad, card["samples"]),
            match=f"WD-3: {name}: the sample's {bad}/1000 refutes")
