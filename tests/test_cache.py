"""The experiment cache (conformance/cache.py) and the experiment sizes (conformance/sizes.py):
a result is reused only for the same inputs, a hit says so in its rows, a damaged entry is
recomputed with a warning, ``INFERENCE_CONFORMANCE_CACHE=off`` turns it off, and ``--full``
(``INFERENCE_CONFORMANCE_FULL``) switches every size at once."""
from __future__ import annotations

import json

import pytest

from inference_conformance.conformance import cache, results, sizes


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "experiments"))
    return tmp_path / "experiments"


def _run(name="exp", seed=0, size=10, params=None, value=None):
    """One cache.experiment call in a fresh recorder: (outcome, recorded figures, compute calls)."""
    calls = []

    def compute():
        calls.append(1)
        results.record("SD-3", measured=0.5, unit="fraction", what="arm A", documents=size)
        return value if value is not None else {"k": [1, 2], "t": (3, 4)}

    with results.recording(results.Recorder()) as rec:
        out = cache.experiment(name, compute, seed=seed, size=size, params=params)
    return out, rec.figures, len(calls)


def test_a_rerun_with_the_same_inputs_comes_from_the_cache_and_says_so(store):
    first, figs1, n1 = _run()
    second, figs2, n2 = _run()
    assert (n1, n2) == (1, 0)
    assert not first.cached and second.cached and first.key == second.key
    assert first.value == second.value == {"k": [1, 2], "t": [3, 4]}   # a miss gives back what a hit will
    assert figs1[0]["extra"].get("cached") is None
    assert figs2[0]["extra"]["cached"] is True and figs2[0]["extra"]["cached_at"] == first.computed
    assert figs2[0]["extra"]["what"] == "arm A (cached)" and figs2[0]["measured"] == 0.5
    assert [p.name for p in store.iterdir()] == [f"{first.key}.json"]


@pytest.mark.parametrize("change", [dict(seed=1), dict(size=11), dict(params={"gamma": 4}), dict(name="other")])
def test_a_changed_seed_size_parameter_or_name_is_computed_again(store, change):
    _run()
    out, _, n = _run(**change)
    assert n == 1 and not out.cached


def test_changed_source_or_versions_change_the_key(store, monkeypatch):
    k = cache.key("exp", seed=0, size=10)
    monkeypatch.setattr(cache, "suite_digest", lambda: "0" * 64)
    k_source = cache.key("exp", seed=0, size=10)
    monkeypatch.setattr(cache, "versions", lambda: {"python": "3.11", "torch": "0.0", "triton": None})
    assert len({k, k_source, cache.key("exp", seed=0, size=10)}) == 3


def test_the_suite_digest_covers_sources_and_checkpoints(tmp_path, monkeypatch):
    import inference_conformance as pkg

    (tmp_path / "conformance").mkdir()
    (tmp_path / "smallworld" / "checkpoints").mkdir(parents=True)
    src, ckpt = tmp_path / "conformance" / "x.py", tmp_path / "smallworld" / "checkpoints" / "target.safetensors"
    src.write_text("A = 1\n")
    ckpt.write_bytes(b"\0" * 8)
    monkeypatch.setattr(pkg, "__path__", [str(tmp_path)])
    digest = cache.suite_digest.__wrapped__
    d0 = digest()
    (tmp_path / "conformance" / "notes.txt").write_text("not code")
    assert digest() == d0
    ckpt.write_bytes(b"\1" * 8)
    d1 = digest()
    src.write_text("A = 2\n")
    assert len({d0, d1, digest()}) == 3


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"format": 1, "key": "another"}), "[]", ""])
def test_a_damaged_entry_is_recomputed_with_a_warning(store, damage):
    first, _, _ = _run()
    (store / f"{first.key}.json").write_text(damage)
    with pytest.warns(UserWarning, match="damaged"):
        out, _, n = _run()
    assert n == 1 and not out.cached
    again, _, n = _run()
    assert n == 0 and again.cached                     # rewritten whole


def test_off_computes_every_time_and_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.folder() is None
    assert [_run()[2] for _ in range(2)] == [1, 1]
    monkeypatch.delenv(cache.CACHE_ENV)
    assert cache.folder() == cache.DEFAULT_DIR.expanduser()


def test_writes_are_atomic(store, monkeypatch):
    """The entry is written through conformance/atomic.py (a temporary name and a rename)."""
    written = []
    real = cache.atomic.write_text
    monkeypatch.setattr(cache.atomic, "write_text", lambda p, text: written.append(p) or real(p, text))
    out, _, _ = _run()
    assert written == [store / f"{out.key}.json"]
    assert not [p for p in store.iterdir() if cache.atomic.is_partial(p)]


def test_bad_arguments_are_refused(store):
    with pytest.raises(TypeError, match="name"):
        cache.key("", seed=0, size=1)
    with pytest.raises(TypeError, match="params"):
        cache.key("exp", seed=0, size=1, params=[1])
    with pytest.raises(ValueError, match="JSON"):
        cache.key("exp", seed=object(), size=1)
    with pytest.raises(ValueError, match="JSON-able"):
        _run(value={"x": object()})
    assert not list(store.glob("*.json"))


def test_sizes_switch_together_under_full(monkeypatch):
    monkeypatch.delenv(sizes.FULL_ENV, raising=False)
    default = {n: sizes.size(n) for n in sizes.SIZES}
    monkeypatch.setenv(sizes.FULL_ENV, "1")
    full = {n: sizes.size(n) for n in sizes.SIZES}
    assert default == {n: s.default for n, s in sizes.SIZES.items()}
    assert full == {n: s.full for n, s in sizes.SIZES.items()}
    assert full["sd3_docs"] == 4000 and default["sd3_docs"] == 1000
    assert sizes.stated("sd3_docs") == "documents per arm: 4000 (full size; default: 1000)"
    assert set(full["sd9_gammas"]) == set(range(1, 9)) and max(default["sd9_gammas"]) == 8


def test_a_default_size_still_lets_each_verdict_fail():
    """SD-9's default γ set has draft lengths above 4 (its rule: the poor draft's best γ <= 4),
    and each default is no larger than its full size."""
    assert sum(g > 4 for g in sizes.SIZES["sd9_gammas"].default) >= 2
    for name, s in sizes.SIZES.items():
        if isinstance(s.default, int) and name != "sd3_margin":
            assert s.default <= s.full, name


def test_unknown_sizes_are_named():
    with pytest.raises(ValueError, match="sd3_docs"):
        sizes.size("sd3_doc")
    with pytest.raises(TypeError, match="name"):
        sizes.stated(3)
