"""How a check says "unsupported": an implementation refused the input (it raised
``NotImplementedError`` for a dtype, head dim or size it does not handle).

"Unsupported" is never a pass. It is its own outcome, carried by its own exception type
(:class:`Unsupported`, a kind of pytest skip), so the plugin and the report recognise it by type,
not by the words of a message.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NoReturn

import pytest


class Unsupported(pytest.skip.Exception):
    """The implementation under test refused every input of this test (NotImplementedError).
    Reported as "unsupported" (a skip that names the refusal), never as a pass."""


def unsupported(reason: str) -> NoReturn:
    """End the running test as "unsupported" with ``reason`` (say who refused what)."""
    raise Unsupported(f"unsupported: {reason}", _use_item_location=True)


@contextmanager
def refusal_is_unsupported(who: str) -> Iterator[None]:
    """Inside the block, a ``NotImplementedError`` (``who`` refused the input) ends the running
    test as "unsupported" (:func:`unsupported`) instead of failing it."""
    try:
        yield
    except NotImplementedError as exc:
        unsupported(f"{who} refused: {exc}")
