"""The facts of a GGUF file (llama.cpp's format) audited as a target: what the file says of each norm tensor, what
the Hugging Face config it was converted from implies for it, and the norms that config implies and the file
lacks. Read by :mod:`normaudit.loaders.gguf_file`, compared with the config by :mod:`normaudit.facts.conversion`;
the rules NC111-NC114 read them."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from normaudit.report.base import _Model

GainForm = Literal["weight", "one_plus_weight", "unknown"]


class GgufFacts(_Model):
    """One norm of a GGUF file (``site.gguf``; None on every site of another target kind).

    ``tensor``: llama.cpp's name of the tensor kind (the ``gguf`` package's ``MODEL_TENSOR``: ``ATTN_NORM``,
    ``ATTN_Q_NORM``); ``ggml_type`` its storage type (``F32``); ``eps_key`` the metadata key ``site.eps`` was
    read from (``llama.attention.layer_norm_rms_epsilon``), None when the file has none.

    With a config (``--config`` or a ``config.json`` beside the file), :mod:`normaudit.facts.conversion` sets:
    ``config_eps`` and ``config_eps_source`` (the eps the config's model uses for this norm and where it was
    read); ``reference_module``/``reference_class`` (the module of the model the config builds that llama.cpp's
    tensor-name map maps onto this tensor); ``reference_gain_form`` (how that module applies its gain:
    ``weight``, ``one_plus_weight`` for Gemma's x * (1 + w), ``unknown``); ``expected_shapes`` (the shapes this
    tensor may have, from the config's model, its head counts and head width, or without a config the file's own
    head counts: q/k norms only) and ``shape_basis`` (what they were computed from, in words).
    """

    tensor: str
    ggml_type: str
    eps_key: Optional[str] = None
    config_eps: Optional[float] = None
    config_eps_source: Optional[str] = None
    reference_module: Optional[str] = None
    reference_class: Optional[str] = None
    reference_gain_form: Optional[GainForm] = None
    expected_shapes: list[list[int]] = Field(default_factory=list)
    shape_basis: Optional[str] = None


class MissingNorm(_Model):
    """A norm the config's model has and the GGUF file lacks: ``module`` the name llama.cpp would give it
    (``blk.0.attn_q_norm``, the site it would be), ``tensor`` that of its gain (``blk.0.attn_q_norm.weight``),
    ``reference_module``/``reference_class`` the module of the config's model."""

    module: str
    tensor: str
    reference_module: str
    reference_class: str


class GgufModelFacts(_Model):
    """Model-level facts of a GGUF file (``model.gguf``; None for every other target kind).

    ``architecture``: ``general.architecture`` (``llama``); ``known_architecture``: whether the installed
    ``gguf`` package names its tensors (else the norm tensors of every architecture were looked for);
    ``block_count``: ``<arch>.block_count``; ``config_source``: the config compared with (None without one);
    ``reference``: the class the config builds (``Qwen3ForCausalLM``), None where it could not be built;
    ``missing_norms``: norms that model has and the file lacks (:class:`MissingNorm`, in the model's order);
    ``unmapped``: norm-named tensors the architecture does not define (llama.cpp does not load them).
    """

    architecture: Optional[str] = None
    known_architecture: bool = False
    block_count: Optional[int] = None
    config_source: Optional[str] = None
    reference: Optional[str] = None
    missing_norms: list[MissingNorm] = Field(default_factory=list)
    unmapped: list[str] = Field(default_factory=list)
