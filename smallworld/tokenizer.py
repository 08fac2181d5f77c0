"""Word-level tokenizer of the garden world.

Ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3, then the grammar's words in
sorted order. A document's text is its words joined by single spaces (``"the owl sings .
<eos>"``); :meth:`Tokenizer.encode` splits on whitespace, so ``decode(encode(text))`` is
``text`` with its whitespace normalised, and ``encode(decode(ids)) == ids`` for ids without
``<unk>``. Model inputs start with ``<bos>`` (:meth:`Tokenizer.encode_document`).
"""
from __future__ import annotations

from functools import lru_cache

from inference_conformance.smallworld.grammar import EOS, vocabulary

PAD, BOS, UNK = "<pad>", "<bos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)


class Tokenizer:
    """Maps words to ids and back. ``words``: the non-special vocabulary, in id order."""

    def __init__(self, words: list[str]):
        words = [w for w in words if w not in SPECIALS]
        self.itos: list[str] = list(SPECIALS) + words
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("duplicate words in the vocabulary")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (self.stoi[s] for s in SPECIALS)

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str | list[str]) -> list[int]:
        """Text (or a list of words) -> ids; unknown words map to ``<unk>``."""
        words = text.split() if isinstance(text, str) else list(text)
        return [self.stoi.get(w, self.unk_id) for w in words]

    def decode(self, ids) -> str:
        """Ids -> text (words joined by single spaces). Raises ValueError for an id out of range."""
        return " ".join(self.decode_words(ids))

    def decode_words(self, ids) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.itos):
                raise ValueError(f"token id {i} outside [0, {len(self.itos)})")
            out.append(self.itos[i])
        return out

    def encode_document(self, words: list[str]) -> list[int]:
        """``<bos>`` + the document's ids (the document ends with ``<eos>``)."""
        return [self.bos_id] + self.encode(words)

    def document_words(self, ids) -> list[str]:
        """Words of a generated sequence: drops a leading ``<bos>`` and everything after the
        first ``<eos>`` (kept); padding ends the document too."""
        words = []
        ids = [int(i) for i in ids]
        if ids and ids[0] == self.bos_id:
            ids = ids[1:]
        for i in ids:
            if i == self.pad_id:
                break
            words.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
            if i == self.eos_id:
                break
        return words


@lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    """The garden world's tokenizer (the vocabulary of :func:`inference_conformance.smallworld.grammar.vocabulary`)."""
    return Tokenizer(vocabulary())
