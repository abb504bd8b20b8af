"""The record of one site (:class:`SiteRecord`) and the source facts it carries: the line of user code that
computed a node (:func:`location`) and dtype names as the report writes them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.loaders.pyfile import trace_frames
from normaudit.report import Site, SourceLocation
from normaudit.vocabulary.dtypes import dtype_name


@dataclass
class SiteRecord:
    """A site and the graph nodes behind it.

    ``input`` is the tensor the norm normalises, ``output`` the node carrying its result (after gain and
    bias where those are recognised), ``stat`` the reduction node for hand-written norms, ``nodes`` every
    node claimed by this site.
    """

    site: Site
    input: Optional[fx.Node] = None
    output: Optional[fx.Node] = None
    stat: Optional[fx.Node] = None
    nodes: set = field(default_factory=set)
    module_obj: Optional[nn.Module] = None
    hints: dict[str, Any] = field(default_factory=dict)


def dtype_str(dt: Optional[torch.dtype]) -> Optional[str]:
    """A dtype as the report names it (``torch.bfloat16`` -> ``bfloat16``); None stays None."""
    return dtype_name(dt)


def location(node: Optional[fx.Node], skip_inner: int = 0) -> Optional[SourceLocation]:
    """A frame of the node's recorded stack trace outside torch: the innermost one, or ``skip_inner``
    frames further out (1 gives the caller of a hand-written norm's ``forward``)."""
    if node is None:
        return None
    frames = [SourceLocation(file=f.file, line=f.line) for f in trace_frames(node.meta.get("stack_trace"))]
    if not frames:
        return None
    return frames[max(0, len(frames) - 1 - skip_inner)]
