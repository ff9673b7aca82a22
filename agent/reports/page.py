"""The HTML scaffold of a report: number formatting, tables, the page with its style, and the
atomic writer (temporary file in the target directory, then rename: never a half-written file)."""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["fmt", "page", "table", "write_atomic"]

_STYLE = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328;max-width:820px}"
    "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d0d7de;padding:3px 6px;"
    "text-align:right;font-size:12px}th{background:#f6f8fa}svg{display:block;margin:12px 0}"
    "svg text{font-size:11px;fill:#1f2328}svg .t{font-size:13px;font-weight:600}"
    ".frame{fill:none;stroke:#d0d7de}.grid{stroke:#eaeef2}.state{font-size:20px;font-weight:700}"
)


def fmt(v: Any, digits: int = 3) -> str:
    """A table cell: floats with thousands separators, ``-`` for None, everything escaped."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if not math.isfinite(v) else f"{v:,.{digits}f}"
    return html.escape(str(v))


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, sections: Sequence[str]) -> str:
    """A complete HTML document holding ``sections`` (HTML fragments) in order."""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>\n"
    )


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
