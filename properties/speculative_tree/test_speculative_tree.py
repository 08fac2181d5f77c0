"""Tests of token-tree speculation beside its laws (``laws.py``) (claims SD-11, SD-12 for trees, SD-13; SpecInfer, Medusa;
lecture 002 §6.6).

SD-11 is checked two ways. Exactly: the float64 tree enumerator (``inference_conformance.reference.speculative_tree``)
sums every draft token and every accept/reject path of one round over a tree; the round's emitted
tokens, completed by the target to depth + 1 tokens, must have the target's own distribution to
1e-12, for drawn trees (any parent pointers, V 2..3, prefix-dependent q and p) and the pinned
shapes and boundary classes. On samples, for every registered ``verify_tree`` (``--impl
speculative_tree=module:fn`` ones included): one batch of independent rounds per fixed tree
configuration, the result's structure checked exactly, then a G-test of the emitted sequences
against the enumeration, family-wise false-alarm rate 1e-3; the law's false-alarm rate and its
power against the few-percent biased zoo entries are computed on exact multinomial draws. The
zoo (``properties/speculative_tree/zoo.py``) is each shown rejected.

SD-13: Medusa's typical acceptance run through the same enumerator: its total-variation
distance from the target is > 0 for the ε, δ Medusa uses and 0 in the limits that make it exact.
SD-12 (trees): greedy tree verification emits the target's greedy tokens.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.stats import check_counts, upper_bound
from inference_conformance.properties.speculative.cases import ALPHA
from inference_conformance.properties.speculative_tree.cases import (
    TREE_STAT_CONFIGS,
    TREE_STAT_TRIALS,
    check_tree_structure,
    emitted_counts,
    sequence_categories,
    tree_case,
    tree_law_power,
    tree_tensors,
)
from inference_conformance.properties.speculative.claims_cases import check_sd13_figure, check_sd13_limits
from inference_conformance.properties.speculative_tree.laws import EXACT_BOUND, SD11_EXACT, tree_exact_error
from inference_conformance.reference import speculative_tree as ref

TECH = "speculative_tree"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("SD-11")
@pytest.mark.suite_own("the exact enumeration, the oracle SD-11's statistical law is calibrated on")
def test_sd11_exact_enumeration():
    """SD-11 exactly: for drawn and pinned trees, one round's emitted tokens completed by the
    target have the target's distribution to 1e-12 (float64 enumeration of every draft token and
    accept/reject path)."""
    run = SD11_EXACT(ref)
    results.record("SD-11", measured=max(run.observations), bound=EXACT_BOUND,
                   unit="max |P(emitted) - p| over the enumerated trees",
                   rule="exact enumeration of every draft token and accept/reject path, float64",
                   what="exact error")


#: Wrong rules the exact check must reject, each the enumerator's version of a zoo entry.
WRONG_RULES = {
    "acceptance x 0.97": ref.scaled_acceptance(0.97),
    "residual not renormalised": ref.Rule(
        "unnormalised", accept=lambda r, q, p, x: min(1.0, r[x] / q[x]),
        update=lambda r, q, p: np.maximum(r - q, 0.0) if np.maximum(r - q, 0.0).sum() > 0 else r,
        emit=lambda r, q, p: r),
    "siblings tested against p": ref.Rule(
        "vs p", accept=lambda r, q, p, x: min(1.0, p[x] / q[x]), update=None,
        emit=lambda r, q, p: ref._norm_residual(p, q, p)),
    "correction from q": ref.Rule("from q", accept=ref.EXACT.accept, update=ref.EXACT.update,
                                  emit=lambda r, q, p: q),
    "typical acceptance": ref.typical_acceptance(0.09, 0.3),
}


@pytest.mark.claim("SD-11")
@pytest.mark.parametrize("rule", sorted(WRONG_RULES))
def test_sd11_exact_check_rejects_wrong_rules(rule):
    """The exact check can fail: enumerating a wrong rule moves the emitted distribution away from
    the target's by far more than the bound, on a dense binary tree and three independent drafts
    (siblings matter in both)."""
    errors = [tree_exact_error(TREE_STAT_CONFIGS[name], WRONG_RULES[rule])
              for name in ("binary-V3", "three-drafts-V3")]
    assert max(errors) > 1e-3, f"rule {rule!r} passed the exact SD-11 check (errors {errors})"


#: Exact multinomial draws of the whole law for its false-alarm rate and its power.
LAW_DRAWS, POWER_DRAWS = 1000, 500
#: The few-percent biased entries of the zoo, as enumerator rules.
SUBTLE = {"acceptance_times_097": WRONG_RULES["acceptance x 0.97"],
          "unrenormalised_sibling_residual": WRONG_RULES["residual not renormalised"]}


@pytest.mark.claim("SD-11")
@pytest.mark.suite_own("the statistical law's own false-alarm rate (a calibration of the test)")
def test_sd11_law_false_alarm_rate_exact_draws():
    """The law's family-wise false-alarm rate is at most ALPHA = 1e-3: on 1000 exact multinomial
    draws of a correct verifier's rounds its false alarms do not exceed binom.ppf(0.999, 1000, 1e-3)."""
    from scipy import stats as sps

    k, _ = tree_law_power(ref.EXACT, LAW_DRAWS, 0)
    limit = int(sps.binom.ppf(1 - 1e-3, LAW_DRAWS, ALPHA))
    results.record("SD-11", measured=k / LAW_DRAWS, bound=ALPHA,
                   unit="false-alarm rate of the statistical tree law (exact draws of a correct verifier)",
                   rule=f"{LAW_DRAWS} draws; false alarms <= {limit}", false_alarms=k, runs=LAW_DRAWS)
    assert k <= limit, f"{k} false alarms in {LAW_DRAWS} exact draws (limit {limit})"


@pytest.mark.claim("SD-11")
@pytest.mark.parametrize("bias", sorted(SUBTLE))
@pytest.mark.suite_own("the statistical law's own power (a calibration of the test)")
def test_sd11_law_power_against_subtle_biases(bias):
    """The law's power against each few-percent biased zoo verifier (acceptance x 0.97; the
    residual not renormalised after a rejected sibling), on 500 exact draws of its rounds: at
    least 0.9 with 99.9% confidence (Clopper-Pearson lower bound); recorded."""
    k, per = tree_law_power(SUBTLE[bias], POWER_DRAWS, 1)
    lower = 1 - upper_bound(POWER_DRAWS - k, POWER_DRAWS)
    results.record("SD-11", measured=k / POWER_DRAWS, bound=0.9, unit=f"power of the statistical tree law against {bias}",
                   rule=f"{POWER_DRAWS} exact draws, rounds per configuration {TREE_STAT_TRIALS}; "
                        f"99.9% lower bound {lower:.3f} >= 0.9", what=f"rejections per configuration {per}",
                   power=k / POWER_DRAWS, power_runs=POWER_DRAWS, draft=bias)
    assert lower >= 0.9, f"power against {bias}: {k}/{POWER_DRAWS} (lower bound {lower:.3f})"


@pytest.mark.parametrize("bias", sorted(SUBTLE))
def test_subtle_tree_zoo_entries_follow_their_enumeration(bias):
    """Each of those zoo verifiers emits the distribution its rule's enumeration gives (G-tests at
    1e-3 on every configuration), so the power stated above is that entry's power."""
    from inference_conformance.conformance import registry

    impl = {i.name: i for i in registry.zoo(TECH)}[bias]
    for k, (name, case) in enumerate(TREE_STAT_CONFIGS.items()):
        args = tree_tensors(case, TREE_STAT_TRIALS[name], 31 + k, "cpu")
        tokens, _ = impl(*args, generator=torch.Generator().manual_seed(5 + k))
        index, probs = sequence_categories(case.outcomes(SUBTLE[bias]))
        counts, impossible = emitted_counts(tokens, index)
        assert impossible == 0, f"{bias} on {name}: {impossible} sequences its own rule never emits"
        check_counts(counts, probs / probs.sum(), alpha=ALPHA / len(TREE_STAT_CONFIGS),
                     what=f"{bias} on {name}: emitted sequences vs its own enumerated distribution").check()


# ------------------------------------------------------------------------ SD-13 typical acceptance
@pytest.mark.claim("SD-13")
@pytest.mark.suite_own("Medusa's typical acceptance (the suite's implementation of it: not the contract's rule, SD-13)")
def test_sd13_typical_acceptance_not_exact_by_design():
    """SD-13: typical acceptance's total-variation distance from the target, by enumeration, as
    a function of ε (δ = sqrt(ε)): > 1e-3 at every ε of the figure, on a dense binary tree and
    three independent drafts; the figure is recorded ("not exact, by design";
    :func:`inference_conformance.properties.speculative.claims_cases.check_sd13_figure`)."""
    check_sd13_figure(ref.typical_acceptance, ref.tree_total_variation)


@pytest.mark.claim("SD-13")
@pytest.mark.suite_own("Medusa's typical acceptance (the suite's implementation of it: not the contract's rule, SD-13)")
def test_sd13_typical_acceptance_exact_in_its_limits():
    """SD-13's limits: the distance is 0 (1e-12) where typical acceptance never accepts a token the
    exact rule could reject: a threshold >= 1 (ε >= 1, δ >= exp(H_max), nothing accepted, every
    token from p) and a one-hot target (only its token passes, the others are rejected as the
    exact rule rejects them); the same enumeration gives > 1e-3 on the dense tree (so the check
    can fail; :func:`inference_conformance.properties.speculative.claims_cases.check_sd13_limits`)."""
    check_sd13_limits(ref.typical_acceptance, ref.tree_total_variation)


# ------------------------------------------------------------------ SD-12 for trees (greedy)
def greedy_chain(case, n: int) -> list[int]:
    """The target's greedy tokens from the root: n argmaxes along its own choices."""
    seq: list[int] = []
    for _ in range(n):
        seq.append(int(np.argmax(case.p(tuple(seq)))))
    return seq


@pytest.mark.claim("SD-12")
@pytest.mark.suite_own("the suite's greedy tree walk; the contract's verify_tree is the sampled rule, which SD-11 judges on every "
                       "registered verifier")
def test_sd12_greedy_tree_verification_emits_the_greedy_tokens():
    """SD-12 for trees: greedy verification of random trees (each shape, random node tokens, some
    on the target's greedy path) emits tokens that are exactly the target's greedy tokens, as many
    as the path accepted plus one, and accepts every greedy node it can reach; a verifier that
    takes the first child whatever its token is shown wrong by the same comparison."""
    from inference_conformance.conformance.contracts.speculative_tree import SHAPES

    checked, wrong_first_child = 0, 0
    for s, shape in enumerate(SHAPES.values()):
        case = tree_case(shape, 3, 40 + s, "dense")
        par, tok, _, p = tree_tensors(case, 64, 50 + s, "cpu")
        tokens, path = ref.verify_tree_greedy(par, tok, p)
        check_tree_structure(par, tokens, path, tok)
        greedy = greedy_chain(case, case.depth + 1)
        for b in range(tok.shape[0]):
            n = int((path[b] >= 0).sum())
            assert tokens[b, :n + 1].tolist() == greedy[:n + 1], \
                f"{case!r} row {b}: emitted {tokens[b, :n + 1].tolist()}, greedy {greedy[:n + 1]}"
            # nothing greedy left unaccepted: no child of the last node carries the next greedy token
            last = int(path[b, n - 1]) if n else -1
            kids = [i for i, q in enumerate(shape) if q == last]
            assert all(int(tok[b, c]) != greedy[n] for c in kids), f"row {b}: a greedy child was not taken"
            first = [i for i, q in enumerate(shape) if q == -1][0]
            wrong_first_child += int(tok[b, first]) != greedy[0]
            checked += 1
    results.record("SD-12", measured=0, bound=0, unit="tree rows whose greedy verification differs from greedy decoding",
                   rule=f"{checked} rows over {len(SHAPES)} tree shapes, token for token", what="mismatches")
    assert wrong_first_child > 0, "no row had a non-greedy first child: the comparison could not fail"
