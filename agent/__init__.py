"""tradeagent's daemon and learning core (model, policy, training, execution, control).

``__version__`` is the installed distribution's version, read from its metadata: pyproject.toml's
``version`` is the one place it is written. A source tree that was never installed
(``pip install -e .`` makes the metadata) reports ``0+unknown``.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("tradeagent")
except PackageNotFoundError:
    __version__ = "0+unknown"
