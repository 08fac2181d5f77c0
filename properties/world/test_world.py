"""Laws of the garden world (lecture 001 §0.3, §6.4), over seeds drawn by Hypothesis: every
generated document is grammatical; the constraints the grammar promises are enforced by the
checker (agreement, a/an, the topic fixed by the first sentence); the tokenizer round-trips."""
import random

from hypothesis import given, settings, strategies as st

from inference_conformance.properties.strategies import seeds
from inference_conformance.smallworld import grammar
from inference_conformance.smallworld.checker import is_grammatical, recognizer
from inference_conformance.smallworld.tokenizer import tokenizer

AGREEMENT_SWAP = {"am": "is", "is": "are", "are": "is", "was": "were", "were": "was", "a": "an", "an": "a"}
for _v in grammar.TRANSITIVE + grammar.SHARED_INTRANSITIVE + [v for vs in grammar.TOPIC_VERBS.values() for v in vs]:
    AGREEMENT_SWAP[_v[0]], AGREEMENT_SWAP[_v[1]] = _v[1], _v[0]


@settings(max_examples=25)
@given(seeds)
def test_generated_documents_are_grammatical(seed):
    for doc in grammar.generate_documents(5, seed):
        assert is_grammatical(doc), " ".join(doc)
        assert recognizer().log_prob(doc) < 0.0


@settings(max_examples=25)
@given(seeds, st.integers(0, 2**16))
def test_agreement_corruptions_are_rejected(seed, pick):
    """Swapping one present-tense verb's person/number form (sings <-> sing, is <-> are,
    was <-> were, am -> is) or a/an always breaks the document."""
    doc = grammar.generate_documents(1, seed)[0]
    idx = [i for i, w in enumerate(doc) if w in AGREEMENT_SWAP]
    if not idx:
        return
    i = idx[pick % len(idx)]
    bad = list(doc)
    bad[i] = AGREEMENT_SWAP[doc[i]]
    assert not is_grammatical(bad), " ".join(bad)


@settings(max_examples=25)
@given(seeds, st.integers(0, 2**16))
def test_topic_is_fixed_by_the_first_sentence(seed, pick):
    """A topic noun of a later sentence replaced by a noun of another topic (same number) is
    always rejected: the first sentence fixed the topic."""
    doc = grammar.generate_documents(1, seed)[0]
    first_end = doc.index(".")
    idx = [i for i, w in enumerate(doc) if i > first_end and grammar.topic_of(w)]
    if not idx:
        return
    i = idx[pick % len(idx)]
    t = grammar.topic_of(doc[i])
    k = next(j for p in grammar.TOPIC_NOUNS[t] for j, w in enumerate(p) if w == doc[i])
    rng = random.Random(pick)
    other = rng.choice([x for x in grammar.TOPICS if x != t])
    bad = list(doc)
    # keep the initial sound so that a/an cannot be what rejects it
    same_sound = [p[k] for p in grammar.TOPIC_NOUNS[other] if grammar.initial(p[k]) == grammar.initial(doc[i])]
    bad[i] = rng.choice(same_sound)
    assert not is_grammatical(bad), " ".join(bad)


@settings(max_examples=25)
@given(seeds)
def test_tokenizer_round_trips_generated_documents(seed):
    tok = tokenizer()
    for doc in grammar.generate_documents(5, seed):
        ids = tok.encode_document(doc)
        assert tok.document_words(ids) == doc
        assert tok.decode(ids[1:]) == " ".join(doc)
        assert tok.unk_id not in ids
