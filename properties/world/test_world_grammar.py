"""The garden world's grammar and checker: hand-written documents, generated documents, and the
checker's power against single-token corruptions (lecture 001 §6.4: whole documents are judged
by the world's real grammar)."""
import pytest

from inference_conformance.conformance import results
from inference_conformance.properties.world.cases import WD1_MIN_REJECTED, check_wd1, corruptions
from inference_conformance.smallworld import checker, data, grammar
from inference_conformance.smallworld.checker import is_grammatical

GOOD = [
    "the owl sings . it flies . <eos>",
    "the owls sing . they fly . <eos>",
    "an owl that the crows follow sings . i am happy . <eos>",
    "the robins near the pond were quiet . there is a wren in the garden . you watch them often . <eos>",
    "the gardener that digs near the old shed laughs and sees us . we are very happy . <eos>",
    "roses bloom . the tulips by the fence that we like grew . <eos>",
    "a small ant crawls . these ants hide under an umbrella . he was eager . the earwigs swarm . <eos>",
    "every child laughed . she knows the men that the women follow . <eos>",
]
BAD = {
    "subject-verb number": "the owl sing . it flies . <eos>",
    "plural subject, singular verb": "the owls sings . they fly . <eos>",
    "person (i is)": "the owl sings . i is happy . <eos>",
    "person (he are)": "the owl sings . he are happy . <eos>",
    "a before a vowel": "a owl sings . it flies . <eos>",
    "an before a consonant": "an robin sings . it flies . <eos>",
    "determiner number": "these owl sings . it flies . <eos>",
    "object case": "the owl sees they . it flies . <eos>",
    "there is + plural": "the owl sings . there is the crows . <eos>",
    "topic: noun of another topic": "the owl sings . the bees buzz . <eos>",
    "topic: verb of another topic": "the owl sings . it blooms . <eos>",
    "main verb agrees with the inner noun": "the owl that the crows follow sing . it flies . <eos>",
    "inner verb agrees with the outer noun": "the owl that the crows follows sings . it flies . <eos>",
    "pronoun fixes no topic": "it sings . the owl flies . <eos>",
    "one sentence only": "the owl sings . <eos>",
    "five sentences": "the owl sings . it flies . it flies . it flies . it flies . <eos>",
    "no end token": "the owl sings . it flies .",
    "text after the end token": "the owl sings . it flies . <eos> it",
    "transitive verb without object": "the owl sees . it flies . <eos>",
    "nesting deeper than the grammar's bound": "the owl near the pond near the wall near the gate sings . it flies . <eos>",
    "unknown word": "the owl sings . it dances . <eos>",
    "empty": "",
}


@pytest.mark.parametrize("text", GOOD)
def test_hand_written_documents_are_accepted(text):
    assert is_grammatical(text), text
    assert checker.recognizer().log_prob(text.split()) > float("-inf")


@pytest.mark.parametrize("why", sorted(BAD))
def test_hand_written_errors_are_rejected(why):
    assert not is_grammatical(BAD[why]), why


def test_generation_is_deterministic_from_the_seed():
    assert grammar.generate_documents(20, 5) == grammar.generate_documents(20, 5)
    assert grammar.generate_documents(20, 5) != grammar.generate_documents(20, 6)
    assert data.split("test", 10) == data.split("test", 30)[:10]


def test_every_generated_document_is_accepted():
    docs = grammar.generate_documents(400, 11) + list(data.split("test", 100))
    rejected = [" ".join(d) for d in docs if not is_grammatical(d)]
    assert not rejected, rejected[:3]


def test_documents_have_the_promised_shape():
    docs = grammar.generate_documents(500, 12)
    n_sent = [d.count(".") for d in docs]
    assert set(n_sent) == {2, 3, 4}
    assert all(d[-1] == "<eos>" and d.count("<eos>") == 1 for d in docs)
    # the topic constraint: every topic noun of a document belongs to the first noun's topic
    for d in docs:
        topics = {grammar.topic_of(w) for w in d} - {None}
        assert len(topics) == 1, " ".join(d)
    assert 200 <= len(grammar.vocabulary()) <= 400


@pytest.mark.claim("WD-1")
def test_single_token_corruptions_are_mostly_rejected():
    """Replace one random word of a generated document with a random vocabulary word (a
    different one): the checker rejects most; the rate is recorded. A corruption can be
    grammatical (``the owl sings`` -> ``the owl flies``), so the rate is below 1."""
    docs = corruptions(600, 13, pick_seed=0)
    rate = check_wd1(is_grammatical, docs)
    # the recognizer and the inside probabilities agree on membership
    for e in docs:
        assert (checker.recognizer().log_prob(e) > float("-inf")) == is_grammatical(e)
    results.record("WD-1", measured=rate, lecture=None, bound=WD1_MIN_REJECTED, unit="fraction of 600 corruptions rejected",
                   rule="single-token substitutions of generated documents, rejected by the checker")


def test_entropy_rate_is_finite_and_plausible():
    h = checker.entropy_rate(data.split("test", 200))
    assert 1.0 < h < 4.0, h
