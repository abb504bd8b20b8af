"""Site discovery: every normalisation computation in a captured graph, each one :class:`SiteRecord`.

:func:`discover_sites` runs four detectors over ``cap.gm``, in this order, each skipping the nodes already
claimed:

1. built-in norm modules (``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``,
   ``nn.GroupNorm``, ``nn.InstanceNorm1d/2d/3d``, ``nn.LocalResponseNorm``), as ``call_module`` nodes
   (symbolic tracing) or the aten op / decomposed ops they own (export);
2. functional calls (``F.layer_norm``, ``F.rms_norm``, ``F.batch_norm``, ``F.group_norm``,
   ``F.instance_norm`` and their aten forms) inside any other module's forward;
3. hand-written norms, recognised by what they compute, whatever the class is called: a statistic over some
   dims turned into a scale by a root and applied to the tensor it was taken on, with its kind from the
   numerator and denominator; the 2-norm forms; grouped views (hand-written GroupNorms); cumulative norms;
4. frozen BatchNorms, the statistic a per-channel buffer, also where symbolic tracing folded the buffer
   arithmetic into constants.

Only activations are normalised tensors: nodes that depend on a model input, or on a tensor the forward makes
from no tensor. Statistics of a parameter are no site whatever they compute (weight standardisation, Qiao et
al. 2019). A statistic needs only its input's rank: the norm of ``h[mask]`` (a data-dependent row count) is a
site. The module of a site is the innermost module whose forward produced it (CONTRACT.md). When no capture
worked, :func:`walk_modules` finds norm modules by walking ``named_modules()``.

Modules:

- :mod:`.record`: :class:`SiteRecord`, :func:`location` (the user-code line of a node), dtype names;
- :mod:`.activations`: which nodes are activations (:func:`activation_nodes`);
- :mod:`.builtin`: facts of built-in modules and functional calls, default eps, :func:`walk_modules`;
- :mod:`.statistics`: what a hand-written statistic measures (detector 3);
- :mod:`.application`: where its scale is applied, the affine chain after it, the numerator's form;
- :mod:`.l2`: 2-norm forms (RMSNorms by an L2 norm, Global Response Normalization);
- :mod:`.group_norm`: hand-written GroupNorms (statistics of a grouped view);
- :mod:`.frozen_batchnorm`: frozen BatchNorms (detector 4), with the ``make_fx`` retrace;
- :mod:`.hand_written`: detector 3 itself: the walk over roots and the kind of each site;
- :mod:`.discovery`: :func:`discover_sites`, the order of the detectors and the shape facts of every record.
"""
from normaudit.facts.sites.builtin import walk_modules
from normaudit.facts.sites.discovery import discover_sites, run
from normaudit.facts.sites.record import SiteRecord, location

__all__ = ["SiteRecord", "discover_sites", "location", "run", "walk_modules"]
