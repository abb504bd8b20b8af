"""Time-series and trajectory inputs built from a Hugging Face config.

The past and future windows of a forecaster's target series with their time features, observed mask,
padding flags and static features (:data:`SERIES_BUILDERS`), and the step-aligned streams of an offline-RL
trajectory model: states, actions, rewards, returns-to-go, timesteps (:data:`TRAJECTORY_BUILDERS`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

from normaudit.loaders.inputs.base import BATCH, SEQ, cfg_value, is_positive_int


def _past_length(config: Any) -> int:
    """Time steps of a forecaster's ``past_values``: ``context_length + max(lags_sequence)`` for the lagged
    models (TimeSeriesTransformer, Informer, Autoformer: ``config._past_length`` in transformers), else
    ``context_length`` (PatchTST, PatchTSMixer)."""
    context = int(cfg_value(config, ("context_length",), (), SEQ))
    lags = getattr(config, "lags_sequence", None)
    if isinstance(lags, (list, tuple)) and lags and all(is_positive_int(v) for v in lags):
        return context + max(lags)
    return context


def _series(config: Any, length: int) -> torch.Tensor:
    """A target series over ``length`` steps: ``(B, T)`` for one variate (``input_size`` 1), ``(B, T, V)``
    for ``V`` variates (``input_size`` of the lagged models, ``num_input_channels`` of PatchTST)."""
    lagged = getattr(config, "lags_sequence", None) is not None
    variates = cfg_value(config, ("input_size",) if lagged else ("num_input_channels", "input_size"), (), 1)
    if lagged and int(variates) == 1:
        return torch.randn(BATCH, length)
    return torch.randn(BATCH, length, int(variates))


def _time_features(config: Any, length: int) -> torch.Tensor:
    """``(B, T, num_time_features + num_dynamic_real_features)``: the covariates a lagged forecaster
    concatenates to its lagged inputs (width 0 when the config has none)."""
    width = sum(int(getattr(config, k, 0) or 0) for k in ("num_time_features", "num_dynamic_real_features"))
    return torch.randn(BATCH, length, width)


def _prediction_length(config: Any) -> int:
    return int(cfg_value(config, ("prediction_length",), (), SEQ // 2))


def _static_categorical(config: Any) -> Iterator[torch.Tensor]:
    """``(B, num_static_categorical_features)`` category ids below each feature's ``cardinality``; nothing
    when the config has no static categorical feature (forward then takes None)."""
    count = int(getattr(config, "num_static_categorical_features", 0) or 0)
    cards = list(getattr(config, "cardinality", None) or [])
    if count > 0 and len(cards) >= count and all(is_positive_int(c) for c in cards[:count]):
        yield torch.stack([torch.randint(0, c, (BATCH,)) for c in cards[:count]], dim=1)


def _static_real(config: Any) -> Iterator[torch.Tensor]:
    count = int(getattr(config, "num_static_real_features", 0) or 0)
    if count > 0:
        yield torch.randn(BATCH, count)


def _past_values(config: Any) -> Iterator[torch.Tensor]:
    """``past_values`` candidates: :func:`_series` over :func:`_past_length` steps; for one variate also
    ``(B, T)`` (TimesFM patches a univariate ``(B, T)`` series into ``patch_length`` chunks)."""
    series = _series(config, _past_length(config))
    yield series
    if series.dim() == 3 and series.shape[-1] == 1:
        yield series[..., 0].contiguous()


#: the inputs of transformers' time-series forecasters, as their model tests build them
#: (``TimeSeriesTransformerModelTester.prepare_config_and_inputs``): past and future windows of the series,
#: their time features, an all-observed mask; TimesFM's padding flags (0: observed, float as the model
#: computes ``1 - pad``) and frequency class ``(B, 1)`` (0: high frequency). Given future values, the models run their decoders too.
SERIES_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "past_values": lambda c: _past_values(c),
    "past_values_padding": lambda c: iter([torch.zeros(BATCH, _past_length(c))]),
    "freq": lambda c: iter([torch.zeros(BATCH, 1, dtype=torch.int64)]),
    "past_time_features": lambda c: iter([_time_features(c, _past_length(c))]),
    "past_observed_mask": lambda c: iter([torch.ones_like(_series(c, _past_length(c)), dtype=torch.bool)]),
    "future_values": lambda c: iter([_series(c, _prediction_length(c))]),
    "future_time_features": lambda c: iter([_time_features(c, _prediction_length(c))]),
    "static_categorical_features": _static_categorical,
    "static_real_features": _static_real,
}


def _trajectory(config: Any, key: Optional[str]) -> Iterator[torch.Tensor]:
    """One step-aligned stream of an offline-RL trajectory ``(B, SEQ, width)``: ``config.<key>`` wide
    (``state_dim`` states, ``act_dim`` actions), one wide for ``key`` None (rewards, returns-to-go); nothing
    when the config has no ``state_dim`` (no trajectory model)."""
    width = 1 if key is None else cfg_value(config, (key,))
    if is_positive_int(cfg_value(config, ("state_dim",))) and is_positive_int(width):
        yield torch.randn(BATCH, SEQ, int(width))


def _timesteps(config: Any) -> Iterator[torch.Tensor]:
    """Each trajectory step's time index ``(B, SEQ)`` int64, below ``max_ep_len`` (the timestep embedding's
    rows); nothing without a ``state_dim`` and ``max_ep_len``."""
    length = cfg_value(config, ("max_ep_len",))
    if is_positive_int(cfg_value(config, ("state_dim",))) and is_positive_int(length):
        yield torch.arange(SEQ).remainder(int(length)).expand(BATCH, SEQ).contiguous()


#: a Decision-Transformer-style trajectory, as its model test builds it: states ``(B, T, state_dim)``, actions
#: ``(B, T, act_dim)``, rewards and returns-to-go ``(B, T, 1)``, timesteps ``(B, T)`` int64
TRAJECTORY_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "states": lambda c: _trajectory(c, "state_dim"), "actions": lambda c: _trajectory(c, "act_dim"),
    "rewards": lambda c: _trajectory(c, None), "returns_to_go": lambda c: _trajectory(c, None),
    "timesteps": _timesteps,
}
