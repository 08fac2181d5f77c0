"""Expectation files: the known failures of one implementation, checked in beside the code that
uses the suite, so that a CI run is green while nothing new breaks (``pytest --expect PATH``).

One TOML file per implementation::

    [implementation]
    name = "my_pkg.attention:attention"     # as the result rows name it (an --impl target)
    technique = "attention"                 # optional

    [tests."test_fa3_production_shapes[my_pkg.attention:attention-llama-bfloat16]"]
    expected = "fail"                       # "fail" | "unsupported" | "partial"
    reason = "bfloat16 accumulation in the PV product"
    measured = "max abs error 0.31 > bound 0.0625"   # the error text seen (optional)
    link = "https://example.org/issue/12"           # optional

A key is a test id: the law's function name with its parameters, as pytest prints it. ``*`` and
``?`` are wildcards (brackets are literal); a bare law name (no parameters) covers all of its
parameters, and an entry's optional ``dtype`` narrows it to one dtype. A damaged file raises
ValueError naming the file, the entry and the field.

A ``fail`` entry names the failure it expects, its signature (what ``expect update`` writes)::

    exception = "AssertionError"    # a failed check; any other type names a crash (RuntimeError, ...)
    check = "attention output"      # what the failing comparison judged (or a failed assert's first words)
    rule = "bfloat16"               # the tolerance rule of that comparison
    error = [0.15, 0.62]            # band [low, high] of its measured error, in the output's units

A ``fail`` entry with ``intermittent = true`` lists a race: the test fails in some runs and
passes in others (a failure that depends on how requests overlap in a server). A failure must
still match the signature; a pass is a pass (said to be one of an intermittent entry), never an
unexpected pass, and ``expect update`` keeps the entry (wptrunner's intermittent statuses).

A failure of the listed test outside its signature (another check or rule, an error outside
the band, another exception type: a crash) is a new failure, never an expected one. An entry
without signature fields expects a failed check only (``exception = "AssertionError"``): a
crash under it is still a new failure. An entry whose key is wildcards alone (``*``) with the band
``[0, inf]`` expects every failure of every test: it is accepted with an
:class:`ExpectationWarning` (:func:`lax`). A listed failure that ends "unsupported" or skipped in
its test (not for want of its package) is a stale entry, failed like an unexpected pass unless
``--allow-unexpected-pass``.

A file whose ``technique`` is set covers only that technique's implementation of that name (the
built-ins' names repeat across techniques: "torch" is an attention, a KV cache, a quantization
and a verifier). The suite's own files, for its built-ins, are in the repository's
``expectations/`` folder (:data:`BUILTIN`): the plugin applies them to built-in implementations
in every run, so that a run of the whole suite is green while each known finding still fails
and an unexpected pass still fails the run.
"""
from __future__ import annotations

import importlib.resources
import math
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the oldest stack
    import tomli as tomllib

from inference_conformance.conformance.outcomes import LISTED, Outcome

#: what an entry may list (its ``expected``): the outcomes' words :data:`inference_conformance.conformance.outcomes.LISTED`
EXPECTED = LISTED
#: The suite's own expectation files (one per built-in that fails something today).
#: Package data, found through importlib.resources (an installed wheel, an editable install or the checkout).
BUILTIN = Path(str(importlib.resources.files("inference_conformance.expectations")))
_TEXT_FIELDS = {"expected", "reason", "measured", "link", "dtype", "exception", "check", "rule"}
#: the fields of a fail entry's signature (:meth:`Entry.admits`)
SIGNATURE = ("exception", "check", "rule", "error")
_ENTRY_FIELDS = _TEXT_FIELDS | {"error", "intermittent"}
#: the band ``expect update`` writes around a measured error: [error / BAND, error * BAND]
BAND = 2.0
_IMPL_FIELDS = {"name", "target", "technique"}


@dataclass(frozen=True)
class Entry:
    """One expected outcome: ``key`` (a test id pattern), ``expected``, ``reason``, ``measured``,
    ``link``, ``dtype`` ("" for any), ``source`` (the file it came from), and for a "fail" entry
    its signature: ``exception`` (type name), ``check``, ``rule`` ("" for any) and ``error``
    (``(low, high)`` band of the measured error, or None for any), and ``intermittent`` (it
    may pass: a race)."""

    key: str
    expected: str
    reason: str = ""
    measured: str = ""
    link: str = ""
    dtype: str = ""
    source: str = ""
    exception: str = ""
    check: str = ""
    rule: str = ""
    error: tuple | None = None
    intermittent: bool = False

    @property
    def signed(self) -> bool:
        """Whether the entry names its failure (any signature field set)."""
        return bool(self.exception or self.check or self.rule or self.error is not None)

    def signature(self) -> str:
        """The signature in words ("AssertionError of 'attention output' under rule bfloat16
        with error in [0.031, 3.1]")."""
        text = self.exception or "AssertionError"
        text += f" of {self.check!r}" if self.check else ""
        text += f" under rule {self.rule}" if self.rule else ""
        if self.error is not None:
            text += f" with error in [{self.error[0]:.3g}, {self.error[1]:.3g}]"
        return text

    def admits(self, kind: dict) -> str:
        """"" when the failure ``kind`` (:func:`inference_conformance.conformance.failures.failure_kind`:
        exception, check, rule, error) is within this entry's signature, else the first difference
        in words. An unsigned entry admits any failed check (an AssertionError), no crash."""
        want = self.exception or "AssertionError"
        if want not in kind.get("mro", (kind.get("exception", ""),)):
            return f"raised {kind.get('exception')}, expected {want}"
        if self.check and kind.get("check", "") != self.check:
            return f"failed check {kind.get('check', '')!r}, expected {self.check!r}"
        if self.rule and kind.get("rule", "") != self.rule:
            return f"under rule {kind.get('rule') or '(none)'}, expected rule {self.rule}"
        if self.error is not None:
            error = kind.get("error")
            if error is None:
                return "no measured error, expected one in the band"
            if not self.error[0] <= error <= self.error[1]:
                return f"measured error {error:.3g} outside the band [{self.error[0]:.3g}, {self.error[1]:.3g}]"
        return ""

    def matches(self, test_name: str, law: str = "", dtype: str = "") -> bool:
        if self.dtype and self.dtype != dtype:
            return False
        if law and self.key == law:
            return True
        return _pattern(self.key).fullmatch(test_name) is not None


@dataclass
class Expectations:
    """One implementation's expectations: ``name`` (as rows name it), ``target``, ``technique``,
    ``entries`` (key -> :class:`Entry`), ``source`` (the file)."""

    name: str
    target: str = ""
    technique: str = ""
    entries: dict[str, Entry] = field(default_factory=dict)
    source: str = ""

    def covers(self, impl_name: str, impl_target: str = "", technique: str = "") -> bool:
        if self.technique and technique and self.technique != technique:
            return False
        return impl_name in (self.name, self.target) or bool(impl_target and impl_target in (self.name, self.target))

    def find(self, test_name: str, law: str = "", dtype: str = "") -> Entry | None:
        """The entry for a test: an exact key first, then the first pattern that matches."""
        hit = self.entries.get(test_name)
        if hit is not None and hit.matches(test_name, law, dtype):
            return hit
        return next((e for e in self.entries.values() if e.matches(test_name, law, dtype)), None)


def _pattern(key: str) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in key))


def parse(text: str, source: str = "<string>") -> Expectations:
    """One expectation file's text; ValueError naming ``source``, the entry and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    impl = data.get("implementation")
    if not isinstance(impl, dict):
        raise ValueError(f"{source}: missing [implementation] table (name = \"<implementation>\")")
    unknown = set(data) - {"implementation", "tests"}
    if unknown:
        raise ValueError(f"{source}: unknown table(s) {sorted(unknown)}; expected [implementation] and [tests.\"<test id>\"]")
    bad = set(impl) - _IMPL_FIELDS
    if bad:
        raise ValueError(f"{source}: [implementation]: unknown field(s) {sorted(bad)}; known: {sorted(_IMPL_FIELDS)}")
    for key in _IMPL_FIELDS & set(impl):
        if not isinstance(impl[key], str):
            raise ValueError(f"{source}: [implementation]: field {key!r} must be a string, got {impl[key]!r}")
    if not impl.get("name"):
        raise ValueError(f"{source}: [implementation]: field 'name' is missing or empty")
    tests = data.get("tests", {})
    if not isinstance(tests, dict):
        raise ValueError(f"{source}: 'tests' must be a table of [tests.\"<test id>\"] entries")
    out = Expectations(name=impl["name"], target=impl.get("target", ""), technique=impl.get("technique", ""),
                       source=source)
    for key, entry in tests.items():
        where = f"{source}: entry {key!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be a table (expected = ..., reason = ...), got {entry!r}")
        bad = set(entry) - _ENTRY_FIELDS
        if bad:
            raise ValueError(f"{where}: unknown field(s) {sorted(bad)}; known: {sorted(_ENTRY_FIELDS)}")
        if "expected" not in entry:
            raise ValueError(f"{where}: field 'expected' is missing (one of {', '.join(EXPECTED)})")
        if entry["expected"] not in EXPECTED:
            raise ValueError(f"{where}: field 'expected' is {entry['expected']!r}; must be one of {', '.join(EXPECTED)}")
        if "reason" not in entry:
            raise ValueError(f"{where}: field 'reason' is missing (say why it is expected)")
        for name in _TEXT_FIELDS & set(entry):
            if not isinstance(entry[name], str):
                raise ValueError(f"{where}: field {name!r} must be a string, got {entry[name]!r}")
        signed = [name for name in SIGNATURE if name in entry]
        if signed and not Outcome.of(entry["expected"]).fails_law:
            raise ValueError(f"{where}: field {signed[0]!r} names a failure's signature; only an entry with "
                             f"expected = \"fail\" has one (this one is {entry['expected']!r})")
        if "intermittent" in entry and not isinstance(entry["intermittent"], bool):
            raise ValueError(f"{where}: field 'intermittent' must be true or false, got {entry['intermittent']!r}")
        if entry.get("intermittent") and not Outcome.of(entry["expected"]).fails_law:
            raise ValueError(f"{where}: field 'intermittent' marks a failure that sometimes passes; only an entry "
                             f"with expected = \"fail\" has one (this one is {entry['expected']!r})")
        if "exception" in entry and not entry["exception"].isidentifier():
            raise ValueError(f"{where}: field 'exception' must be an exception's type name "
                             f"(AssertionError, RuntimeError, ...), got {entry['exception']!r}")
        if "error" in entry:
            entry = dict(entry, error=_band(entry["error"], where))
        out.entries[key] = Entry(key=key, source=source, **entry)
        if lax(out.entries[key]):
            warnings.warn(ExpectationWarning(f"{where}: {lax(out.entries[key])}"), stacklevel=2)
    return out


class ExpectationWarning(UserWarning):
    """An expectation entry that expects (nearly) anything: accepted, and said."""


def lax(entry: Entry) -> str:
    """Why ``entry`` expects any failure of any test ("" when it does not): a key of wildcards
    alone (every test of its implementation) with an error band from 0 to inf (any measured
    error)."""
    if entry.key and set(entry.key) <= {"*", "?"} and "*" in entry.key and entry.error == (0.0, math.inf):
        return (f"the error band [0, inf] on {entry.key!r} expects the failure of every test of the implementation "
                "with any measured error: name the tests, or a band around the error measured")
    return ""


def _band(value, where: str) -> tuple[float, float]:
    """A signature's error band: two numbers, low <= high (inf allowed: a NaN error counts as inf)."""
    ok = isinstance(value, list) and len(value) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x) for x in value)
    if not ok or value[0] > value[1] or value[0] < 0:
        raise ValueError(f"{where}: field 'error' must be a band [low, high] of two numbers, 0 <= low <= high "
                         f"(inf allowed), got {value!r}")
    return float(value[0]), float(value[1])


def band(error: float) -> tuple[float, float]:
    """The band ``expect update`` writes around a measured ``error``: one :data:`BAND` factor
    either side, to three significant digits; [inf, inf] for an infinite (or NaN) error."""
    if math.isinf(error) or math.isnan(error):
        return math.inf, math.inf
    return float(f"{error / BAND:.3g}"), float(f"{error * BAND:.3g}")


def load(paths) -> list[Expectations]:
    """The expectation files at ``paths`` (files, or folders of ``*.toml``; a file named twice is
    read once); files of the same implementation (name and technique) are merged, and one test
    listed twice for it is a ValueError."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.toml"))
        elif p.is_file():
            found = [p]
        else:
            raise ValueError(f"{p}: no such expectation file or folder")
        files += [f for f in found if f.resolve() not in {g.resolve() for g in files}]
    merged: dict[tuple[str, str], Expectations] = {}
    for f in files:
        exp = parse(f.read_text(encoding="utf-8"), str(f))
        have = merged.get((exp.name, exp.technique))
        if have is None:
            merged[(exp.name, exp.technique)] = exp
            continue
        for key, e in exp.entries.items():
            if key in have.entries:
                raise ValueError(f"{f}: entry {key!r} for {exp.name!r} is listed in {have.entries[key].source} too")
            have.entries[key] = e
    return list(merged.values())


def lookup(loaded: list[Expectations], impl_name: str, test_name: str, law: str = "", dtype: str = "",
           impl_target: str = "", technique: str = "") -> Entry | None:
    """The expectation for one test of one implementation (of ``technique``, where given), or None."""
    for exp in loaded:
        if exp.covers(impl_name, impl_target, technique):
            hit = exp.find(test_name, law, dtype)
            if hit is not None:
                return hit
    return None


def _string(s: str) -> str:
    out = []
    for c in s:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _float(x: float) -> str:
    return "inf" if math.isinf(x) else repr(float(x))


def dumps(exp: Expectations, header: str = "") -> str:
    """The TOML text of ``exp`` (:func:`parse` reads it back unchanged); entries sorted by key."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += ["[implementation]", f"name = {_string(exp.name)}"]
    if exp.target and exp.target != exp.name:
        lines.append(f"target = {_string(exp.target)}")
    if exp.technique:
        lines.append(f"technique = {_string(exp.technique)}")
    for key in sorted(exp.entries):
        e = exp.entries[key]
        lines += ["", f"[tests.{_string(key)}]", f"expected = {_string(e.expected)}", f"reason = {_string(e.reason)}"]
        if e.intermittent:
            lines.append("intermittent = true")
        for name in ("measured", "link", "dtype", "exception", "check", "rule"):
            if getattr(e, name):
                lines.append(f"{name} = {_string(getattr(e, name))}")
        if e.error is not None:
            lines.append(f"error = [{_float(e.error[0])}, {_float(e.error[1])}]")
    return "\n".join(lines) + "\n"

