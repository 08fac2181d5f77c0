"""Two outside speculative verifiers, correct but for their errors, for the bad-input law: one
words its messages its own way ("draft_tokens must be a tensor", naming the argument as the
contract asks) and must pass; one raises RuntimeError for every invalid call and must fail."""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.speculative import validate
from inference_conformance.optimized.speculative import verify as _verify


def _verifier(reword):
    """A verifier that checks its arguments and raises ``reword(error)`` for a rejected call."""
    def verify(draft_tokens, draft_probs, target_probs, *, generator: torch.Generator):
        try:
            validate(draft_tokens, draft_probs, target_probs, generator)
        except (TypeError, ValueError) as exc:
            raise reword(exc) from None
        return _verify(draft_tokens, draft_probs, target_probs, generator=generator)

    return verify


#: "must be a tensor" where the suite says "must be a torch.Tensor" (the same exception types).
tensor_wording = _verifier(lambda exc: type(exc)(str(exc).replace("must be a torch.Tensor", "must be a tensor")))
#: RuntimeError, the message unchanged, for every invalid call.
runtime_errors = _verifier(lambda exc: RuntimeError(str(exc)))
