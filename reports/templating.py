"""The Jinja2 environments of the report's templates (``reports/templates/``, shipped as package
data and loaded through the package, :class:`jinja2.PackageLoader`): HTML (escaped) and Markdown
(``md`` escapes a table cell), shared by the report (:mod:`inference_conformance.reports.build`)
and the conformance matrix (:mod:`inference_conformance.reports.merge`)."""
from __future__ import annotations

PACKAGE, FOLDER = "inference_conformance.reports", "templates"


def _md_cell(s) -> str:
    return str(s or "").replace("|", "\\|").replace("\n", " ")


def _env(**options):
    import jinja2

    e = jinja2.Environment(loader=jinja2.PackageLoader(PACKAGE, FOLDER), keep_trailing_newline=True, **options)
    e.filters["md"] = _md_cell
    return e


def html_env():
    """The HTML templates' environment: autoescaped."""
    import jinja2

    return _env(autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=False, lstrip_blocks=False)


def md_env():
    """The Markdown templates' environment: not escaped (``md`` escapes table cells)."""
    return _env(autoescape=False)
