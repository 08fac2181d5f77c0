"""The checks every contract gets (properties/test_contract_generic.py runs them on every
implementation, from the contract's own ``cases``), as plain functions of a callable and one
call's arguments, so that tests can show each one rejects a known-bad function:

- :func:`check_inputs_not_mutated`: every tensor argument is bit-for-bit unchanged (an ``out``
  buffer excepted);
- :func:`check_output_fully_written`: every element of the output is written and finite where
  the oracle's is;
- :func:`check_repeatable`: two calls on the same inputs give bit-identical results;
- :func:`check_invalid_call`: a call the contract documents as invalid raises a documented type,
  naming the argument, before anything is written.

Each raises AssertionError when the check fails and :class:`Refused` when the callable raised
NotImplementedError for the call (for an invalid call: for the valid setup it needs).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from inference_conformance.conformance import tolerance


def _tensors(x: Any, path: str = "out") -> list[tuple[str, torch.Tensor]]:
    """Every tensor inside ``x`` (tensors, numpy arrays as tensors, modules' parameters and
    buffers, tuples, lists, dicts, dataclasses; a traceable tensor subclass by its inner
    tensors), with its path."""
    if type(x).__module__ == "numpy" and hasattr(x, "__array__") and hasattr(x, "dtype"):
        import numpy as np

        return [(path, torch.from_numpy(np.array(x, copy=True)))] if np.asarray(x).dtype != object else []
    if isinstance(x, torch.Tensor):
        if hasattr(x, "__tensor_flatten__"):      # a tensor subclass (torchao's quantized weights)
            names, _ = x.__tensor_flatten__()
            return [t for n in names for t in _tensors(getattr(x, n), f"{path}.{n}")]
        return [(path, x)]
    if isinstance(x, torch.nn.Module):
        return [t for k, v in x.state_dict(keep_vars=True).items() for t in _tensors(v, f"{path}.{k}")]
    if isinstance(x, (tuple, list)):
        return [t for i, v in enumerate(x) for t in _tensors(v, f"{path}[{i}]")]
    if isinstance(x, dict):
        return [t for k, v in x.items() for t in _tensors(v, f"{path}[{k!r}]")]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [t for f in dataclasses.fields(x) for t in _tensors(getattr(x, f.name), f"{path}.{f.name}")]
    return []


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, torch.Generator):      # a contract's randomness: a copy in the same state
        g = torch.Generator(device=x.device)
        g.set_state(x.get_state())
        return g
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


class Refused(Exception):
    """The implementation refused one case (NotImplementedError): that case is skipped."""


def _call(fn, args, kwargs):
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise Refused(str(exc)) from exc


def check_inputs_not_mutated(fn, args: tuple, kwargs: dict) -> None:
    """Call ``fn`` and assert every tensor argument (``out`` excepted) is unchanged."""
    kw_in = {k: v for k, v in kwargs.items() if k != "out"}
    before = _tensors((args, kw_in), "input")
    saved = [(p, t.clone()) for p, t in before]
    _call(fn, args, kwargs)
    for (p, t), (_, t0) in zip(before, saved):
        tolerance.assert_exact(t, t0, what=f"{p} after the call (inputs must not be mutated)")


def _finite(t: torch.Tensor) -> torch.Tensor:
    """isfinite on the CPU, an 8-bit float (torch has no isfinite for float8) read as float32."""
    t = t.detach()
    return torch.isfinite(t.float() if t.is_floating_point() and t.element_size() == 1 else t).cpu()


def check_output_fully_written(fn, args: tuple, kwargs: dict, oracle=None) -> None:
    """With an ``out`` buffer: pre-fill it with NaN, call, assert no NaN is left where the
    oracle's output is finite (everywhere without an oracle). Without one: the output is finite
    wherever the oracle's is."""
    out_buf = kwargs.get("out")
    if isinstance(out_buf, torch.Tensor) and out_buf.is_floating_point():
        out_buf.fill_(float("nan"))
        result = _call(fn, args, kwargs)
        produced = [("out", out_buf)]
    else:
        result = _call(fn, args, kwargs)
        produced = _tensors(result)
    expected = _tensors(oracle(*_clone(args), **_clone(kwargs))) if oracle is not None else []
    if not produced:
        return
    for i, (p, t) in enumerate(produced):
        if not t.is_floating_point():
            continue
        finite = _finite(t)
        if i < len(expected) and expected[i][1].shape == t.shape:
            want = _finite(expected[i][1])
        else:
            want = torch.ones_like(finite)
        missing = want & ~finite
        tolerance.assert_exact(missing.sum(), torch.tensor(0),
                               what=f"{p}: elements not written or not finite where the oracle's are")


def check_repeatable(fn, args: tuple, kwargs: dict) -> None:
    """Two calls on identical inputs give bit-identical results."""
    a = _call(fn, *_fresh(args, kwargs))
    b = _call(fn, *_fresh(args, kwargs))
    if isinstance(kwargs.get("out"), torch.Tensor):
        return  # results compared through the returned values when there are some
    ta, tb = _tensors(a), _tensors(b)
    assert len(ta) == len(tb), f"the two calls returned {len(ta)} and {len(tb)} tensors"
    for (p, x), (_, y) in zip(ta, tb):
        tolerance.assert_exact(x, y, what=f"{p} of a repeated call (results must be repeatable)")
    if not ta and isinstance(a, (bool, int, float, str, type(None), tuple, list, dict)):
        # no tensor inside: plain values; a container of other objects is compared element-wise
        # only where == gives a bool (an implementation's own object may define no equality)
        same = a == b
        assert not isinstance(same, bool) or same, \
            f"a repeated call returned {b!r} instead of {a!r} (results must be repeatable)"


def _fresh(args, kwargs):
    args, kwargs = _clone(args), _clone(kwargs)
    if isinstance(kwargs.get("out"), torch.Tensor):
        kwargs["out"].fill_(float("nan"))
    return args, kwargs


def names(message: str, argument) -> bool:
    """True when ``message`` names ``argument`` (a name, or a tuple of names any of which will
    do): case-insensitive, not inside a longer identifier ("q" is named by "q must be" and
    "q.shape", not by "unique")."""
    alternatives = (argument,) if isinstance(argument, str) else tuple(argument)
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(a)}(?![A-Za-z0-9_])", message, re.IGNORECASE)
               for a in alternatives)


def _snapshot(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return tuple(_snapshot(v) for v in x)
    return x


def _assert_same(now: Any, before: Any, what: str) -> None:
    if isinstance(before, torch.Tensor):
        tolerance.assert_exact(now, before, what=what)
    elif isinstance(before, tuple):
        assert isinstance(now, (tuple, list)) and len(now) == len(before), f"{what}: {now!r} instead of {before!r}"
        for i, (a, b) in enumerate(zip(now, before)):
            _assert_same(a, b, f"{what}[{i}]")
    else:
        assert now == before, f"{what}: {now!r} instead of {before!r}"


def check_invalid_call(impl, call) -> None:
    """Make ``call`` (a :class:`inference_conformance.conformance.registry.InvalidCall`) on ``impl`` and assert it
    raises one of ``call.raises`` whose message names ``call.argument``, leaving an ``out``
    buffer (pre-filled with NaN) and ``call.state`` as they were. No exception, another type (a
    NotImplementedError included: unsupported is no answer to an invalid call) or a message not
    naming the argument fails, saying which. A NotImplementedError while building the valid
    parts of the call (``on``, ``args``) is :class:`Refused`."""
    try:
        receiver = impl if call.on is None else call.on(impl)
        args = call.args(receiver) if callable(call.args) else call.args
    except NotImplementedError as exc:
        raise Refused(f"{call.what}: the valid setup was refused ({exc})") from exc
    fn = receiver if call.function is None else getattr(receiver, call.function)
    kwargs = dict(call.kwargs)
    out_buf = kwargs.get("out")
    if isinstance(out_buf, torch.Tensor) and out_buf.is_floating_point():
        out_buf.fill_(float("nan"))
    before = _snapshot(call.state(receiver)) if call.state is not None else None
    documented = " or ".join(t.__name__ for t in call.raises)
    try:
        fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise AssertionError(f"{call.what}: raised NotImplementedError ({exc}) for an invalid call; the "
                             f"contract documents {documented} (unsupported is not an answer)") from exc
    except call.raises as exc:
        error = exc
    except Exception as exc:
        raise AssertionError(f"{call.what}: raised {type(exc).__name__} ({exc}); the contract documents "
                             f"{documented}") from exc
    else:
        raise AssertionError(f"{call.what}: the invalid call returned without an exception; the contract "
                             f"documents {documented}")
    if call.argument is not None and not names(str(error), call.argument):
        raise AssertionError(f"{call.what}: raised {type(error).__name__}({str(error)!r}), whose message does "
                             f"not name the argument {call.argument!r}")
    if isinstance(out_buf, torch.Tensor) and out_buf.is_floating_point():
        written = int((~torch.isnan(out_buf)).sum())
        assert written == 0, f"{call.what}: {written} elements of out written before the call was rejected"
    if call.state is not None:
        _assert_same(_snapshot(call.state(receiver)), before, f"{call.what}: state after the rejected call")
