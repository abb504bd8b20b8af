"""Capture the parts of a model whose whole forward cannot be captured.

When every method of :func:`normaudit.capture.capture_model` fails for the whole model, its forward is run
eagerly once on the fake tensors (the model is already materialised on them) with a forward pre-hook on
every submodule that holds a norm: each hook keeps the positional and keyword inputs of the module's first
call, so every block is captured later on its real input shapes. The forward may fail part-way (a
``.tolist()`` on a fake tensor, a data-dependent branch): the modules reached before the failure keep
their inputs. Parts are then captured top-down: a submodule (a tower, a stack, a repeated block) is
captured alone with the methods of the whole-model capture; when that fails its children holding norms are
tried in turn. Each part's sites get every graph fact (axes, formula, placement within the part, eps).
"""
from __future__ import annotations

import contextlib
import io
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from normaudit.capture.errors import data_dependent, failure_location, one_line, root_cause
from normaudit.capture.fake import constant_inputs, fake_inputs, no_value_checks
from normaudit.capture.methods import attempt_label, export_graph, export_retries, symbolic_trace_graph
from normaudit.capture.record import Capture
from normaudit.loaders.inputs import forward_kwargs, forward_params, infer_hf_inputs
from normaudit.quiet import quiet
from normaudit.report import CaptureAttempt, CapturedPart, UnauditedModule
from normaudit.vocabulary.graph import module_stack
from normaudit.vocabulary.kinds import norm_modules

#: at most this many part captures are tried, and for at most this many seconds in all
MAX_ATTEMPTS, MAX_SECONDS = 64, 120.0
#: the end of the ``method`` of a part captured as a model of its own on inputs built for it
#: (:func:`capture_submodels`) after the whole model failed, in the report's ``capture.parts``
OWN_INPUTS = " (a model of its own, on inputs built for it)"
#: a model of at most this many parameter elements may be run on real numbers when its forward needs them
REAL_RUN_MAX_ELEMENTS = 20_000_000


@dataclass
class PartCapture:
    """One captured part: ``path`` is its ``named_modules()`` path in the whole model; ``capture`` its
    :class:`normaudit.capture.Capture` (module paths relative to the part); ``inputs`` the recorded inputs,
    described (``"arg0: float32[2, 16, 32]"``); ``own_inputs``: see below."""

    path: str
    capture: Any
    inputs: list[str] = field(default_factory=list)
    #: captured on inputs built for it as a model of its own (:func:`capture_submodels`), not on inputs the
    #: whole model's forward gave it
    own_inputs: bool = False


def _keepable(v: Any) -> bool:
    if v is None or isinstance(v, (torch.Tensor, bool, int, float, str)):
        return True
    return isinstance(v, (tuple, list)) and all(_keepable(x) for x in v)


def record_inputs(model: nn.Module, inputs: Any, mode: FakeTensorMode, paths: set[str],
                  extra_kwargs: Optional[dict[str, Any]] = None) -> tuple[dict[str, tuple[tuple, dict]], Optional[str]]:
    """Run ``model`` eagerly under ``mode`` on ``inputs`` (fake tensors: a tuple, or a dict of keyword
    inputs) and return ``({path: (args, kwargs)}, error)``: the first call's inputs of each module in
    ``paths``, and what stopped the forward (None when it ran to the end). Keyword values that are not
    tensors or plain constants (cache objects) are dropped."""
    recorded: dict[str, tuple[tuple, dict]] = {}
    handles = []

    def hook_for(path: str):
        def hook(_mod, args, kwargs):
            if path not in recorded and all(_keepable(a) for a in args):
                recorded[path] = (tuple(args), {k: v for k, v in kwargs.items() if _keepable(v)})
        return hook

    for path, mod in model.named_modules():
        if path in paths:
            handles.append(mod.register_forward_pre_hook(hook_for(path), with_kwargs=True))
    error = None
    args, kwargs = ((), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})
    kwargs.update(extra_kwargs or {})
    try:
        with mode, torch.no_grad(), no_value_checks(), warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the modules reached so far keep their inputs
        error = one_line(root_cause(exc))
    finally:
        for h in handles:
            h.remove()
    return recorded, error


def _record_real(root: nn.Module, inputs: Any, mode: FakeTensorMode, holders: set[str],
                 extra_kwargs: Optional[dict[str, Any]], real_inputs: Any = None,
                 buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None) -> tuple[dict, Optional[str]]:
    """:func:`record_inputs` on real numbers, for a forward that reads its data (``.tolist()``,
    ``len(set(...))``): a small model's fake parameters are swapped for real ones meanwhile (normal(0, 0.02)
    weights, zero buffers), the inputs made real likewise, and the recorded inputs made fake again. Models
    above :data:`REAL_RUN_MAX_ELEMENTS` parameter elements are not run. ``real_inputs`` are the example
    inputs the fake ones were made from (same form): where one is a real tensor its values are used, so an
    input whose values are sizes (``grid_thw``, lengths) keeps them; else random values of the fake one's
    shape (:func:`_real_value`). ``buffers``: the integer buffers' known values
    (:func:`normaudit.capture.integer_buffers`, by module path), used instead of zeros (a stride of 0 divides
    by zero)."""
    tables = [(mod._parameters, True) for mod in root.modules()] + [(mod._buffers, False) for mod in root.modules()]
    known = {id(mod._buffers): values for path, mod in root.named_modules()
             for values in [(buffers or {}).get(path)] if values}
    if sum(t.numel() for tab, _ in tables for t in tab.values() if t is not None) > REAL_RUN_MAX_ELEMENTS:
        return {}, None
    saved = [(tab, dict(tab)) for tab, _ in tables]
    try:
        with torch.no_grad():
            for tab, is_param in tables:
                for name, t in list(tab.items()):
                    if t is not None and not is_param and name in known.get(id(tab), {}):
                        tab[name] = known[id(tab)][name].clone()
                    elif t is not None:
                        tab[name] = nn.Parameter(_real_like(t, 0.02), t.requires_grad) if is_param else _real_like(t, 0.0)
        real = _real_inputs(inputs, real_inputs)
        recorded, error = record_inputs(root, real, contextlib.nullcontext(), holders, extra_kwargs)
    except Exception as exc:  # noqa: BLE001
        return {}, f"{type(exc).__name__}: {exc}"
    finally:
        for tab, old in saved:
            tab.clear()
            tab.update(old)
    fake = {p: (tuple(_to_fake(a, mode) for a in args), {k: _to_fake(v, mode) for k, v in kw.items()})
            for p, (args, kw) in recorded.items()}
    return {p: (*fake[p], _integers(args, kw)) for p, (args, kw) in recorded.items()}, error


def _to_fake(v: Any, mode: FakeTensorMode) -> Any:
    return mode.from_tensor(v) if isinstance(v, torch.Tensor) else v


def _integers(args: tuple, kwargs: dict) -> dict[Any, torch.Tensor]:
    """The real integer or bool tensors among recorded inputs (``cu_seqlens``, position ids, masks), by
    position or keyword: :func:`capture_one` passes them as constants when export fails on a
    data-dependent size."""
    return {**constant_inputs(args, args), **constant_inputs(kwargs, kwargs)}


def _real_inputs(inputs: Any, given: Any) -> Any:
    """Real tensors for the fake example ``inputs`` (a tuple or dict): the ``given`` real tensor of the same
    key or position and shape when there is one (cast to the fake one's dtype), else :func:`_real_value`."""
    from torch._subclasses.fake_tensor import FakeTensor

    def pick(v: Any, g: Any) -> Any:
        if (isinstance(v, torch.Tensor) and isinstance(g, torch.Tensor) and not isinstance(g, FakeTensor)
                and g.device.type == "cpu" and tuple(g.shape) == tuple(int(s) for s in v.shape)):
            return g.detach().to(v.dtype)
        return _real_value(v)

    if isinstance(inputs, dict):
        given = given if isinstance(given, dict) else {}
        return {k: pick(v, given.get(k)) for k, v in inputs.items()}
    given = tuple(given) if isinstance(given, (tuple, list)) else ()
    return tuple(pick(v, given[i] if i < len(given) else None) for i, v in enumerate(inputs))


def _real_like(t: torch.Tensor, std: float) -> torch.Tensor:
    out = torch.zeros(tuple(int(s) for s in t.shape), dtype=t.dtype)
    if std and out.is_floating_point():
        out.normal_(0.0, std)
    return out


def _real_value(v: Any) -> Any:
    """A real tensor for a fake example input: random normal floats, integers in [0, 2) (valid ids)."""
    if not isinstance(v, torch.Tensor):
        return v
    shape = tuple(int(s) for s in v.shape)
    if v.is_floating_point():
        return torch.randn(shape, dtype=v.dtype)
    if v.dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    return torch.randint(0, 2, shape, dtype=v.dtype)


def capture_one(mod: nn.Module, args: tuple, kwargs: dict, mode: FakeTensorMode,
                fixed: Optional[dict[Any, torch.Tensor]] = None,
                buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None) -> Any:
    """Capture one module on recorded fake inputs: ``symbolic_trace`` (without keyword inputs only), then
    ``export``, then, after a data-dependent failure of that export, ``export`` with the real integer inputs
    ``fixed`` (``{position or keyword: tensor}``, from a real run) as constants, and ``export`` with those and
    the module's integer ``buffers`` (:func:`normaudit.capture.integer_buffers`, paths relative to ``mod``)
    as constants, or with integer factories alone as constants (:func:`normaudit.capture.export_retries`).
    Returns a :class:`normaudit.capture.Capture` (``gm`` None when all fail)."""

    attempts: list[CaptureAttempt] = []
    modules = dict(mod.named_modules())
    methods = [("export", {}, {}, False)] if kwargs else [("symbolic_trace", {}, {}, False),
                                                         ("export", {}, {}, False)]  # fx: no keywords
    methods += export_retries(fixed or {}, buffers or {})
    guarded = False  # the plain export failed on a data-dependent size
    for method, consts, consts_buffers, lift in methods:
        if lift and not guarded:
            continue
        t0 = time.perf_counter()
        label = attempt_label(method, consts, consts_buffers, lift)
        try:
            with quiet(stderr=True):
                if method == "symbolic_trace":
                    gm, user = symbolic_trace_graph(mod, args, mode)
                else:
                    gm, user = export_graph(mod, args, mode, kwargs=kwargs, fixed=consts, buffers=consts_buffers,
                                       lift=lift)
        except Exception as exc:  # noqa: BLE001
            error = one_line(root_cause(exc))
            attempts.append(CaptureAttempt(method=label, ok=False, error=error, location=failure_location(exc),
                                           seconds=round(time.perf_counter() - t0, 3)))
            guarded = guarded or (method == "export" and not lift and data_dependent(error))
            continue
        attempts.append(CaptureAttempt(method=label, ok=True, seconds=round(time.perf_counter() - t0, 3)))
        return Capture(gm=gm, method=method, attempts=attempts, root=mod, modules=modules, user_inputs=user,
                       buffer_values=buffers or {})
    return Capture(gm=None, method="module_walk", attempts=attempts, root=mod, modules=modules,
                   buffer_values=buffers or {})


def buffers_under(buffers: Optional[dict[str, dict[str, torch.Tensor]]], path: str) -> dict[str, dict[str, torch.Tensor]]:
    """The integer buffers (:func:`normaudit.capture.integer_buffers`) of the part at ``path``, by paths
    relative to it."""
    return {p[len(path) + 1:] if p != path else "": v for p, v in (buffers or {}).items() if _under(p, path)}


def _describe(args: tuple, kwargs: dict) -> list[str]:
    def one(name: str, t: Any) -> str:
        if isinstance(t, torch.Tensor):
            return f"{name}: {str(t.dtype).replace('torch.', '')}{list(t.shape)}"
        return f"{name}: {type(t).__name__}"

    return [one(f"arg{i}", a) for i, a in enumerate(args)] + [one(k, v) for k, v in kwargs.items() if v is not None]


def capture_parts(root: nn.Module, inputs: Any, mode: FakeTensorMode, norm_paths: list[str],
                  extra_kwargs: Optional[dict[str, Any]] = None, real_inputs: Any = None,
                  buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None,
                  fewer: Optional[tuple[Any, Any]] = None,
                  until: Optional[float] = None) -> tuple[list[PartCapture], Optional[str]]:
    """Capture the parts of ``root`` that hold the norm modules ``norm_paths`` (see the module docstring).
    ``real_inputs``: the real example inputs ``inputs`` were made from, for the real run (:func:`_record_real`);
    ``buffers``: the integer buffers' values (:func:`normaudit.capture.integer_buffers`), for the real run and
    the parts' constants retries. ``fewer``: ``(fake, real)`` inputs of the main tower alone
    (:func:`normaudit.loaders.inputs.main_tower_inputs`): when the forward on all inputs stops before some
    holders (a vision-language model whose image placeholders do not match its image features), a second
    forward on these records the main tower's modules it did not reach (the language model's blocks).
    ``until``: no part capture starts after this ``time.perf_counter()`` (default :data:`MAX_SECONDS` from now).

    Returns the captured parts (outermost first, none nested in another) and the error that stopped the
    eager forward (None when it ran through). Never raises.
    """
    holders = set(norm_paths)
    for p in norm_paths:  # every ancestor of a norm holds a norm
        parts = p.split(".")
        holders.update(".".join(parts[:i]) for i in range(1, len(parts)))
    holders.discard("")
    recorded, error = _record_best(root, inputs, mode, holders, extra_kwargs, real_inputs, buffers)
    if fewer is not None and len(recorded) < len(holders):
        more, _ = _record_best(root, fewer[0], mode, holders - set(recorded), extra_kwargs, fewer[1], buffers)
        recorded = {**more, **recorded}
    found: list[PartCapture] = []
    budget = {"attempts": 0, "until": time.perf_counter() + MAX_SECONDS if until is None else until,
              "buffers": buffers or {}}
    children = {name: mod for name, mod in root.named_children()}
    for name in children:
        _visit(root, name, holders, recorded, mode, found, budget)
    return found, error


def _record_best(root: nn.Module, inputs: Any, mode: FakeTensorMode, holders: set[str],
                 extra_kwargs: Optional[dict[str, Any]], real_inputs: Any,
                 buffers: Optional[dict] = None) -> tuple[dict, Optional[str]]:
    """The recorded inputs of the ``holders`` (:func:`record_inputs`), recorded in eval mode first: a
    training-mode forward skips blocks at random (layerdrop: ``if self.training and torch.rand([]) <
    p: continue`` in wav2vec2-style encoders, SeamlessM4T's speech encoder), so the blocks it skipped would
    never be captured; eval mode runs every block. Each pass runs on fake tensors, then on real numbers
    (:func:`_record_real`) when the fake one stopped early. A model in training mode whose eval forward
    still misses some holders is recorded again in training mode, and what that pass adds is kept (eval
    recordings win). The modules' own modes are restored after. Returns ``(recorded, error)`` like
    :func:`record_inputs`, the error of the pass that recorded the most."""
    merged: dict = {}
    best: tuple[int, Optional[str]] = (-1, None)
    modes = {m: m.training for m in root.modules()}
    try:
        for train_pass in ([False, True] if root.training else [False]):
            for m, was in modes.items():
                m.training = was if train_pass else False
            recorded, error = record_inputs(root, inputs, mode, holders, extra_kwargs)
            if error is not None and len(recorded) < len(holders):
                more, real_error = _record_real(root, inputs, mode, holders, extra_kwargs, real_inputs, buffers)
                if len(more) > len(recorded):
                    recorded, error = more, real_error
            if len(recorded) > best[0]:
                best = (len(recorded), error)
            merged = {**recorded, **merged}
            if len(merged) == len(holders):
                break
    finally:
        for m, was in modes.items():
            m.training = was
    return merged, best[1]


def _visit(root: nn.Module, path: str, holders: set[str], recorded: dict, mode: FakeTensorMode,
           found: list[PartCapture], budget: dict) -> None:
    if path not in holders:
        return
    mod = root.get_submodule(path)
    if path in recorded and budget["attempts"] < MAX_ATTEMPTS and time.perf_counter() < budget["until"]:
        budget["attempts"] += 1
        args, kwargs, *real = recorded[path]
        sub = capture_one(mod, args, kwargs, mode, real[0] if real else None, buffers_under(budget["buffers"], path))
        sub.inputs_recorded = True
        if sub.gm is not None and not _misses_recorded(sub, path, recorded):
            found.append(PartCapture(path=path, capture=sub, inputs=_describe(args, kwargs)))
            return
    for name, _ in mod.named_children():
        _visit(root, f"{path}.{name}", holders, recorded, mode, found, budget)


def _misses_recorded(sub: Any, path: str, recorded: dict) -> bool:
    """Whether the graph of the part at ``path`` misses a recorded module inside it (one the eval-mode
    recording forward called): a training-mode trace that skipped blocks at random (layerdrop's
    ``torch.rand([]) < p`` is computed for real by ``symbolic_trace``) keeps its children out of the graph;
    then the part's children are captured instead."""
    reached = {_join(path, m) for m in reached_modules(sub)}
    inside = [p for p in recorded if p.startswith(path + ".")]
    return any(not any(_under(r, p) for r in reached) for p in inside)


def reached_modules(cap: Any) -> set[str]:
    """Paths of every module some node of ``cap.gm`` was computed in (:func:`reached_paths`)."""
    return reached_paths(cap.gm, cap.modules)


def reached_paths(gm: Any, modules: dict[str, nn.Module]) -> set[str]:
    """Paths of every module of ``modules`` some node of the graph module ``gm`` was computed in (its
    ``nn_module_stack``, or the ``call_module`` target)."""
    out: set[str] = set()
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_function", "call_method"):
            out.update(module_stack(node, modules))
    return out


def capture_unreached(cap: Any, mode: FakeTensorMode, dtype: torch.dtype) -> list[PartCapture]:
    """Towers the whole-model forward never called (the speech encoder of a text-to-text run), captured alone
    as models of their own (:func:`capture_submodels`); every module a node of the whole graph was computed in
    counts as reached."""
    return capture_submodels(cap, mode, dtype, reached_modules(cap), [])


def capture_submodels(cap: Any, mode: FakeTensorMode, dtype: torch.dtype, reached: set[str],
                      taken: list[PartCapture], until: Optional[float] = None) -> list[PartCapture]:
    """The Hugging Face models of their own (a ``config`` and a ``main_input_name``: a vision encoder, a
    language model, a codec) inside ``cap.modules`` that hold norms no capture reached, each captured alone
    on inputs built for it (:func:`own_inputs`), outermost first.

    A submodule is tried when no module of ``reached`` (whole-model paths) lies in it, it lies in no part of
    ``taken`` (parts already captured) nor of those found here, no part found here lies in it, and it holds a
    norm module (:func:`normaudit.vocabulary.kinds.norm_modules`) in none of them. Parts of ``taken`` may lie in it: its graph then replaces
    them (the caller drops them, :func:`replaced_by`) when it reaches every norm module their graphs reached;
    else it is left to its children. When the submodule alone cannot be captured and holds no part of
    ``taken``, its blocks are (:func:`capture_parts`, on the inputs its own forward gives them); the Hugging
    Face models inside it that those leave uncovered are tried after it, in ``named_modules()`` order. Stops
    at ``until`` (``time.perf_counter()``; default :data:`MAX_SECONDS` from now). Returns the new parts, with
    ``own_inputs`` set. Never raises.
    """
    held = [p.path for p in taken]
    every = [path for path, _, _ in norm_modules(cap.modules) if path]
    norms = [n for n in every if not any(_under(n, p) for p in held) and not any(_under(m, n) for m in reached)]
    found: list[PartCapture] = []
    until = time.perf_counter() + MAX_SECONDS if until is None else until
    for path, mod in cap.modules.items():
        if (not path or time.perf_counter() > until or any(_under(path, p) for p in held + [f.path for f in found])
                or getattr(mod, "main_input_name", None) is None or getattr(mod, "config", None) is None
                or any(_under(m, path) for m in reached) or any(_under(f.path, path) for f in found)
                or not any(_under(n, path) for n in norms)):
            continue
        within = [p for p in taken if _under(p.path, path)]
        found += _capture_submodel(cap, path, mod, mode, dtype, [n for n in norms if _under(n, path)],
                                   (within, every), until)
    return found


def _capture_submodel(cap: Any, path: str, mod: nn.Module, mode: FakeTensorMode, dtype: torch.dtype,
                      norms: list[str], within: tuple[list[PartCapture], list[str]], until: float) -> list[PartCapture]:
    """The submodule at ``path`` captured alone on inputs built for it, or its blocks holding the uncovered
    ``norms`` (:func:`capture_submodels`); ``within``: the parts already captured inside it and every norm
    module path of the model. Returns [] when neither captures, or when its graph misses a norm module the
    parts inside it reached."""

    parts, every = within
    built = own_inputs(mod)
    if built is None:
        return []
    kwargs = {**fake_inputs(built, mode, dtype), **forward_kwargs(forward_params(mod))}
    buffers = buffers_under(getattr(cap, "buffer_values", {}), path)
    sub = capture_one(mod, (), kwargs, mode, constant_inputs(kwargs, built), buffers)
    if sub.gm is not None:
        mine = {_join(path, m) for m in reached_modules(sub)}
        theirs = {_join(p.path, m) for p in parts for m in reached_modules(p.capture)}
        if any(n in theirs and n not in mine for n in every):
            return []
        return [PartCapture(path=path, capture=sub, inputs=_describe((), kwargs), own_inputs=True)]
    if parts:  # its blocks might hold or lie in those parts: its own models of their own are tried instead
        return []
    inner = [n[len(path) + 1:] for n in norms if n.startswith(path + ".")]
    return [PartCapture(path=_join(path, part.path), capture=part.capture, inputs=part.inputs, own_inputs=True)
            for part in capture_parts(mod, kwargs, mode, inner, real_inputs=built, buffers=buffers, until=until)[0]]


def replaced_by(parts: list[PartCapture], new: list[PartCapture]) -> list[PartCapture]:
    """``parts`` without those lying in a part of ``new`` (whose graph replaces theirs), then ``new``."""
    return [p for p in parts if not any(_under(p.path, n.path) for n in new)] + new


def own_inputs(mod: nn.Module) -> Optional[dict[str, torch.Tensor]]:
    """The keyword inputs :func:`normaudit.loaders.inputs.infer_hf_inputs` builds for the Hugging Face model
    ``mod`` (real CPU tensors), or None. ``infer_hf_inputs`` checks its candidates (patches as images or as
    flattened rows, ...) with a forward on the meta device only, so a model whose tensors are fake gets meta
    ones of the same shapes and dtypes meanwhile (restored after); a candidate's meta forward that meets a
    tensor kept elsewhere (a plain attribute) fails, and then the first candidates are used. Never raises."""
    tables = [(m._parameters, True) for m in mod.modules()] + [(m._buffers, False) for m in mod.modules()]
    saved = [(tab, dict(tab)) for tab, _ in tables]
    try:
        for tab, is_param in tables:
            for name, t in list(tab.items()):
                if t is not None:
                    meta = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
                    tab[name] = nn.Parameter(meta, t.requires_grad) if is_param else meta
        built = infer_hf_inputs(mod)
    except Exception:  # noqa: BLE001 - no inputs: the submodule is left to the others
        built = None
    finally:
        for tab, old in saved:
            tab.clear()
            tab.update(old)
    return built[0] if built is not None else None


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def covers_all(cap: Any) -> bool:
    """Whether the captured parts of a failed capture hold every norm module (:func:`normaudit.vocabulary.kinds.norm_modules`)."""
    if cap.gm is not None or not getattr(cap, "parts", None):
        return False
    inside = [p.path for p in cap.parts]
    return all(any(_under(path, p) for p in inside) for path, _, _ in norm_modules(cap.modules) if path)


def coverage(cap: Any, sites: list) -> tuple[list, list]:
    """The report's ``capture.parts`` and ``capture.unaudited`` (``normaudit.report.CapturedPart`` and
    ``UnauditedModule``) for a capture and the sites found from it.

    Without a whole-model graph, the ``method`` of a part captured as a model of its own ends with
    :data:`OWN_INPUTS` (with one, every part is: the note says so). A norm module (as :func:`normaudit.vocabulary.kinds.norm_modules`
    finds them) is unaudited when no site from a graph lies in it: with a
    whole-model graph it was never called by the forward on the inputs used (a vision or speech tower of a
    multimodal model given text only, an unused norm); without one, it lies in no captured part.
    """
    parts = [CapturedPart(module=p.path, class_name=type(p.capture.root).__name__,
                          method=p.capture.method + (OWN_INPUTS if p.own_inputs and cap.gm is None else ""),
                          inputs=p.inputs, sites=sum(_under(s.module, p.path) and s.detected_by != "module_walk"
                                                     for s in sites))
             for p in getattr(cap, "parts", [])]
    graphed = [s.module for s in sites if s.detected_by not in ("module_walk", "checkpoint")]
    if cap.gm is not None:
        reason = ("no norm computation of it in the captured graph: never called by the forward on the inputs "
                  "used (or run inside an op the graph keeps opaque)")
    elif parts:
        reason = "in no part that could be captured alone: found by walking named_modules(), no graph facts"
    else:
        reason = "the model could not be captured: found by walking named_modules(), no graph facts"
    out = []
    for path, mod, _ in norm_modules(cap.modules):
        if path and not any(_under(g, path) for g in graphed):
            out.append(UnauditedModule(module=path, kind=type(mod).__name__, reason=reason))
    return parts, out


def coverage_note(parts: list, unaudited: list, whole: bool) -> list[str]:
    """Notes for the report: which parts were captured alone, and from which capture (on the inputs the whole
    model's forward gave them, or as models of their own on inputs built for them: the ``method`` of such a
    part ends with :data:`OWN_INPUTS`), and the norm modules not audited."""
    notes = []
    own = [p for p in parts if p.method.endswith(OWN_INPUTS)]
    given = [p for p in parts if not p.method.endswith(OWN_INPUTS)]
    if parts and whole:
        notes.append(f"{len(parts)} part(s) the model's forward never called captured alone on inputs of their own "
                     f"({_names(parts)})")
    elif parts:
        notes.append(f"the whole model could not be captured; {len(parts)} part(s) captured alone ({_names(parts)}): "
                     "their sites have graph facts, placement is judged within each part")
    if own and given and not whole:
        notes.append(f"{len(given)} of them on the inputs the model's forward gave them ({_names(given)}), "
                     f"{len(own)} as models of their own on inputs built for them ({_names(own)})")
    elif own and not whole:
        notes.append(f"the model's forward reached no part: the {len(own)} part(s) were captured as models of their "
                     f"own on inputs built for them")
    if unaudited and (whole or parts):
        names = ", ".join(u.module for u in unaudited[:6]) + (f" and {len(unaudited) - 6} more"
                                                                 if len(unaudited) > 6 else "")
        notes.append(f"{len(unaudited)} norm module(s) not audited ({unaudited[0].reason}): {names}")
    return notes


def _names(parts: list) -> str:
    return ", ".join(p.module for p in parts[:6]) + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")
