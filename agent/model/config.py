"""Typed settings of the model (DESIGN section 5, ALGORITHMS section 1).

:class:`ModelConfig` is composed into :class:`agent.config.Config` as ``model`` and written
out in ``config/defaults.toml``. Invalid combinations (a head width that does not divide the
inner width, an empty support, ...) are rejected at load time with the key named.
"""

from __future__ import annotations

import msgspec

from agent.model.errors import ModelError

__all__ = ["ModelConfig"]


class ModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Shapes and supports of the Mamba2 + C51 + return-head network.

    Derived sizes (ALGORITHMS 1.1): ``d_inner = expand * d_model`` (Di), ``n_heads = Di /
    headdim`` (H), ``conv_dim = Di + 2 * ngroups * d_state`` (Cd), ``in_proj_dim = 2 Di + 2 G N
    + H``.
    """

    n_features: int = 0
    """F, features per bar fed to the model (market features + the agent's position and
    unrealised P&L). 0 = taken from the data when training starts (the trainer resolves it
    with :meth:`with_features`); a checkpoint always stores the resolved value."""
    window: int = 32
    """K, bars per decision window; the window is re-evaluated from zero state each decision."""
    d_model: int = 64
    n_layers: int = 2
    expand: int = 2
    headdim: int = 16
    d_state: int = 16
    ngroups: int = 1
    d_conv: int = 4
    chunk_size: int = 0
    """Q, the SSD chunk length of the window form; 0 = the whole window (Q = K)."""
    n_actions: int = 3
    """Actions in the order short, flat, long."""
    n_atoms: int = 51
    v_min: float = -10.0
    v_max: float = 10.0
    """C51 support [v_min, v_max] in normalised reward units."""
    return_bins: int = 21
    """Bins of the return head: fixed centres evenly spaced on [-return_max_ticks,
    return_max_ticks]; the outer bins absorb the tails."""
    return_max_ticks: float = 10.0
    return_horizon: int = 1
    """h, bars ahead whose mid return (in ticks) the return head predicts."""

    def __post_init__(self) -> None:
        positive = {
            "window": self.window,
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "expand": self.expand,
            "headdim": self.headdim,
            "d_state": self.d_state,
            "ngroups": self.ngroups,
            "d_conv": self.d_conv,
            "n_actions": self.n_actions,
            "return_horizon": self.return_horizon,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.n_features < 0:
            raise ValueError(f"n_features must be >= 0 (0 = from the data), got {self.n_features}")
        if self.chunk_size < 0:
            raise ValueError(f"chunk_size must be >= 0 (0 = the whole window), got {self.chunk_size}")
        if self.d_inner % self.headdim:
            raise ValueError(
                f"headdim {self.headdim} must divide d_inner = expand * d_model = {self.d_inner}"
            )
        if self.n_heads % self.ngroups:
            raise ValueError(f"ngroups {self.ngroups} must divide the number of heads {self.n_heads}")
        if self.n_atoms < 2:
            raise ValueError(f"n_atoms must be >= 2, got {self.n_atoms}")
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min ({self.v_min}) must be below v_max ({self.v_max})")
        if self.return_bins < 2:
            raise ValueError(f"return_bins must be >= 2, got {self.return_bins}")
        if not self.return_max_ticks > 0.0:
            raise ValueError(f"return_max_ticks must be > 0, got {self.return_max_ticks}")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def n_heads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def in_proj_dim(self) -> int:
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.n_heads

    @property
    def chunk(self) -> int:
        """The effective SSD chunk length Q (``chunk_size``, or K when it is 0)."""
        return self.chunk_size or self.window

    def with_features(self, n_features: int) -> ModelConfig:
        """This configuration with F resolved from the data (what a checkpoint stores).

        Raises :class:`ModelError` when the configuration fixes another F.
        """
        if n_features < 1:
            raise ModelError(f"n_features must be >= 1, got {n_features}")
        if self.n_features and self.n_features != n_features:
            raise ModelError(
                f"the configuration fixes n_features = {self.n_features}, the data has {n_features}"
            )
        return msgspec.structs.replace(self, n_features=n_features)
