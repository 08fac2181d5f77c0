"""PA-3's and PA-5's checks (properties/paged_attention/block_allocator_cases.py) reject known-bad caches and
allocator counts: each test feeds the claim's own check the reference's (it must pass) and a
variant with a classic mistake (it must fail, by the count the mistake moves)."""
from __future__ import annotations

import pytest

from inference_conformance.properties.paged_attention.block_allocator_cases import check_pa3, check_pa5
from inference_conformance.properties.falsify import rejects
from inference_conformance.reference.paged_attention import PagedKVCache, waste_per_request


class ForkCopiesTheBlocks(PagedKVCache):
    """Parallel sampling without sharing: fork gives the child its own copy of every block."""

    def fork(self, parent, child) -> None:
        self.new_sequence(child)
        self.append_tokens(child, self.length(parent))


def waste_with_block_always_ahead(lengths, block_size):
    """An allocator that takes a new block as soon as the last one fills (one block ahead):
    a request ending on a block boundary holds one empty block."""
    return [w if w else block_size for w in waste_per_request(lengths, block_size)]


def waste_of_reserved_maximum(lengths, block_size):
    """Waste counted against a reservation of the longest request, not the last block."""
    longest = max(lengths)
    return [-(-longest // block_size) * block_size - n for n in lengths]


@pytest.mark.claim("PA-3")
def test_pa3_rejects_fork_that_copies_the_blocks():
    rejects_text = rejects("PA-3", check_pa3, (PagedKVCache,), (ForkCopiesTheBlocks,), match="PA-3: token slots")
    assert "1 of 2 elements differ" in rejects_text


@pytest.mark.claim("PA-5")
def test_pa5_rejects_block_taken_ahead():
    rejects("PA-5", check_pa5, (waste_per_request, 400), (waste_with_block_always_ahead, 400),
            match="PA-5: allocator's waste per request at block size 1")


@pytest.mark.claim("PA-5")
def test_pa5_rejects_waste_of_reserved_maximum():
    rejects("PA-5", check_pa5, (waste_per_request, 400), (waste_of_reserved_maximum, 400),
            match="PA-5: allocator's waste per request at block size 1")

