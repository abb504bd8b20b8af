"""The vocabulary of the report: its literal types (norm kinds, axis labels, placements, severities, categories),
the severity order, the root module's label, the base of every record and a source location."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict


#: ``L2Norm``: ``x / max(||x||_p, eps)`` over some dims (``F.normalize``, ``x / x.norm(dim=-1, keepdim=True)``)
#: outside a module that is only a norm: a unit vector for a cosine similarity (q/k-norm, cross-covariance
#: attention, a contrastive head, nGPT's hidden state on the sphere), not a per-example feature normalisation
Kind = Literal["LayerNorm", "RMSNorm", "BatchNorm", "GroupNorm", "InstanceNorm", "LocalResponseNorm", "L2Norm",
               "Other"]


AxisLabel = Literal["batch", "sequence", "height", "width", "depth", "channel", "feature", "head", "unknown"]


Placement = Literal["pre", "post", "sandwich", "final", "embedding", "qk", "none", "unknown"]


ModelPlacement = Literal["pre", "post", "sandwich", "mixed", "none", "unknown"]


Severity = Literal["error", "warning", "info"]


Category = Literal["layout", "placement", "eps", "norm-type", "batchnorm", "numerics", "checkpoint", "capture"]


SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


#: how every format names the root module (module path ``""``): text, concise, github annotations, markdown,
#: SARIF logical locations, the numerics text and monitor events
ROOT_LABEL = "(root)"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use: a command that never builds a report skips it


class SourceLocation(_Model):
    """A place in a source file: 1-based ``line``; ``file`` as given (absolute where it was resolved)."""

    file: str
    line: Optional[int] = None
