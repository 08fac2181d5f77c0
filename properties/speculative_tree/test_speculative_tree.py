"""Laws of token-tree speculation (claims SD-11, SD-12 for trees, SD-13; SpecInfer, Medusa;
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
from hypothesis import note

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.speculative_tree import DTYPES
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.conformance.stats import check_counts, upper_bound
from inference_conformance.conformance.tolerance import Comparison, report_verdict
from inference_conformance.properties.speculative.cases import ALPHA
from inference_conformance.properties.speculative_tree.boundary_cases import boundary_verdicts
from inference_conformance.properties.speculative_tree.cases import (
    PINNED_TREES,
    TREE_STAT_CONFIGS,
    TREE_STAT_TRIALS,
    check_tree_structure,
    emitted_counts,
    sequence_categories,
    tree_case,
    tree_cases,
    tree_law_power,
    tree_law_verdicts,
    tree_tensors,
)
from inference_conformance.properties.speculative.claims_cases import check_sd13_figure, check_sd13_limits
from inference_conformance.reference import speculative_tree as ref

TECH = "speculative_tree"
ZOO_ALL = ("unrenormalised_sibling_residual", "sibling_tested_against_p", "correction_from_q",
           "bonus_from_deepest_node", "acceptance_times_097", "typical_acceptance_as_exact")
#: The exact rule of SD-11: the enumerated distribution equals the target's to this bound (float64).
EXACT_BOUND = 1e-12

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tree_exact_error(case, rule=ref.EXACT) -> float:
    """max |P(completed emitted tokens) − P(target)| over depth + 1 tokens, by enumeration."""
    L = case.depth + 1
    got = ref.completed_distribution(case.outcomes(rule), case.p, case.V, L)
    return float(np.abs(got - ref.target_distribution(case.p, case.V, L)).max())


def law_sd11_exact(run, case):
    """SD-11 exactly on one tree: the round's emitted tokens, completed by the target, follow the
    target's distribution over depth + 1 tokens; the error is observed."""
    note(repr(case))
    err = tree_exact_error(case)
    run.observe(err)
    report_verdict(Comparison(err <= EXACT_BOUND, f"exact enumeration in float64: max |P - p| <= {EXACT_BOUND:g}",
                           err, EXACT_BOUND, f"{case!r}: depth + 1 tokens")).check()


#: SD-11's exact law (no implementation: the reference's enumeration of every path).
SD11_EXACT = Law(claim="SD-11", technique=TECH, body=law_sd11_exact, params=(), given={"case": tree_cases()},
                 examples=tuple(dict(case=c) for c in PINNED_TREES))


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


# ------------------------------------------------------------ SD-11 on samples, every verifier
#: The statistical law's seed (the ``ci`` profile fixes every draw; so does this).
STAT_SEED = 7


def law_sd11_statistical(run, device, dtype):
    """SD-11 on samples: per tree configuration one ``verify_tree`` call over its independent
    rounds, probabilities in ``dtype``; structure exactly, then one G-test of the emitted
    sequences, ALPHA family-wise."""
    with refusal(run, f"{run.implementation} on {dtype} probabilities"):
        verdicts = tree_law_verdicts(run.impl, STAT_SEED, device, dtype=dtype)
    failed = [v for v in verdicts if not v.ok]
    assert not failed, f"{dtype}: " + "; ".join(f"{v.what}: {v.detail}" for v in failed[:3])


SD11_STATISTICAL = Law(claim="SD-11", technique=TECH, body=law_sd11_statistical, dtypes=DTYPES,
                       kills=(Kills(ZOO_ALL, (torch.float64,)),
                              Kills(("float32_unrenormalised_residual",), (torch.float32,))))
test_sd11_statistical = SD11_STATISTICAL.conformance_test(
    "test_sd11_statistical",
    doc="""SD-11 for every registered verify_tree, in every dtype of the contract (the probabilities
    multiples of 2^-8, exact in each): the emitted sequences of a binary tree, three independent
    drafts, a wide root and two boundary classes follow the exact enumeration (G-tests,
    family-wise false-alarm rate 1e-3, fixed seeds), after exact checks of the path.""")
test_sd11_zoo_rejected, test_sd11_zoo_rejected_float32 = SD11_STATISTICAL.make_zoo_tests(
    "test_sd11_zoo_rejected", "test_sd11_zoo_rejected_float32")


def law_sd11_boundary_uniforms(run, device, dtype):
    """SD-11 at the ends of [0, 1): with every uniform the verifier draws at 0, then at the largest
    value below 1, each tree of ``BOUNDARY_TREES`` (probabilities ``dtype``) accepts exactly the
    nodes of residual r(x) >= q(x), rejects those of r(x) = 0 and emits a token of positive
    probability in the row it is drawn from (``properties/speculative_tree/boundary_cases.py``)."""
    with refusal(run, f"{run.implementation} on {dtype} probabilities"):
        failures, draws = boundary_verdicts(run.impl, device, dtype)
    if draws == 0:
        unsupported(f"{run.implementation} draws no uniform through torch.rand, torch.rand_like or "
                    "Tensor.uniform_: the boundary values cannot be given to it")
    run.observe(draws)
    assert not failures, f"{len(failures)} boundary rounds wrong: " + "; ".join(failures[:2])


SD11_BOUNDARY = Law(claim="SD-11", technique=TECH, body=law_sd11_boundary_uniforms, dtypes=DTYPES,
                    kills=(Kills(("accepts_at_boundary",), (torch.float32,)),))
test_sd11_boundary_uniforms = SD11_BOUNDARY.conformance_test("test_sd11_boundary_uniforms")
(test_sd11_boundary_zoo_rejected,) = SD11_BOUNDARY.make_zoo_tests("test_sd11_boundary_zoo_rejected")

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
