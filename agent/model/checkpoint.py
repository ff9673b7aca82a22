"""Checkpoints: one safetensors blob, addressed by the sha256 of its bytes (never pickle).

Tensors (float arrays, little-endian, as safetensors stores them):

* ``param/<name>`` for every parameter (layout: :mod:`agent.model.params`);
* ``norm/mean`` and ``norm/std`` (F,): the feature normalisation fitted on the training fold
  (the model reads ``(features - mean) / std``);
* optionally ``adam_m/<name>`` and ``adam_v/<name>``: the optimiser's moments.

Header metadata: one safetensors metadata entry, ``tradeagent``, holding a JSON object (keys
sorted, so equal checkpoints serialise to equal bytes) of strings: ``format`` =
``tradeagent.checkpoint``, ``format_version`` = ``1``, ``model_config`` (:class:`ModelConfig`
as JSON), ``feature_names`` (JSON list of F names), ``layout_fingerprint``, ``optimizer``
(JSON of the Adam hyper-parameters and step, present with the moments), ``metadata``
(free-form JSON object: run id, seed, instrument set...) and ``content_sha256``, a digest of
every other entry and every tensor, so corruption is detected even without the file's hash.

Loading is a pure function: any inconsistency (corrupt bytes, another sha256, another layout,
missing or extra tensors, non-finite values, a config that does not load) raises
:class:`CheckpointError` and returns nothing. Files are written to a temporary name, synced
and renamed into place, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import safetensors.numpy
from safetensors import SafetensorError

from agent.model.arrays import Array, to_numpy
from agent.model.config import ModelConfig
from agent.model.errors import CheckpointError, ModelError
from agent.model.optim import AdamState
from agent.model.params import layout_fingerprint, param_shapes

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Checkpoint",
    "checkpoint_from_bytes",
    "checkpoint_to_bytes",
    "read_checkpoint",
    "sha256_hex",
    "write_checkpoint",
]

FORMAT = "tradeagent.checkpoint"
FORMAT_VERSION = 1
_PARAM, _ADAM_M, _ADAM_V = "param/", "adam_m/", "adam_v/"
_MEAN, _STD = "norm/mean", "norm/std"
_DIGEST = "content_sha256"
_KEY = "tradeagent"
_HEADER_LIMIT = 100 * 1024 * 1024

HostArray = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Checkpoint:
    """A loaded, verified checkpoint (host arrays; move them with ``xp.asarray``)."""

    config: ModelConfig
    params: dict[str, HostArray]
    feature_names: tuple[str, ...]
    norm_mean: HostArray
    norm_std: HostArray
    fingerprint: str
    sha256: str
    optimizer: AdamState | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def sha256_hex(data: bytes) -> str:
    """The content address of checkpoint bytes."""
    return hashlib.sha256(data).hexdigest()


def _content_digest(header: Mapping[str, str], tensors: Mapping[str, HostArray]) -> str:
    """sha256 over the header entries and every tensor's name, dtype, shape and bytes.

    Stored in the header as ``content_sha256``, so corrupt bytes are caught even when the
    caller has no expected file hash to compare with.
    """
    h = hashlib.sha256()
    for key in sorted(header):
        if key != _DIGEST:
            h.update(f"{key}={header[key]}\0".encode())
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"{name}:{a.dtype.str}:{a.shape}\0".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _finite(name: str, a: HostArray) -> None:
    if not np.issubdtype(a.dtype, np.floating):
        raise ModelError(f"checkpoint tensor {name} must be floating point, got {a.dtype}")
    if not np.isfinite(a).all():
        raise ModelError(f"checkpoint tensor {name} holds NaN or Inf")


def _check_norm(mean: HostArray, std: HostArray, n_features: int) -> None:
    for name, a in ((_MEAN, mean), (_STD, std)):
        if a.shape != (n_features,):
            raise ModelError(f"{name} must have shape ({n_features},), got {a.shape}")
        _finite(name, a)
    if not (std > 0).all():
        raise ModelError(f"{_STD} must be > 0 everywhere")


def checkpoint_to_bytes(
    params: Mapping[str, Array],
    config: ModelConfig,
    *,
    feature_names: tuple[str, ...] | list[str],
    norm_mean: Array,
    norm_std: Array,
    optimizer: AdamState | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> bytes:
    """Serialise a model; raises :class:`ModelError` if what is given is not a valid model.

    ``params`` must match ``param_shapes(config)`` exactly and be finite; ``feature_names``,
    ``norm_mean`` and ``norm_std`` have ``config.n_features`` entries (std > 0);
    ``metadata`` must be JSON-serialisable. Arrays may live on the GPU (copied to the host).
    """
    expected = param_shapes(config)
    if set(params) != set(expected):
        missing, extra = sorted(set(expected) - set(params)), sorted(set(params) - set(expected))
        raise ModelError(f"parameters do not match the config's layout (missing {missing}, extra {extra})")
    tensors: dict[str, HostArray] = {}
    for name, shape in expected.items():
        host = np.ascontiguousarray(to_numpy(params[name]))
        if host.shape != shape:
            raise ModelError(f"parameter {name}: shape {host.shape} != {shape}")
        _finite(name, host)
        tensors[_PARAM + name] = host
    mean, std = to_numpy(norm_mean), to_numpy(norm_std)
    _check_norm(mean, std, config.n_features)
    tensors[_MEAN], tensors[_STD] = np.ascontiguousarray(mean), np.ascontiguousarray(std)
    names = tuple(str(n) for n in feature_names)
    if len(names) != config.n_features:
        raise ModelError(f"{len(names)} feature names for n_features = {config.n_features}")
    header = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "model_config": msgspec.json.encode(config).decode(),
        "feature_names": json.dumps(names),
        "layout_fingerprint": layout_fingerprint(expected),
    }
    if optimizer is not None:
        for prefix, moments in ((_ADAM_M, optimizer.m), (_ADAM_V, optimizer.v)):
            if set(moments) != set(expected):
                raise ModelError("optimiser state does not match the parameters' names")
            for name, shape in expected.items():
                host = np.ascontiguousarray(to_numpy(moments[name]))
                if host.shape != shape:
                    raise ModelError(f"optimiser moment {prefix}{name}: shape {host.shape} != {shape}")
                tensors[prefix + name] = host
        header["optimizer"] = json.dumps(
            {
                "lr": optimizer.lr,
                "beta1": optimizer.beta1,
                "beta2": optimizer.beta2,
                "eps": optimizer.eps,
                "weight_decay": optimizer.weight_decay,
                "step": optimizer.step,
            }
        )
    try:
        header["metadata"] = json.dumps(dict(metadata or {}), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"checkpoint metadata is not plain JSON: {exc}") from None
    header[_DIGEST] = _content_digest(header, tensors)
    out: bytes = safetensors.numpy.save(tensors, metadata={_KEY: json.dumps(header, sort_keys=True)})
    return out


def _header(data: bytes) -> dict[str, str]:
    """Our metadata from safetensors bytes (8-byte little-endian length + JSON header)."""
    if len(data) < 8:
        raise CheckpointError("not a checkpoint: shorter than a safetensors header")
    size = int.from_bytes(data[:8], "little")
    if size > min(len(data) - 8, _HEADER_LIMIT):
        raise CheckpointError("not a checkpoint: safetensors header length is out of range")
    try:
        header = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"not a checkpoint: unreadable header ({exc})") from None
    outer = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(outer, dict) or not isinstance(outer.get(_KEY), str):
        raise CheckpointError("not a checkpoint: no tradeagent metadata in the header")
    try:
        meta = json.loads(outer[_KEY])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"not a checkpoint: unreadable tradeagent metadata ({exc})") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError("not a checkpoint: tradeagent metadata is not an object of strings")
    return meta


def _json(meta: dict[str, str], key: str) -> Any:
    if key not in meta:
        raise CheckpointError(f"checkpoint metadata lacks '{key}'")
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint metadata '{key}' is not JSON: {exc}") from None


def _optimizer(meta: dict[str, str], tensors: dict[str, HostArray], names: set[str]) -> AdamState | None:
    if "optimizer" not in meta:
        return None
    hyper = _json(meta, "optimizer")
    m = {name[len(_ADAM_M) :]: a for name, a in tensors.items() if name.startswith(_ADAM_M)}
    v = {name[len(_ADAM_V) :]: a for name, a in tensors.items() if name.startswith(_ADAM_V)}
    if set(m) != names or set(v) != names:
        raise CheckpointError("checkpoint optimiser moments do not cover the parameters")
    try:
        return AdamState(
            lr=float(hyper["lr"]),
            beta1=float(hyper["beta1"]),
            beta2=float(hyper["beta2"]),
            eps=float(hyper["eps"]),
            weight_decay=float(hyper["weight_decay"]),
            step=int(hyper["step"]),
            m=m,
            v=v,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint optimiser metadata is malformed: {exc!r}") from None


def _model_config(meta: dict[str, str]) -> ModelConfig:
    """The model config of a checkpoint in a format this build reads."""
    if meta.get("format") != FORMAT or meta.get("format_version") != str(FORMAT_VERSION):
        raise CheckpointError(
            f"unsupported checkpoint format {meta.get('format')!r} version {meta.get('format_version')!r}"
            f" (this build reads {FORMAT} version {FORMAT_VERSION})"
        )
    try:
        return msgspec.json.decode(meta.get("model_config", ""), type=ModelConfig, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise CheckpointError(f"checkpoint model config does not load: {exc}") from None


def _feature_names(meta: dict[str, str], n_features: int) -> list[str]:
    names = _json(meta, "feature_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError("checkpoint feature_names is not a list of strings")
    if len(names) != n_features:
        raise CheckpointError(f"{len(names)} feature names for n_features = {n_features}")
    return names


def checkpoint_from_bytes(
    data: bytes, *, expected_sha256: str | None = None, expected_fingerprint: str | None = None
) -> Checkpoint:
    """Parse and verify checkpoint bytes; raises :class:`CheckpointError` on any mismatch.

    ``expected_sha256``: the content address the caller asked for (e.g. from the database);
    ``expected_fingerprint``: the layout the caller can run (e.g. the live engine's).
    """
    digest = sha256_hex(data)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise CheckpointError(f"checkpoint sha256 is {digest}, expected {expected_sha256}")
    meta = _header(data)
    config = _model_config(meta)
    stored = meta.get("layout_fingerprint", "")
    if expected_fingerprint is not None and stored != expected_fingerprint:
        raise CheckpointError(
            f"checkpoint layout {stored[:12]} differs from the expected layout {expected_fingerprint[:12]}"
            " (another model shape: retrain or load a matching checkpoint)"
        )
    try:
        tensors: dict[str, HostArray] = safetensors.numpy.load(data)
        shapes = param_shapes(config)
    except (SafetensorError, ModelError) as exc:
        raise CheckpointError(f"checkpoint body is unreadable: {exc}") from None
    if _content_digest(meta, tensors) != meta.get(_DIGEST):
        raise CheckpointError("checkpoint content does not match its recorded digest: the file is corrupt")
    if layout_fingerprint(shapes) != stored:
        raise CheckpointError("checkpoint layout fingerprint does not match its own model config")
    params = {name[len(_PARAM) :]: a for name, a in tensors.items() if name.startswith(_PARAM)}
    if layout_fingerprint(params) != stored:
        raise CheckpointError("checkpoint parameters do not match its layout fingerprint")
    names = set(shapes)
    optimizer = _optimizer(meta, tensors, names)
    known = {_PARAM + n for n in names} | {_MEAN, _STD}
    if optimizer is not None:
        known |= {_ADAM_M + n for n in names} | {_ADAM_V + n for n in names}
    if set(tensors) != known:
        raise CheckpointError(f"checkpoint tensors differ from its layout: {sorted(set(tensors) ^ known)}")
    feature_names = _feature_names(meta, config.n_features)
    metadata = _json(meta, "metadata")
    if not isinstance(metadata, dict):
        raise CheckpointError("checkpoint metadata is not a JSON object")
    try:
        for name, a in params.items():
            _finite(name, a)
        _check_norm(tensors[_MEAN], tensors[_STD], config.n_features)
    except ModelError as exc:
        raise CheckpointError(f"checkpoint holds invalid values: {exc}") from None
    return Checkpoint(
        config=config,
        params=params,
        feature_names=tuple(feature_names),
        norm_mean=tensors[_MEAN],
        norm_std=tensors[_STD],
        fingerprint=stored,
        sha256=digest,
        optimizer=optimizer,
        metadata=metadata,
    )


def write_checkpoint(path: str | Path, data: bytes) -> str:
    """Write checkpoint bytes atomically (temporary file, fsync, rename); returns the sha256."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return sha256_hex(data)


def read_checkpoint(
    path: str | Path, *, expected_sha256: str | None = None, expected_fingerprint: str | None = None
) -> Checkpoint:
    """Read and verify a checkpoint file (see :func:`checkpoint_from_bytes`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    return checkpoint_from_bytes(
        data, expected_sha256=expected_sha256, expected_fingerprint=expected_fingerprint
    )
