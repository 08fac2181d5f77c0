"""The block allocator and block tables of ``reference/paged_attention/__init__.py`` (claims PA-3, PA-4, PA-5;
lecture 001 §4.2, §4.4, exercise 5).

- PA-4, a Hypothesis state machine over new sequence / append / fork / write / free with K/V
  stored: after every step, each block's reference count equals the number of block tables
  holding it, free + used == pool, no block is both free and held (no leak, no double free),
  and every sequence reads back exactly the tokens it wrote (no write ever changes what
  another sequence reads). A copy-on-write that forgets to copy is rejected.
- PA-3: one 512-token prompt sampled 8 times for 128 tokens: the slots the allocator holds,
  unshared and with the prompt's blocks shared by fork.
- PA-5: the slots wasted per request against the block size, counted by the allocator over the
  lecture's request trace.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule, run_state_machine_as_test

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.paged_attention.block_allocator_cases import check_pa3, check_pa5, slots_for_parallel_sampling
from inference_conformance.properties.paged_attention.zoo import CowForgetsToCopy, expect_rejection
from inference_conformance.reference.paged_attention import OutOfBlocks, PagedKVCache, waste_per_request

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.suite_own("the suite's block allocator (its state machine, the lecture's sharing and waste formulas); engines "
                                    "meet paging through the inference_engine laws")]


class CacheMachine(RuleBasedStateMachine):
    """PA-4 over ``cache_class`` (a :class:`PagedKVCache` or a known-bad subclass): a small
    pool (so that appends run out of blocks) of blocks of 1..4 tokens; each token written is a
    fresh number, so a model of each sequence (the list of its numbers) says what it must read."""

    cache_class = PagedKVCache
    seqs = Bundle("seqs")

    def __init__(self):
        super().__init__()
        self.cache = None
        self.model: dict[int, list[float]] = {}
        self.next_id = 0
        self.next_value = 1.0

    @initialize(block_size=st.integers(1, 4), num_blocks=st.integers(2, 10))
    def setup(self, block_size, num_blocks):
        self.cache = self.cache_class(num_blocks, block_size, kv_shape=(1, 1))
        note(f"pool of {num_blocks} blocks of {block_size}")

    def _kv(self):
        x = torch.full((1, 1), self.next_value, dtype=torch.float64)
        self.next_value += 1
        return x, -x

    @rule(target=seqs)
    def new_sequence(self):
        sid = self.next_id
        self.next_id += 1
        self.cache.new_sequence(sid)
        self.model[sid] = []
        note(f"new {sid}")
        return sid

    @rule(seq=seqs, n=st.integers(1, 5))
    def append(self, seq, n):
        if seq not in self.model:
            return
        for _ in range(n):
            k, v = self._kv()
            free_before = self.cache.allocator.num_free
            try:
                self.cache.append(seq, k, v)
            except OutOfBlocks:
                assert self.cache.allocator.num_free == free_before == 0, "a failed append changed the pool"
                note(f"append to {seq}: out of blocks")
                return
            self.model[seq].append(float(k))
        note(f"append {n} to {seq} -> length {len(self.model[seq])}")

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        if parent not in self.model:
            return -1
        child = self.next_id
        self.next_id += 1
        self.cache.fork(parent, child)
        self.model[child] = list(self.model[parent])
        note(f"fork {parent} -> {child}")
        return child

    @rule(seq=seqs, data=st.data())
    def write(self, seq, data):
        if seq not in self.model or not self.model[seq]:
            return
        pos = data.draw(st.integers(0, len(self.model[seq]) - 1), label="pos")
        k, v = self._kv()
        try:
            self.cache.write(seq, pos, k, v)
        except OutOfBlocks:
            note(f"write {seq}[{pos}]: out of blocks for the copy")
            return
        self.model[seq][pos] = float(k)
        note(f"write {seq}[{pos}]")

    @rule(seq=consumes(seqs))
    def free(self, seq):
        if seq not in self.model:
            return
        self.cache.free(seq)
        del self.model[seq]
        note(f"free {seq}")

    @invariant()
    def reference_counts_and_pool(self):
        if self.cache is None:
            return
        a = self.cache.allocator
        holders = [0] * a.num_blocks
        for table in self.cache.tables.values():
            for blk in table:
                holders[blk] += 1
        assert a.refcount == holders, f"reference counts {a.refcount} != holders {holders}"
        free = a.free_blocks()
        assert len(set(free)) == len(free), f"a block is on the free list twice: {free}"
        assert a.num_free + a.num_used == a.num_blocks
        assert all(holders[b] == 0 for b in free), "a free block is still held by a table"
        assert sum(h > 0 for h in holders) == a.num_used, "a used block is held by no table (leak)"

    @invariant()
    def every_sequence_reads_what_it_wrote(self):
        if self.cache is None:
            return
        for sid, values in self.model.items():
            k, v = self.cache.read(sid)
            want = torch.tensor(values, dtype=torch.float64).reshape(1, -1, 1)
            assert_exact(k, want, what=f"K of sequence {sid}")
            assert_exact(v, -want, what=f"V of sequence {sid}")


class CowMachine(CacheMachine):
    cache_class = CowForgetsToCopy


def _machine_settings(n: int):
    return settings(max_examples=max(n, settings.default.max_examples), stateful_step_count=25)


@pytest.mark.claim("PA-4")
def test_pa4_allocator_state_machine():
    cfg = _machine_settings(30)
    run_state_machine_as_test(CacheMachine, settings=cfg)
    results.record("PA-4", measured=0, bound=0, unit="violations (reference counts, pool, reads) in the state machine",
                   rule=f"{cfg.max_examples} runs of up to {cfg.stateful_step_count} steps: new / append / fork / "
                        "write / free on pools of 2-10 blocks of 1-4 tokens")


@pytest.mark.claim("PA-4")
def test_pa4_rejects_cow_that_forgets_to_copy():
    """The known-bad cache whose copy-on-write allocates the new block but never copies into it
    (nor leaves the shared one alone) is rejected by the machine."""
    no_shrink = settings(_machine_settings(100), phases=[Phase.explicit, Phase.generate])
    expect_rejection("PA-4", lambda: run_state_machine_as_test(CowMachine, settings=no_shrink), entry="cow_forgets_to_copy",
                     match="K of sequence")


@pytest.mark.claim("PA-4")
def test_pa4_fork_then_append_copies_only_the_partial_block():
    """A fork shares every block; the first append to a shared, partly filled last block copies
    it (one copy per writer), full blocks stay shared, the parent reads what it read before."""
    c = PagedKVCache(16, 4, kv_shape=(1, 1))
    c.new_sequence("p")
    for i in range(6):                                    # blocks: [full, 2 of 4]
        c.append("p", torch.full((1, 1), float(i)), torch.full((1, 1), float(i)))
    before = c.read("p")
    c.fork("p", "a")
    assert c.allocator.refcount[c.tables["p"][0]] == 2 and c.allocator.refcount[c.tables["p"][1]] == 2
    c.append("a", torch.full((1, 1), 99.0), torch.full((1, 1), 99.0))
    assert c.copies == 1 and c.tables["a"][0] == c.tables["p"][0] and c.tables["a"][1] != c.tables["p"][1]
    assert_exact(c.read("p")[0], before[0], what="parent's K after the child's append")
    assert_exact(c.read("a")[0][0, :, 0], torch.tensor([0, 1, 2, 3, 4, 5, 99.0], dtype=torch.float64),
                 what="child's K")
    c.free("p")
    c.free("a")
    assert c.allocator.num_free == 16


# ---------------------------------------------------------------------------------------- PA-3
@pytest.mark.claim("PA-3")
def test_pa3_parallel_sampling_shares_the_prompt():
    unshared, shared = check_pa3(PagedKVCache)
    saved = 1 - shared / unshared
    results.record("PA-3", measured=unshared, lecture=5120, unit="token slots, 8 samples unshared",
                   rule="512-token prompt, 8 samples x 128 tokens, blocks of 16, counted by the allocator")
    results.record("PA-3", measured=shared, lecture=1536, unit="token slots, prompt's 32 blocks shared",
                   rule="fork shares the prompt's blocks; each sample appends into its own blocks")
    results.record("PA-3", measured=round(saved, 4), lecture=0.70, unit="fraction of slots saved")


@pytest.mark.claim("PA-3")
@settings(max_examples=10)
@given(prompt=st.integers(1, 80), samples=st.integers(1, 5), output=st.integers(0, 40), bs=st.integers(1, 17))
def test_pa3_shared_slots_formula(prompt, samples, output, bs):
    """Sharing holds the prompt's full blocks once; the partly filled last prompt block is
    copied by the first append of every sample but one (copy-on-write) or kept when no
    sample appends."""
    shared = slots_for_parallel_sampling(prompt, samples, output, bs, share=True)
    full, rem = divmod(prompt, bs)
    if output == 0:
        want = -(-prompt // bs) * bs
    else:
        own = -(-(rem + output) // bs)                  # each sample's blocks from its last prompt block on
        # a partial last prompt block is copied by each writer while shared; the last writer keeps it
        want = full * bs + samples * own * bs
    assert shared == want, (shared, want)


# ---------------------------------------------------------------------------------------- PA-5
@pytest.mark.claim("PA-5")
def test_pa5_waste_vs_block_size():
    """Slots reserved but empty per request (the unfilled last block), counted by the allocator
    over requests of the lecture's trace (prompt + output tokens), against half a block."""
    check_pa5(waste_per_request)
