"""CLI sub-commands, one module each, wired together by :mod:`agent.cli`."""
