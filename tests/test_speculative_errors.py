"""Bad input to the suite's own speculative verifiers: a clear TypeError / ValueError in the
suite's wording, raised before anything is computed. Outside verifiers (``--impl``) are judged by
the contract's law instead (``test_invalid_call_raises`` of properties/test_contract_generic.py:
the documented type, a message naming the argument, whatever its wording)."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import registry

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(params=[pytest.param(i, id=i.name, marks=[pytest.mark.skip(reason=i.unavailable)] if i.unavailable
                                     else []) for i in registry.builtins("speculative")])
def impl(request):
    """Each built-in verifier (never an ``--impl`` one: these tests check the suite's wording)."""
    return request.param


def _valid(device, dtype=torch.float32):
    """B = 2, γ = 3, V = 5: draft tokens drawn from q."""
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(2, 3, 5, generator=g, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(2, 4, 5, generator=g, dtype=torch.float64), -1)
    tok = torch.multinomial(q.reshape(-1, 5), 1, generator=g).reshape(2, 3)
    return tok.to(device), q.to(dtype).to(device), p.to(dtype).to(device)


def _zero_q_at_token(a):
    tok, q, p = a
    q = q.clone()
    q[0, 1] = 0.0
    q[0, 1, (int(tok[0, 1]) + 1) % 5] = 1.0
    return tok, q, p


def _neg(t):
    t = t.clone()
    t[0, 0, 0] = -0.1
    t[0, 0, 1] += 0.1
    return t


CASES = {
    "tokens not a tensor": (lambda a: (a[0].tolist(), a[1], a[2]), TypeError, "draft_tokens must be a torch.Tensor"),
    "int32 tokens": (lambda a: (a[0].int(), a[1], a[2]), TypeError, "draft_tokens must be int64"),
    "integer probs": (lambda a: (a[0], a[1].long(), a[2]), TypeError, "draft_probs has dtype"),
    "mixed dtypes": (lambda a: (a[0], a[1].double(), a[2]), TypeError, "must share one dtype"),
    "tokens rank": (lambda a: (a[0][0], a[1], a[2]), ValueError, "draft_tokens must have 2 dimensions"),
    "target one position short": (lambda a: (a[0], a[1], a[2][:, :3]), ValueError, r"target_probs must have shape"),
    "draft gamma differs": (lambda a: (a[0], a[1][:, :2], a[2]), ValueError, r"draft_probs must have shape"),
    "vocab differs": (lambda a: (a[0], a[1], a[2][..., :4]), ValueError, r"target_probs must have shape"),
    "gamma 0": (lambda a: (a[0][:, :0], a[1][:, :0], a[2][:, :1]), ValueError, "gamma >= 1"),
    "token out of range": (lambda a: (a[0].clone().fill_(5), a[1], a[2]), ValueError, r"outside the vocabulary"),
    "negative token": (lambda a: (a[0].clone().fill_(-1), a[1], a[2]), ValueError, r"outside the vocabulary"),
    "q = 0 at a draft token": (_zero_q_at_token, ValueError, "has draft probability"),
    "row not summing to 1": (lambda a: (a[0], a[1], a[2] * 1.5), ValueError, "target_probs.* sums to"),
    "negative probability": (lambda a: (a[0], _neg(a[1]), a[2]), ValueError, "draft_probs must be non-negative"),
    "NaN probability": (lambda a: (a[0], a[1], a[2].clone().fill_(float("nan"))), ValueError, "target_probs must be finite"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_invalid_call_raises(impl, device, name):
    build, exc, match = CASES[name]
    args = build(_valid(device))
    with pytest.raises(exc, match=match):
        impl(*args, generator=torch.Generator(device=device).manual_seed(0))


def test_generator_required(impl, device):
    tok, q, p = _valid(device)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        impl(tok, q, p, generator=0)
