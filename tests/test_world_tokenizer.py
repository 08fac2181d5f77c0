"""The garden world's word-level tokenizer: round trips (Hypothesis)."""
import pytest
from hypothesis import given, strategies as st

from inference_conformance.smallworld.grammar import vocabulary
from inference_conformance.smallworld.tokenizer import SPECIALS, Tokenizer, tokenizer

WORDS = vocabulary()
TOK = tokenizer()


def test_layout():
    assert TOK.itos[:4] == list(SPECIALS)
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.unk_id) == (0, 1, 2, 3)
    assert len(TOK) == len(set(WORDS) | set(SPECIALS))
    assert TOK.encode("the owl") == [TOK.stoi["the"], TOK.stoi["owl"]]


@given(st.lists(st.sampled_from(WORDS), max_size=60), st.lists(st.sampled_from([" ", "  ", "\t", "\n"]), min_size=61, max_size=61))
def test_text_round_trip(words, seps):
    text = "".join(s + w for s, w in zip(seps, words)) + seps[-1]
    ids = TOK.encode(text)
    assert len(ids) == len(words)
    assert TOK.decode(ids) == " ".join(words)
    assert TOK.encode(TOK.decode(ids)) == ids


@given(st.lists(st.integers(0, len(TOK) - 1).filter(lambda i: i != 3), max_size=80))
def test_id_round_trip(ids):
    assert TOK.encode(TOK.decode(ids)) == ids


@given(st.lists(st.sampled_from(WORDS), max_size=30))
def test_document_words_inverts_encode_document(words):
    doc = [w for w in words if w != "<eos>"] + ["<eos>"]
    assert TOK.document_words(TOK.encode_document(doc) + [TOK.pad_id, 5]) == doc


def test_unknown_words_and_bad_ids():
    assert TOK.encode("the dragon") == [TOK.stoi["the"], TOK.unk_id]
    with pytest.raises(ValueError, match="outside"):
        TOK.decode([len(TOK)])
    with pytest.raises(ValueError, match="duplicate"):
        Tokenizer(["a", "a"])
