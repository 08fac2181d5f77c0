"""A law declares the names of its tests, and the plugin collects the laws of
``properties/<technique>/laws.py`` (or its ``laws/`` package) as those tests, once, in the module
that declared them; the kernel laws' body is one template (``properties/kernel_law.py``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.plugin_collect import is_laws_file
from inference_conformance.properties.kernel_law import kernel_law
from inference_conformance.properties.quantization.laws import integer, kernels

ROOT = Path(__file__).resolve().parents[1]


def _body(run, device, dtype, case, seed):
    """A body."""


def test_a_law_names_one_zoo_test_per_kills():
    with pytest.raises(ValueError, match="zoo_tests names 1 tests, kills declares 2"):
        Law(claim="FA-3", technique="attention", body=_body, kills=(Kills(("a",)), Kills(("b",))),
            zoo_tests=("test_one",))
    law = Law(claim="FA-3", technique="attention", body=_body, kills=(Kills(("a",), (torch.float64,)),),
              test="test_x", zoo_tests=("test_x_zoo",))
    assert [name for name, _ in law.tests()] == ["test_x", "test_x_zoo"]
    assert law.home == __name__                       # where it is collected: the module that declared it


def test_a_variant_declares_no_tests_and_is_homed_where_it_is_made():
    assert integer.QT9.test and integer.QT9.home.endswith("quantization.laws.integer")
    variant = integer.QT9.with_examples(integer.QT9.examples[:1])
    assert variant.test == "" and variant.zoo_tests == () and variant.tests() == []
    assert kernels.QT9_BOTH_LAUNCHES.home.endswith("quantization.laws.kernels")
    assert [n for n, _ in kernels.QT9_BOTH_LAUNCHES.tests()] == ["test_qt9_decode_and_tiled_launches"]


def test_laws_files_are_found_by_their_path():
    assert is_laws_file("properties/attention/laws.py") and is_laws_file("properties/quantization/laws/fp8.py")
    assert not is_laws_file("properties/attention/cases.py") and not is_laws_file("properties/attention/laws.txt")


def test_the_kernel_law_template_names_bad_arguments():
    with pytest.raises(TypeError, match="name"):
        kernel_law(3, "doc", inputs=print, call=print, check=print)
    for arg in ("inputs", "call", "check", "fit", "before"):
        kw = {**dict(inputs=print, call=print, check=print), arg: "not callable"}
        with pytest.raises(TypeError, match=arg):
            kernel_law("law_x", "doc", **kw)
    body = kernel_law("law_x", "The doc.", inputs=print, call=print, check=print)
    assert (body.__name__, body.__doc__, body.__module__) == ("law_x", "The doc.", __name__)


def test_each_law_is_collected_once_in_its_home():
    """QT-9 is imported into kernels.py (its launch variant's base): collected in integer.py only."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "properties/quantization/laws", "-k", "test_qt9_zoo_rejected or test_qt9_decode_and"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert ids and len(ids) == len(set(i.split("::")[-1] for i in ids)), ids
    assert all(i.startswith("properties/quantization/laws/integer.py::test_qt9_zoo_rejected")
               or i.startswith("properties/quantization/laws/kernels.py::test_qt9_decode_and_tiled_launches")
               for i in ids), ids
