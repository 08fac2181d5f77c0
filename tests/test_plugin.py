"""The suite used from another project's CI: the installed pytest plugin adds --impl, and
``pytest --pyargs inference_conformance.properties --impl attention=mod:fn`` runs the conformance properties from a
directory outside this checkout (its own ini, no conftest of the suite). A conforming kernel
passes, a wrong one fails, a hanging one fails its test by timeout, and a crashing one (under
pytest-xdist) fails its test while the run goes on. Also: the generic contract checks reject
the classic bad functions (mutating an input, leaving an output buffer unwritten, unrepeatable).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance import registry
from inference_conformance.conformance.results import read_rows
from inference_conformance.properties import generic_cases as generic

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FAST = "test_fa3_noncontiguous_inputs"

HANG = "import time\ndef attention(q, k, v, *, causal, scale):\n    time.sleep(120)\n"
CRASH = "import os\ndef attention(q, k, v, *, causal, scale):\n    os.abort()\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A kernel project's checkout: outside the suite, with its own pytest configuration."""
    if not (ROOT / "properties" / "attention" / "test_attention.py").exists() or not (EXAMPLES / "my_attention.py").exists():
        pytest.skip("the attention properties or examples/my_attention.py are not in this checkout")
    d = tmp_path_factory.mktemp("kernel_project")
    (d / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-ra"\ntestpaths = ["tests"]\n')
    (d / "hang_kernel.py").write_text(HANG)
    (d / "crash_kernel.py").write_text(CRASH)
    return d


def _pytest(project: Path, *args: str, timeout: int = 240, laws: str = "inference_conformance.properties") -> subprocess.CompletedProcess:
    """pytest --pyargs ``laws`` (the package, or one law module where the whole package's
    collection would only be deselected) from ``project``."""
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT), str(project), str(EXAMPLES)]))
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", laws, "-p", "no:cacheprovider", "-q",
           "--device=cpu", *args]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=timeout)


def test_conforming_kernel_passes_and_wrong_one_fails_from_another_project(project):
    r = _pytest(project, "--impl", "attention=my_attention:attention", "--impl", "attention=my_attention:wrong_attention",
                "-k", FAST)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 failed, 1 passed" in r.stdout, r.stdout[-3000:]
    failures = r.stdout.split(" conformance failures: ")[-1].splitlines()     # one line per failing law
    assert len(failures) == 3 and "FA-3 test_fa3_noncontiguous_inputs [my_attention:wrong_attention]: 1 failed" \
        in failures[1], r.stdout[-3000:]
    table = r.stdout.split("conformance verdicts")[-1].splitlines()
    header, row = table[1], table[2]
    assert header.split() == ["my_attention:attention", "my_attention:wrong_attention"], header
    assert max(map(len, table[1:3])) <= 100, table
    good, bad = row.split()[-2:]
    assert good == "pass" and bad.startswith("fail(") and ">" in bad, row   # the failure's error > bound


def test_hanging_kernel_fails_its_test_by_timeout(project):
    r = _pytest(project, "--impl", "attention=hang_kernel:attention", "--impl-timeout=3", "-k", FAST, timeout=60,
                laws="inference_conformance.properties.attention.test_attention")
    assert r.returncode == 1, r.stdout[-3000:]
    assert "Timeout" in r.stdout and "1 failed" in r.stdout


def test_crashing_kernel_fails_its_test_not_the_run(project, tmp_path):
    rows = tmp_path / "rows"
    r = _pytest(project, "--impl", "attention=crash_kernel:attention", "-n", "1", f"--results={rows}", "-k",
                f"{FAST} or (test_fa3_matches_float64_reference and float32)", timeout=180,
                laws="inference_conformance.properties.attention")
    assert r.returncode == 1, r.stdout[-3000:]
    assert "crashed" in r.stdout and "2 failed" in r.stdout, r.stdout[-3000:]   # the second test still ran
    errors = [x for x in read_rows(rows) if x.verdict == "error" and "crashed" in x.message]
    assert len(errors) == 2


def test_unknown_technique_is_a_usage_error():
    with pytest.raises(ValueError, match="unknown technique"):
        registry.parse_impl_option(["nosuch=mod:fn"])
    with pytest.raises(ValueError, match="module:attr"):
        registry.parse_impl_option(["attention"])


def test_implementation_repr_is_short():
    """Hypothesis prints an implementation in every falsifying example: technique and name only."""
    impl = registry.load("speculative", "torch", "inference_conformance.optimized.speculative:verify", "builtin")
    assert repr(impl) == "Implementation('speculative', 'torch')"


# --- the generic contract checks on toy functions ------------------------------------------


def _x():
    return torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7


def test_generic_checks_accept_a_good_function():
    good = lambda x, *, out=None: torch.softmax(x, -1) if out is None else out.copy_(torch.softmax(x, -1))  # noqa: E731
    generic.check_inputs_not_mutated(good, (_x(),), {})
    generic.check_output_fully_written(good, (_x(),), {"out": torch.empty(3, 4)})
    generic.check_output_fully_written(good, (_x(),), {}, oracle=good)
    generic.check_repeatable(good, (_x(),), {})


def test_generic_checks_reject_bad_functions():
    def mutates(x):
        return x.mul_(2)

    def half_written(x, *, out):
        out[:, :2] = x[:, :2]
        return out

    def unrepeatable(x):
        return x + torch.rand(())

    def overflows(x):
        return torch.exp(x * 1e3)

    with pytest.raises(AssertionError, match="must not be mutated"):
        generic.check_inputs_not_mutated(mutates, (_x(),), {})
    with pytest.raises(AssertionError, match="not written"):
        generic.check_output_fully_written(half_written, (_x(),), {"out": torch.empty(3, 4)})
    with pytest.raises(AssertionError, match="not finite"):
        generic.check_output_fully_written(overflows, (_x(),), {}, oracle=lambda x: torch.softmax(x, -1))
    with pytest.raises(AssertionError, match="repeatable"):
        generic.check_repeatable(unrepeatable, (_x(),), {})


def test_repeatable_reads_an_implementations_own_object_of_numpy_arrays():
    """A quantized weight that is a dict of numpy arrays (the contract lets the implementation
    choose) is compared array by array, never with ``==`` (numpy's ambiguous truth value)."""
    import numpy as np

    def quantize(w):
        s = np.float32(np.abs(w.numpy()).max() / 127)
        return {"codes": np.round(w.numpy() / s).astype(np.int8), "scale": s}

    generic.check_repeatable(quantize, (_x(),), {})
    drift = iter([0, 1])
    with pytest.raises(AssertionError, match="repeatable"):
        generic.check_repeatable(lambda w: {"codes": np.full(3, next(drift), dtype=np.int8)}, (_x(),), {})


# --- outside adapters, against stand-ins that implement each library's documented layout ----


def _ref_bthd(q, k, v, causal, scale):
    from inference_conformance.reference.attention import attention as ref

    return ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, scale=scale).transpose(1, 2)


def _paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                        block_size, max_seq_len, alibi, kv_dtype, k_scale, v_scale):
    """vLLM's layout: key_cache (blocks, Hkv, D/x, block, x), value_cache (blocks, Hkv, D, block)."""
    from inference_conformance.reference.attention import attention as ref

    B, Hq, D = query.shape
    for b in range(B):
        T = int(seq_lens[b])
        t = torch.arange(T)
        blk = block_tables[b][t // block_size].long()
        k = key_cache[blk, :, :, t % block_size, :].permute(1, 0, 2, 3).reshape(num_kv_heads, T, D)  # (Hkv, T, D)
        v = value_cache[blk, :, :, t % block_size].permute(1, 0, 2)                                   # (Hkv, T, D)
        out[b] = ref(query[b][None, :, None], k[None], v[None], causal=False, scale=scale)[0, :, 0]


class _FlashInferPagedDecode:
    """FlashInfer's documented batch decode over NHD pages (num_pages, page_size, Hkv, D): a
    sequence's pages are indices[indptr[b]:indptr[b+1]], its last page holds last_page_len tokens."""

    def __init__(self, workspace, kv_layout):
        assert kv_layout == "NHD"

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             sm_scale, q_data_type):
        self.args = (indptr, indices, last_page_len, page_size, sm_scale)

    def run(self, q, kv):
        from inference_conformance.reference.attention import attention as ref

        indptr, indices, last, page_size, scale = self.args
        k_pages, v_pages = kv
        outs = []
        for b in range(q.shape[0]):
            pages = indices[int(indptr[b]):int(indptr[b + 1])].long()
            T = (len(pages) - 1) * page_size + int(last[b])
            k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:T].transpose(0, 1)  # (Hkv, T, D)
            v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:T].transpose(0, 1)
            outs.append(ref(q[b][None, :, None], k[None], v[None], causal=False, scale=scale)[0, :, 0])
        return torch.stack(outs)


@pytest.fixture
def stand_ins(monkeypatch):
    import types

    from inference_conformance.optimized.attention import outside_kernels as dense
    from inference_conformance.optimized.paged_attention import outside_kernels as paged

    fa = types.ModuleType("flash_attn")
    fa.__version__ = "2.6.3"
    fa.flash_attn_func = lambda q, k, v, dropout_p, softmax_scale, causal: _ref_bthd(q, k, v, causal, softmax_scale)
    fi = types.ModuleType("flashinfer")
    fi.single_prefill_with_kv_cache = lambda q, k, v, causal, kv_layout, sm_scale: _ref_bthd(
        q[None], k[None], v[None], causal, sm_scale)[0]
    fi.BatchDecodeWithPagedKVCacheWrapper = _FlashInferPagedDecode
    ops = types.ModuleType("vllm._custom_ops")
    ops.paged_attention_v1 = _paged_attention_v1
    for name, mod in (("flash_attn", fa), ("flashinfer", fi), ("vllm._custom_ops", ops)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(dense, "_need", lambda *a, **k: None)  # the stand-ins run on the CPU
    return types.SimpleNamespace(flash_attn=dense.flash_attn, flashinfer=dense.flashinfer,
                                 vllm_paged=paged.vllm_paged, flashinfer_paged=paged.flashinfer_paged)


@pytest.mark.parametrize("name,Tq,Hq,Hkv,Tk,D,causal", [("flash_attn", 3, 4, 2, 17, 16, True),
                                                         ("flashinfer", 5, 3, 1, 9, 64, True)])
def test_outside_adapters_translate_the_contract(stand_ins, name, Tq, Hq, Hkv, Tk, D, causal):
    from inference_conformance.conformance import tolerance
    from inference_conformance.properties.strategies import randn
    from inference_conformance.reference.attention import attention as ref

    q, k, v = (randn(s, seed) for s, seed in (((2, Hq, Tq, D), 1), ((2, Hkv, Tk, D), 2), ((2, Hkv, Tk, D), 3)))
    out = getattr(stand_ins, name)(q, k, v, causal=causal, scale=D ** -0.5)
    tolerance.assert_close(out, ref(q, k, v, causal=causal, scale=D ** -0.5))


@pytest.mark.parametrize("name", ["vllm_paged", "flashinfer_paged"])
def test_outside_paged_adapters_translate_the_contract(stand_ins, name):
    """A block table over a shuffled pool, a partial last block, NaN in every unused slot and
    out-of-range entries past the live blocks: the adapters must hand the library only what the
    contract says is live."""
    from inference_conformance.conformance import tolerance
    from inference_conformance.properties.strategies import randn
    from inference_conformance.reference.paged_attention import paged_attention as ref

    B, Hq, Hkv, D, bs, nb = 2, 4, 2, 64, 16, 12
    lens = torch.tensor([37, 5], dtype=torch.int32)
    k_cache = torch.full((nb, bs, Hkv, D), float("nan"), dtype=torch.float64)
    v_cache = torch.full_like(k_cache, float("nan"))
    table = torch.full((B, 4), 10 ** 6, dtype=torch.int32)                # past the live blocks: out of range
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(0))
    used = 0
    for b, T in enumerate(lens.tolist()):
        n = -(-T // bs)
        table[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
        for i in range(n):
            t = min(bs, T - i * bs)
            k_cache[table[b, i], :t] = randn((t, Hkv, D), 10 * b + i)
            v_cache[table[b, i], :t] = randn((t, Hkv, D), 100 + 10 * b + i)
    q = randn((B, Hq, D), 7)
    out = getattr(stand_ins, name)(q, k_cache, v_cache, table, lens, scale=D ** -0.5)
    tolerance.assert_close(out, ref(q, k_cache, v_cache, table, lens, scale=D ** -0.5))


def test_outside_adapters_available_only_when_importable(monkeypatch):
    from inference_conformance.conformance import registry

    monkeypatch.setattr(registry, "importable", lambda m: m == "flash_attn")
    impls = {i.name: i for i in registry.builtins("attention", "cuda")}
    assert impls["flash_attn"].unavailable is None
    assert "'flashinfer' package" in impls["flashinfer"].unavailable
    paged = {i.name: i for i in registry.builtins("paged_attention", "cuda")}
    assert "'vllm' package" in paged["vllm"].unavailable
    assert "'flashinfer' package" in paged["flashinfer"].unavailable
    on_cpu = {i.name: i for i in registry.builtins("attention", "cpu")}
    assert "runs on ['cuda']" in on_cpu["flash_attn"].unavailable
