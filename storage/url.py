"""Database URLs: resolution of the embedded default, validation, and masking of secrets.

The embedded default is the SQLite file ``<data_dir>/tradeagent.db``; any other URL comes
from ``StorageConfig.url`` (or ``TRADEAGENT_DB_URL``). Supported dialects are SQLite and
PostgreSQL (through psycopg 3: ``postgresql://`` and ``postgres://`` are read as
``postgresql+psycopg://``). A password in a URL never reaches a message or a log line:
:func:`display_url` renders a parsed URL with ``***`` and :func:`mask_secrets` hides the
password of any URL-looking text (used on input that could not even be parsed).
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from storage.config import StorageConfig
from storage.errors import InvalidDatabaseURL

__all__ = ["EMBEDDED_FILE", "display_url", "is_embedded", "mask_secrets", "parse_url", "resolve_url"]

EMBEDDED_FILE = "tradeagent.db"
"""File name of the embedded SQLite database inside the data directory."""

_SUPPORTED = {"sqlite": ("pysqlite",), "postgresql": ("psycopg",)}
# user info up to the last "@" of the token: a malformed password may itself contain "@".
_USERINFO = re.compile(r"(?P<head>(?:[A-Za-z][A-Za-z0-9+.\-]*:)?//[^\s:/@]*):\S*@")


def mask_secrets(text: str) -> str:
    """Replace every ``user:password@`` in ``text`` (with or without a scheme) by ``user:***@``."""
    return _USERINFO.sub(r"\g<head>:***@", text)


def display_url(url: URL) -> str:
    """The URL as text with its password hidden: the only form that may be shown or logged."""
    return url.render_as_string(hide_password=True)


def parse_url(text: str) -> URL:
    """Parse and validate a SQLAlchemy URL; raise :class:`InvalidDatabaseURL` if unusable.

    ``postgresql://`` / ``postgres://`` (no driver) select psycopg 3. A SQLite URL must name
    a file (``sqlite:///path``): an in-memory database would silently lose the ledger.
    """
    try:
        url = make_url(text.strip())
    except (ArgumentError, ValueError):
        raise InvalidDatabaseURL(
            f"malformed database URL {mask_secrets(text)!r}: expected e.g. "
            "sqlite:////var/lib/tradeagent/tradeagent.db or postgresql+psycopg://user@host/db"
        ) from None
    backend, _, driver = url.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    if backend not in _SUPPORTED:
        raise InvalidDatabaseURL(
            f"database URL {display_url(url)!r}: unsupported dialect {backend!r} "
            f"(supported: {', '.join(sorted(_SUPPORTED))})"
        )
    driver = driver or _SUPPORTED[backend][0]
    if driver not in _SUPPORTED[backend]:
        raise InvalidDatabaseURL(
            f"database URL {display_url(url)!r}: unsupported driver {driver!r} for {backend} "
            f"(supported: {', '.join(_SUPPORTED[backend])})"
        )
    url = url.set(drivername=f"{backend}+{driver}")
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        raise InvalidDatabaseURL(
            f"database URL {display_url(url)!r}: SQLite needs a file path (sqlite:///path/to/file.db)"
        )
    if backend == "postgresql" and not url.database:
        raise InvalidDatabaseURL(f"database URL {display_url(url)!r}: no database name")
    return url


def resolve_url(config: StorageConfig, data_dir: str | Path) -> URL:
    """The URL to use: ``config.url`` when set, else the embedded file under ``data_dir``."""
    if config.url:
        return parse_url(config.url)
    path = Path(data_dir).expanduser().resolve() / EMBEDDED_FILE
    return URL.create("sqlite+pysqlite", database=str(path))


def is_embedded(config: StorageConfig) -> bool:
    """True when the embedded SQLite default is in use (created and migrated automatically)."""
    return not config.url
