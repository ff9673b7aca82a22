"""Process configuration: typed, frozen, validated at start.

Resolution order (later wins):

1. the defaults written in the structs below (the embedded defaults: no file is needed);
2. the TOML file given with ``--config`` (for example ``config/paper.toml``);
3. environment overrides ``TRADEAGENT__<SECTION>__<KEY>=<value>`` (the value is read as a TOML
   literal when it parses as one, else as a string), and the documented shortcuts
   ``TRADEAGENT_DB_URL`` and ``TRADEAGENT_DATA_DIR``.

An unknown key, a value of the wrong type or out of range, or a combination a struct's
``__post_init__`` refuses stops the process with a :class:`ConfigError` that names the key and
where it came from (file or environment variable).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from agent.control.config import ControlConfig
from agent.daemon.config import DaemonConfig, ScheduleConfig
from agent.errors import AgentError
from agent.execution.config import BrokerConfig
from agent.model.config import ModelConfig
from agent.policy.config import PolicyConfig
from agent.policy.regime import RegimeConfig
from agent.trading.config import RiskConfig
from agent.train.config import TrainConfig
from feeds.config import FeedsConfig, SynthConfig
from storage.config import StorageConfig

__all__ = ["Config", "ConfigError", "load_config"]

ENV_PREFIX = "TRADEAGENT__"
ENV_SHORTCUTS = {
    "TRADEAGENT_DB_URL": ("storage", "url"),
    "TRADEAGENT_DATA_DIR": ("data_dir",),
}


class ConfigError(AgentError):
    """The configuration cannot be used; the message names the key and its source."""


def _default_data_dir() -> str:
    state = os.environ.get("STATE_DIRECTORY")  # set by systemd's StateDirectory=
    if state:
        return state.split(":")[0]
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "tradeagent")


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    data_dir: str = msgspec.field(default_factory=_default_data_dir)
    """Where the embedded database, checkpoints, reports and logs live."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    feeds: FeedsConfig = msgspec.field(default_factory=FeedsConfig)
    synth: SynthConfig = msgspec.field(default_factory=SynthConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    regime: RegimeConfig = msgspec.field(default_factory=RegimeConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    risk: RiskConfig = msgspec.field(default_factory=RiskConfig)
    broker: BrokerConfig = msgspec.field(default_factory=BrokerConfig)
    control: ControlConfig = msgspec.field(default_factory=ControlConfig)
    schedule: ScheduleConfig = msgspec.field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        """Combinations across sections. Mid fills (``broker.fill_price = "mid"``, a control
        experiment) must be charged by the sizing's cost gate as they are filled
        (``policy.leg_price``), and only the CPU sizing (:func:`agent.policy.kelly.kelly_size_ref`)
        reads ``leg_price``: the CUDA decision kernel charges half the spread a leg."""
        if self.policy.leg_price != self.broker.fill_price:
            raise ValueError(
                f"policy.leg_price: {self.policy.leg_price!r} differs from broker.fill_price "
                f"{self.broker.fill_price!r}: the cost gate must charge what the broker fills (set both)"
            )
        if self.broker.fill_price == "mid" and self.device != "cpu":
            raise ValueError(
                f"broker.fill_price: 'mid' needs device = \"cpu\" (got {self.device!r}): the CUDA "
                "decision kernel's cost gate charges half the spread a leg"
            )


_PATH_RE = re.compile(r"at `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`")
_FIELD_RE = re.compile(r"^([a-z_][a-z0-9_.]*): ")
"""A check in a struct's ``__post_init__`` that starts its message with ``<field>: `` names
that field (a dotted path for a check across sections): the error is reported under the
struct's key plus the field."""


def _key_of(message: str) -> str:
    """Turn msgspec's ``... - at `$.feeds.bars`'' into a dotted key path."""
    match = _PATH_RE.search(message)
    return match.group(1).lstrip(".") if match else ""


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_overrides(env: Mapping[str, str]) -> list[tuple[tuple[str, ...], Any, str]]:
    out: list[tuple[tuple[str, ...], Any, str]] = []
    for name, raw in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
            if not all(path):
                raise ConfigError(f"environment variable {name}: malformed key path")
            out.append((path, _parse_env_value(raw), name))
        elif name in ENV_SHORTCUTS:
            out.append((ENV_SHORTCUTS[name], raw, name))
    return out


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any, source: str) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {'.'.join(path)} overrides a value that is not a table")
        node = child
    node[path[-1]] = value


def _source_of(key: str, env_keys: dict[str, str], file: str) -> str:
    for dotted, name in env_keys.items():
        if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + "."):
            return f"environment variable {name}"
    return file


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load the configuration from ``path`` (or the embedded defaults) plus the environment."""
    env = os.environ if env is None else env
    tree: dict[str, Any] = {}
    file = "<embedded defaults>"
    if path is not None:
        file = str(path)
        try:
            tree = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{file}: configuration file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    env_keys: dict[str, str] = {}
    for key_path, value, name in _env_overrides(env):
        _set_path(tree, key_path, value, f"environment variable {name}")
        env_keys[".".join(key_path)] = name
    try:
        return msgspec.convert(tree, Config, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        key = _key_of(message)
        unknown = re.search(r"unknown field `([^`]+)`", message)
        if unknown:
            key = f"{key}.{unknown.group(1)}" if key else unknown.group(1)
        reason = message.split(" - at ", maxsplit=1)[0]
        field = _FIELD_RE.match(reason)
        if field:  # a struct's own check that names its field: "cron: ..."
            key = f"{key}.{field.group(1)}" if key else field.group(1)
            reason = reason[field.end() :]
        where = _source_of(key, env_keys, file)
        raise ConfigError(f"{where}: key '{key or '<root>'}': {reason}") from None
