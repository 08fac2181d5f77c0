"""The Jinja2 environments of the report's templates (``reports/templates/``): HTML (escaped)
and Markdown (``md`` escapes a table cell), shared by the report (:mod:`inference_conformance.reports.build`) and the
conformance matrix (:mod:`inference_conformance.reports.merge`)."""
from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"


def _md_cell(s) -> str:
    return str(s or "").replace("|", "\\|").replace("\n", " ")


def html_env():
    import jinja2

    e = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=jinja2.select_autoescape(["html", "j2"]),
                           trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)
    e.filters["md"] = _md_cell
    return e


def md_env():
    import jinja2

    e = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=False, keep_trailing_newline=True)
    e.filters["md"] = _md_cell
    return e
