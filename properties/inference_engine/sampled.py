"""EN-3 sampled: a speculative engine's sampled tokens follow the target's exact float64
distribution, one G-test per generated position, each with its power stated.

Design. A speculative request generates :data:`NEW` = γ + 2 tokens at γ = :data:`GAMMA`: an
engine that drafts right after the prompt has its draft positions at 1..γ and the bonus at
γ + 1; one that samples the first token at prefill (vLLM) has them at 2..γ + 1 and γ + 2. Plain
sampling, the control, has no draft position: token 1 alone, on :data:`CONTROL_SAMPLES`
requests per prompt. The marginal of token
i >= 2 is a sum over every prefix, not available in closed form, so token i is tested
*conditionally on the engine's own tokens before it*: the samples are grouped by prompt and
prefix (t1..t(i-1)), and within a group of n_g samples token i must be multinomial(n_g,
p(. | prompt, prefix)), which one float64 forward over the observed prefixes gives exactly.
Groups are independent given their sizes (each request is its own draw), so the position's
statistic is the sum of the groups' G statistics with the sum of their degrees of freedom (a
product-multinomial G-test). Within a group, categories of expected count below
:data:`POOL_BELOW` are pooled (then merged with the next smallest until the pool reaches it),
so every bin's expected count is at least 20 and the asymptotic chi-square critical value holds
(``conformance/stats.py``'s CHI2_TRUSTED); a category of probability 0 (outside the top-p
nucleus) is kept apart and any count there rejects outright. A group too small for two bins
adds no degree of freedom: one bin is never evidence.

Power: against every alternative at total variation >= :data:`TV` from p on each group's bins,
Pearson's noncentrality is n_g Σ δ²/p >= 4 n_g TV² (Cauchy-Schwarz on the two halves of δ),
so the test's asymptotic power is at least ncx2.sf(critical, dof, 4 TV² n_used), n_used the
samples in groups of two bins or more: computed from the bins actually used. A test under
:data:`POWER_FLOOR` reads "not enough evidence", never pass.

Contexts are chosen before any output is seen, by a rule on the exact distribution: grammar
prompts (``cases.document_prompts``) whose processed next-token entropy is at least
:data:`H_FLOOR` nats at each tested position along the target's most likely path; for n-gram
speculation, prompts followed by a repeat of two of their ids whose lookup proposal (the id after
their first occurrence) has target probability at least :data:`NGRAM_P`, so that prompt lookup
finds a match, drafts, and its drafts are sometimes accepted.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.inference_engine import Request
from inference_conformance.conformance.tolerance import Comparison, report_verdict
from inference_conformance.properties.inference_engine import cases
from inference_conformance.reference.speculative import process_logits

#: The G-tests' family-wise false-alarm rate per law run (Bonferroni over every position test).
ALPHA = 1e-3
#: Sampled configurations: (temperature, top_p); top-p 0.9 only where the engine offers top-p.
SAMPLED = ((1.0, 1.0), (0.7, 0.9))
#: Draft tokens per round; tokens per request (draft positions and bonus, from either layout).
GAMMA = 1
NEW = GAMMA + 2
#: Prompts per configuration and seeded requests per prompt by temperature (at 1 the target's
#: entropy is highest and the prefixes split finest: measured powers 0.96-1.00 at 1500, and
#: 0.99-1.00 at 0.7 with top-p 0.9 on 2400 samples).
PROMPTS, SAMPLES = 3, {1.0: 1500, 0.7: 800}
#: The plain-sampling control: requests per prompt, one new token each (no draft position).
CONTROL_SAMPLES = 600
#: Candidate prompts the context rule reads (the first PROMPTS that qualify are used).
CANDIDATES = 40
#: Smallest processed next-token entropy (nats) at each tested position of a context.
H_FLOOR = 0.5
#: Least target probability of an n-gram context's first lookup proposal.
NGRAM_P = 0.05
#: Smallest expected count of a bin (categories below it are pooled first).
POOL_BELOW = 20.0
#: The named alternative (total variation on the bins used) and the least power a test needs.
TV, POWER_FLOOR = 0.1, 0.8


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)


def _candidates(seed: int, ngram: bool):
    """(prompt, the id prompt lookup proposes first or None) for each grammar prompt of 4 ids or
    more; ``ngram``: the prompt followed by a repeat of two of its ids (each place in turn), so
    that prompt lookup matches them and proposes the id after their first occurrence."""
    for p in cases.document_prompts(seed, CANDIDATES, max_len=10):
        if len(p) < 4:
            continue
        if not ngram:
            yield tuple(p), None
            continue
        for j in range(1, len(p) - 2):
            yield tuple(p) + tuple(p[j:j + 2]), p[j + 2]


@functools.lru_cache(maxsize=16)
def contexts(folder: str, seed: int, temperature: float, top_p: float, ngram: bool = False) -> tuple:
    """:data:`PROMPTS` prompts (tuples of ids): of :data:`CANDIDATES` grammar prompts, those whose
    processed next-token entropy is at least :data:`H_FLOOR` at each of the :data:`NEW`
    positions along the target's greedy path (one float64 forward per position), the
    :data:`PROMPTS` of least entropy summed over the prefix positions 1..NEW - 1 (the finer the
    prefixes split, the fewer samples each group holds); ``ngram``: prompts ending in a repeat
    (:func:`_candidates`) whose first lookup proposal has probability at least
    :data:`NGRAM_P` (so that drafts are also accepted), one per grammar prompt. Raises
    ValueError when fewer qualify."""
    model, found, bases = cases.oracle(folder), [], set()
    for prompt, proposal in _candidates(seed, ngram):
        base = prompt[:len(prompt) - 2 * ngram]
        if base in bases:
            continue
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(NEW - 1):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
            logits = model(torch.tensor([seq]))[0, len(prompt) - 1:]                     # (NEW, V)
        probs = process_logits(logits, temperature, 0, top_p)
        if bool((_entropy(probs) >= H_FLOOR).all()) and (proposal is None or probs[0, proposal] >= NGRAM_P):
            bases.add(base)
            found.append((float(_entropy(probs)[:-1].sum()), prompt))
    if len(found) < PROMPTS:
        raise ValueError(f"only {len(found)} of {CANDIDATES} candidate prompts have entropy >= {H_FLOOR} "
                         f"at every position")
    return tuple(x for _, x in sorted(found)[:PROMPTS])


@torch.no_grad()
def conditionals(folder: str, prompt: tuple, prefixes: list, temperature: float, top_p: float) -> np.ndarray:
    """(k, m + 1, V) float64: the processed distribution of token i + 1 after ``prompt`` and the
    first i ids of each of ``prefixes`` (k tuples of m ids), from one forward."""
    seqs = torch.tensor([list(prompt) + list(x) for x in prefixes])
    logits = cases.oracle(folder)(seqs)[:, len(prompt) - 1:]
    return process_logits(logits, temperature, 0, top_p).numpy()


def pooled(counts: np.ndarray, probs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, probs) with every category of expected count n·p below :data:`POOL_BELOW` (and
    probability > 0) pooled into one, itself merged with the next smallest until it reaches the
    threshold; categories of probability 0 kept apart (a count there rejects outright)."""
    keep = (probs * n >= POOL_BELOW) | (probs == 0)
    order = np.argsort(np.where(keep & (probs > 0), probs, np.inf))
    pool = ~keep
    for k in order:
        if probs[pool].sum() * n >= POOL_BELOW or not np.isfinite(probs[k]) or probs[k] == 0 or pool[k]:
            break
        pool[k] = True
    c = np.append(counts[~pool], counts[pool].sum())
    p = np.append(probs[~pool], probs[pool].sum())
    return c, p


def power(dof: int, n_used: int, alpha: float, tv: float = TV) -> float:
    """Asymptotic power, at least, of a G-test of ``dof`` degrees of freedom over ``n_used``
    samples at ``alpha`` against every alternative at total variation >= ``tv`` (module
    docstring); 0 without a degree of freedom (one bin is never evidence)."""
    if dof < 1:
        return 0.0
    from scipy import stats as sps

    return float(sps.ncx2.sf(sps.chi2.ppf(1 - alpha, dof), dof, 4 * tv * tv * n_used))


@dataclass
class PositionTest:
    """One position's test: ``what`` (the check), ``verdict``, ``dof``, ``n_used``, ``power``."""

    what: str
    verdict: Comparison
    dof: int
    n_used: int
    power: float

    def summary(self) -> str:
        return (f"{self.what}: G = {self.verdict.error:.4g} vs {self.verdict.bound:.4g}, {self.dof} dof, "
                f"{self.n_used} samples in bins used, power {self.power:.3f} against TV {TV:g}")


def position_test(groups: list, alpha: float, what: str) -> PositionTest:
    """The product-multinomial G-test of ``groups``, a list of (counts (V,), probs (V,)), at
    ``alpha``: a count in a zero-probability category fails outright, else G = Σ 2 O ln(O/E)
    over every group's pooled bins against chi-square(Σ (bins - 1)) (module docstring)."""
    from scipy import stats as sps

    g = impossible = 0.0
    dof = n_used = 0
    worst = ""
    for counts, probs in groups:
        n = int(counts.sum())
        bad = counts[probs == 0].sum()
        if bad:
            impossible += bad
            k = int(np.flatnonzero((probs == 0) & (counts > 0))[0])
            worst = worst or f"outcome {k}: observed {int(counts[k])} vs expected 0"
        c, p = pooled(counts[probs > 0], probs[probs > 0] / probs[probs > 0].sum(), n)
        if len(c) < 2:
            continue
        e = n * p
        with np.errstate(divide="ignore", invalid="ignore"):
            g += 2.0 * float(np.where(c > 0, c * np.log(c / e), 0.0).sum())
        dof, n_used = dof + len(c) - 1, n_used + n
    pw = power(dof, n_used, alpha)
    if impossible:
        v = Comparison(False, "statistical: zero-probability outcomes never occur", float(impossible), 0.0, what,
                    f"{int(impossible)} observations in zero-probability categories (e.g. {worst}); "
                    f"power {pw:.3f} against TV {TV:g}")
        return PositionTest(what, report_verdict(v), dof, n_used, pw)
    critical = float(sps.chi2.ppf(1 - alpha, dof)) if dof else float("inf")
    rule = (f"statistical: G-test({dof}) statistic <= {critical:.4g} (false-alarm rate alpha={alpha:.3g}, "
            f"product-multinomial over prefixes, {n_used} samples in bins of expected count >= {POOL_BELOW:g})")
    detail = f"power {pw:.3f} against every alternative at TV >= {TV:g} on the bins used (floor {POWER_FLOOR:g})"
    v = Comparison(not dof or g <= critical, rule, g, critical, what, detail)
    return PositionTest(what, report_verdict(v) if dof else v, dof, n_used, pw)


def position_name(i: int, temperature: float, top_p: float, method) -> str:
    after = "after the prompt" if i == 1 else f"given the engine's tokens 1..{i - 1}"
    return f"token {i} {after}, T={temperature:g}, top-p={top_p:g}, speculative={method}"


def sample(engine, prompts: tuple, seed: int, temperature: float, top_p: float, method) -> tuple:
    """(completions, requests per prompt, tokens per request): with a speculative ``method``,
    :data:`SAMPLES` (at ``temperature``) seeded requests of each prompt, :data:`NEW` tokens
    each, γ = :data:`GAMMA`; plain sampling (the control, no draft position) :data:`CONTROL_SAMPLES` of one token. One
    call (one request per call where the engine takes no batches)."""
    n, new = (SAMPLES.get(temperature, max(SAMPLES.values())), NEW) if method else (CONTROL_SAMPLES, 1)
    p = cases.params(temperature=temperature, top_p=top_p, speculative=method, num_speculative_tokens=GAMMA)
    reqs = [Request(pr, new, seed + n * j + i) for j, pr in enumerate(prompts) for i in range(n)]
    return cases.generate(engine, reqs, p), n, new


def check_sampled(engine, seed: int, temperature: float, top_p: float, method, alpha: float) -> tuple:
    """EN-3 (sampled) at one configuration: (position tests 1..NEW, or 1 for plain sampling, at
    ``alpha`` each; the engine's drafted-token evidence: the summed ``drafted`` or ``accepted``
    counts, None where it reports neither). Raises what the engine raises (NotImplementedError:
    a refusal)."""
    folder = cases.folders()["target"]
    prompts = contexts(folder, seed, temperature, top_p, method == "ngram")
    out, n, new = sample(engine, prompts, seed, temperature, top_p, method)
    V = cases.oracle(folder).cfg.vocab_size
    groups: list[list] = [[] for _ in range(new)]
    for j, pr in enumerate(prompts):
        toks = np.array([c.tokens[:new].tolist() for c in out[n * j:n * (j + 1)]])               # (n, new)
        prefixes = sorted({tuple(r[:new - 1]) for r in toks.tolist()})
        probs = conditionals(folder, pr, prefixes, temperature, top_p)                          # (k, new, V)
        for i in range(new):
            row, nxt = {}, {}
            for k, x in enumerate(prefixes):
                row.setdefault(x[:i], k)                  # p(token i + 1) depends on its first i ids only
            for r in toks.tolist():
                nxt.setdefault(tuple(r[:i]), []).append(r[i])
            groups[i] += [(np.bincount(t, minlength=V).astype(np.float64), probs[row[h], i]) for h, t in nxt.items()]
    tests = tuple(position_test(groups[i], alpha, position_name(i + 1, temperature, top_p, method))
                  for i in range(new))
    counts = [c.drafted if c.drafted is not None else c.accepted for c in out]
    drafted = None if all(x is None for x in counts) else sum(x or 0 for x in counts)
    return tests, drafted


@torch.no_grad()
def first_two_distribution(folder: str, prompt: tuple, temperature: float, top_p: float) -> np.ndarray:
    """(V·V,) float64: the target's processed distribution of the first two tokens after
    ``prompt``, p(t1) · p(t2 | t1), from one forward over every continuation t1."""
    model = cases.oracle(folder)
    V = model.cfg.vocab_size
    seqs = torch.cat([torch.tensor([list(prompt)]).expand(V, -1), torch.arange(V)[:, None]], 1)  # (V, S+1)
    logits = model(seqs)
    p1 = process_logits(logits[0, -2], temperature, 0, top_p)
    p2 = process_logits(logits[:, -1], temperature, 0, top_p)                                   # (V, V)
    return (p1[:, None] * p2).reshape(-1).numpy()


def judge(run, tests) -> None:
    """Fail on the first failing position test (its failure text states its power); a passing
    test under :data:`POWER_FLOOR` (one bin included) leaves its position unchecked, "not enough
    evidence", never pass (``run.uncheck``)."""
    for t in tests:
        t.verdict.check()
    for t in tests:
        if t.power < POWER_FLOOR:
            run.uncheck(t.what, f"power {t.power:.3f} under the floor {POWER_FLOOR:g} against TV {TV:g} "
                                f"({t.dof} dof, {t.n_used} samples in bins used)", thin=True)


def record_power(run) -> None:
    """The run's least position-test power, with every test's summary, in its result row."""
    powers = [pw for o in run.observations if isinstance(o, dict) for _, pw in o.get("power", ())]
    if powers:
        results.record("EN-3", measured=round(min(powers), 3), bound=POWER_FLOOR,
                       unit=f"least power of the sampled position tests against total variation {TV:g}",
                       rule="EN-3 sampled: a position test under the floor is not enough evidence",
                       tests=[t for o in run.observations if isinstance(o, dict) for t in o.get("tests", ())])
