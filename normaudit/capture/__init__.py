"""Graph capture: a ``torch.fx.GraphModule`` whose nodes carry shapes, on fake tensors.

Methods, in order: ``torch.fx`` symbolic tracing (keeps ``call_module`` nodes; shapes from ``ShapeProp``
under a ``FakeTensorMode``), then ``torch.export.export(strict=False)`` (aten-level, ``nn_module_stack``
on every node). A model built on the meta device is materialised under ``FakeTensorMode`` with
``to_empty(device="cpu")`` first, so no weight memory is allocated. When every method fails in the model's
own mode (e.g. BatchNorm in train mode with one value per channel), the methods are retried in eval mode.
When nothing captures, :func:`capture_model` returns ``gm=None`` and the caller falls back to walking
``named_modules()``.
"""
from __future__ import annotations

import copy
import time
from typing import Any, Optional

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from normaudit.capture.constants import integer_buffers
from normaudit.capture.errors import data_dependent, failure_location, one_line, root_cause
from normaudit.capture.fake import fake_inputs, fakeify_, is_fake, materialize_fake_
from normaudit.capture.methods import attempt_label, attempt_plan, export_graph, symbolic_trace_graph
from normaudit.capture.record import Capture
from normaudit.quiet import quiet
from normaudit.report import CaptureAttempt
from normaudit.vocabulary.kinds import norm_modules


def capture_model(model: nn.Module, inputs: Any, on_meta: bool, dtype: torch.dtype = torch.float32,
                  methods: tuple[str, ...] = ("symbolic_trace", "export"), parts_fallback: bool = True) -> Capture:
    """Capture ``model`` called on ``inputs`` (a tuple or a dict of keyword inputs).

    ``dtype`` is the precision the model will run in: floating parameters and inputs are cast to it on fake
    tensors, so the graph shows which operations compute in half precision. Never raises for a model that
    cannot be captured: the attempts record each failure. After a data-dependent export failure, export is
    retried with the example's real integer inputs as constants (:func:`constant_inputs`); a multimodal
    forward that still fails is retried on its main tower's inputs alone
    (:func:`normaudit.loaders.inputs.main_tower_inputs`). When no method captures the whole model and
    ``parts_fallback`` is set, its parts are captured alone (:mod:`normaudit.capture.parts`), then the
    Hugging Face models of their own inside it that hold norms no part covers, on inputs built for each
    (:func:`normaudit.capture.parts.capture_submodels`: a forward that fails at once records no part).
    """
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    if not on_meta:
        model = copy.deepcopy(model)  # the caller's real weights stay untouched
    if dtype != torch.float32:
        model.to(dtype)  # on meta or on the private copy, before fake tensors replace the storage
    buffers = integer_buffers(model, on_meta) if not is_fake(model) else {}
    with mode:
        if on_meta:
            materialize_fake_(model, mode)
        elif not is_fake(model):
            fakeify_(model, mode)
    modules = dict(model.named_modules())
    fake_args = fake_inputs(inputs, mode, dtype)
    attempts: list[CaptureAttempt] = []
    was_training = model.training
    # Per-module modes, restored after an eval-mode retry: a BatchNorm the user froze with .eval() inside
    # a training model must still read as frozen.
    modes = {name: m.training for name, m in modules.items()}
    found, train_error = _try_methods(model, fake_args, inputs, mode, methods, attempts, buffers=buffers)
    if found is None and isinstance(inputs, dict):
        from normaudit.loaders.inputs import main_tower_inputs

        fewer = main_tower_inputs(model, inputs)  # a multimodal forward that fails: its main tower alone
        if fewer is not None:
            _restore_modes(modules, modes)
            found, _ = _try_methods(model, fake_inputs(fewer, mode, dtype), fewer, mode, ("export",), attempts,
                                    " (main tower's inputs only)", buffers)
    _restore_modes(modules, modes)
    if found is None and any("requires_grad" in (a.error or "") for a in attempts):
        found, _ = _without_grad(model, fake_args, inputs, mode, methods, attempts, buffers)
        _restore_modes(modules, modes)
    if found is not None:
        gm, user, method, train_pass = found
        cap = Capture(gm=gm, method=method, attempts=attempts, root=model, modules=modules,
                      user_inputs=user, eval_fallback=not train_pass and was_training,
                      train_error=train_error if not train_pass else None, buffer_values=buffers)
        if parts_fallback:
            from normaudit.capture.parts import capture_unreached

            with quiet(stderr=True):
                cap.parts = capture_unreached(cap, mode, dtype)
        return cap
    from normaudit.capture.parts import MAX_SECONDS, capture_submodels, replaced_by

    until = time.perf_counter() + MAX_SECONDS  # the parts and the submodels share one budget
    parts, parts_error = (_capture_parts(model, fake_args, mode, modules, inputs, buffers, dtype, until)
                          if parts_fallback else ([], None))
    _restore_modes(modules, modes)
    cap = Capture(gm=None, method="module_walk", attempts=attempts, root=model, modules=modules,
                  train_error=train_error, parts=parts, parts_error=parts_error, buffer_values=buffers)
    if parts_fallback:  # the models of their own that hold norms no part covers (a forward that fails at once)
        with quiet(stderr=True):
            cap.parts = replaced_by(parts, capture_submodels(cap, mode, dtype, set(), parts, until))
    return cap


def _without_grad(model: nn.Module, fake_args: Any, inputs: Any, mode: FakeTensorMode, methods: tuple[str, ...],
                  attempts: list[CaptureAttempt], buffers: dict) -> tuple[Optional[tuple], Optional[str]]:
    """:func:`_try_methods` again with every parameter's ``requires_grad`` off, restored afterwards: an op that
    refuses to trace with inputs needing grad (FlexAttention on CPU: "does not support backward on CPU.
    Please set the input requires_grad to False") captures then; the audit reads no gradient. The model is the
    capture's own (a copy of a real model, or the meta model materialised for it), so the user's is untouched."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        return _try_methods(model, fake_args, inputs, mode, methods, attempts, " (parameters without grad)",
                            buffers)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _try_methods(model: nn.Module, fake_args: Any, inputs: Any, mode: FakeTensorMode, methods: tuple[str, ...],
                 attempts: list[CaptureAttempt], note: str = "",
                 buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None) -> tuple[Optional[tuple], Optional[str]]:
    """Run the capture methods (:func:`attempt_plan`) in the model's own mode, then in eval mode when it was
    training; each attempt is appended to ``attempts`` (labelled with ``note``). Returns ``((gm,
    user_inputs, method, train_pass) or None, the first error in training mode)``; the model is left in
    the mode of the pass that captured (eval after a failed training pass). A training-mode graph that
    skipped blocks of a stack (:func:`skipped_blocks`) counts as failed; it is returned (its attempt then
    reads as the success it was) where no eval-mode method captures, or where the first eval-mode graph skips
    the same blocks (a forward that leaves them out by design in both modes, not at random)."""
    train_error = None
    held = None  # a training-mode graph that skipped blocks (skipped_blocks): kept where eval captures nothing
    was_training = model.training
    for train_pass in ([True, False] if was_training else [False]):
        if not train_pass:
            model.eval()
        guarded = False  # the plain export of this pass failed on a data-dependent size
        for method, fixed, consts, lift in attempt_plan(methods, fake_args, inputs, buffers or {}):
            if lift and not guarded:
                continue  # constants only where export failed on a data-dependent size
            t0 = time.perf_counter()
            label = attempt_label(method, fixed, consts, lift) + note
            label = label if train_pass == was_training else f"{label} (eval)"
            try:
                with quiet(stderr=True):
                    if method == "symbolic_trace":
                        gm, user = symbolic_trace_graph(model, fake_args, mode)
                    else:
                        gm, user = export_graph(model, fake_args, mode, fixed=fixed, buffers=consts, lift=lift)
            except Exception as exc:  # noqa: BLE001 - any failure moves on to the next method
                error = one_line(root_cause(exc))
                attempts.append(CaptureAttempt(method=label, ok=False, error=error, location=failure_location(exc),
                                               seconds=round(time.perf_counter() - t0, 3)))
                guarded = guarded or (method == "export" and not lift and data_dependent(error))
                if train_pass and train_error is None:
                    train_error = error
                continue
            skipped = skipped_blocks(gm, dict(model.named_modules())) if train_pass else []
            if skipped and held is None:  # layerdrop drawn in Python: the eval pass runs every block
                error = (f"the training-mode trace skipped {len(skipped)} block(s) of a stack at random "
                         f"(layerdrop): {', '.join(skipped[:3])}")
                attempts.append(CaptureAttempt(method=label, ok=False, error=error,
                                               seconds=round(time.perf_counter() - t0, 3)))
                held, train_error = (gm, user, method, train_pass, set(skipped)), train_error or error
                break
            if held is not None and held[4] <= set(skipped_blocks(gm, dict(model.named_modules()))):
                break  # the eval graph skips them too (by design, not at random): the training-mode graph stands
            attempts.append(CaptureAttempt(method=label, ok=True, seconds=round(time.perf_counter() - t0, 3)))
            return (gm, user, method, train_pass), train_error
    if held is not None:
        attempts[:] = [a if a.error is None or not a.error.startswith("the training-mode trace skipped") else
                       CaptureAttempt(method=a.method, ok=True, seconds=a.seconds) for a in attempts]
        return held[:4], None
    return None, train_error


def skipped_blocks(gm: fx.GraphModule, modules: dict[str, nn.Module]) -> list[str]:
    """Paths of the blocks of a stack (children of one ``nn.ModuleList``) that hold a norm module and in which
    no node of ``gm`` was computed, while a sibling of the same class has nodes there or the module holding
    the stack does (every block dropped): what a training-mode forward that skips blocks at random leaves out
    of the graph. A tower that never ran (its owner has no node) is not such a stack. LayerDrop drawn
    in Python is computed for real while tracing (VITS's text encoder: ``np.random.uniform(0, 1) <
    layerdrop``, modeling_vits.py:1113-1115; Fan et al. 2019, arXiv 1909.11556), so a norm of a skipped
    block would be no site. [] for a graph that reached every such block."""
    from normaudit.capture.parts import _under, reached_paths

    reached = reached_paths(gm, modules)
    norms = [path for path, _, _ in norm_modules(modules) if path]
    out: list[str] = []
    for path, mod in modules.items():
        if not isinstance(mod, nn.ModuleList):
            continue
        kids = [(f"{path}.{name}" if path else name, child) for name, child in mod.named_children()]
        ran = {type(child) for p, child in kids if p in reached}
        owner = path.rpartition(".")[0]
        owner_ran = owner in reached or (owner == "" and bool(reached))  # it ran, yet every block was dropped
        out += [p for p, child in kids if (type(child) in ran or owner_ran) and p not in reached
                and any(_under(n, p) for n in norms)]
    return out


def _capture_parts(model: nn.Module, fake_args: Any, mode: FakeTensorMode, modules: dict[str, nn.Module],
                   real_inputs: Any = None, buffers: Optional[dict] = None,
                   dtype: torch.dtype = torch.float32, until: Optional[float] = None) -> tuple[list, Optional[str]]:
    """:func:`normaudit.capture.parts.capture_parts` over the norm modules :func:`normaudit.vocabulary.kinds.norm_modules` finds
    (``real_inputs``: the example inputs ``fake_args`` were made from; ``buffers``: :func:`integer_buffers`;
    the main tower's inputs alone, :func:`normaudit.loaders.inputs.main_tower_inputs`, record what the
    forward on all inputs does not reach; ``until``: no part capture starts after this ``time.perf_counter()``)."""
    from normaudit.loaders.inputs import main_tower_inputs

    from normaudit.capture.parts import capture_parts
    from normaudit.loaders.inputs import forward_kwargs, forward_params

    norm_paths = [path for path, _, _ in norm_modules(modules) if path]
    if not norm_paths:
        return [], None
    extra = forward_kwargs(forward_params(model)) if isinstance(fake_args, dict) else {}
    with quiet(stderr=True):
        fewer = main_tower_inputs(model, real_inputs) if isinstance(real_inputs, dict) else None
        fewer_pair = (fake_inputs(fewer, mode, dtype), fewer) if fewer is not None else None
        return capture_parts(model, fake_args, mode, norm_paths, extra, real_inputs, buffers, fewer_pair, until)


def _restore_modes(modules: dict[str, nn.Module], modes: dict[str, bool]) -> None:
    for name, mod in modules.items():
        mod.training = modes[name]
