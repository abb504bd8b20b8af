"""Axis provenance: a label for every dimension of every tensor in the graph.

Model inputs are labelled by what they are (token ids -> ``(batch, sequence)``; images ->
``(batch, channel, height, width)``; audio or 1-D conv input -> ``(batch, channel, sequence)``; or as the
user declares with ``--input-axes``), and the labels are carried forward node by node through
permute/transpose/movedim, view/reshape/flatten/unflatten/squeeze/unsqueeze (merged and split axes),
convolution (channel axis), linear/matmul/einsum (feature axis), embedding, attention head split and merge,
scaled-dot-product attention, pooling/upsampling/padding, slicing, concatenation, split/chunk/unbind and
reductions, for both graph flavours (``call_module``/``call_method`` nodes of a symbolic trace and aten ops
of ``torch.export``). A site's ``normalized_axes`` is the set of labels of the dims its statistics reduce,
never a guess from comparing sizes.

Each dimension is a tuple of *parts*, ``(names, size)`` from the outermost to the innermost, so a merged
dimension remembers what it is made of: ``flatten(2)`` of an ``(N, C, 16, 16)`` tensor gives a last dim of
parts ``(("height",), 16), (("width",), 16)``; viewing it back as ``(16, 16)`` recovers ``height`` and
``width`` exactly, and ``view(B*S, D)`` followed by ``view(B, S, D)`` recovers ``batch`` and ``sequence``.
Splitting a ``feature`` dim in two (``view(B, S, H, D // H)``) gives ``head`` and ``feature``; merging
them back gives ``feature``. Sizes are used only to follow a reshape (which part goes where), which is
exactly how ``view`` itself lays out memory.

Public labels are tuples of base names (:data:`Label`), e.g. ``("batch",)``, ``("height", "width")``;
:func:`label_graph` returns them per node and stores them under ``node.meta["normaudit"]["axes"]``.

Modules:

- :mod:`.dims`: dims made of parts, their public labels, the report's label texts;
- :mod:`.inputs`: ``--input-axes`` and the labels inferred for each model input;
- :mod:`.ops`: an op's raw name and dims arguments under both graph flavours;
- :mod:`.views`: labels through view/reshape and the other layout ops;
- :mod:`.layers`: labels through layers, modules and element-wise broadcasting;
- :mod:`.transfer`: one node's labels from its inputs' (the dispatch over the rules above);
- :mod:`.labelling`: the pass over the graph (:func:`label_dims`, :func:`label_graph`).

Example::

    >>> import torch
    >>> from torch import nn
    >>> from normaudit.capture import capture_model
    >>> m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(2))
    >>> cap = capture_model(m, (torch.randn(2, 3, 10, 10),), on_meta=False)
    >>> env = label_graph(cap)
    >>> axes_text(env[list(cap.gm.graph.nodes)[-2]])
    ['batch', 'channel', 'height*width']
"""
from normaudit.facts.axes.dims import Dim, Label, axes_text, dim_label, flat_labels
from normaudit.facts.axes.inputs import input_labels, parse_input_axes
from normaudit.facts.axes.labelling import label_dims, label_graph, run

__all__ = ["Dim", "Label", "axes_text", "dim_label", "flat_labels", "input_labels", "label_dims", "label_graph",
           "parse_input_axes", "run"]
