"""The pipeline end to end: target -> capture -> facts -> rules -> report.

:func:`run_audit` is what the CLI and :mod:`normaudit.testing` call.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from normaudit import __version__
from normaudit.audit_onnx import onnx_report
from normaudit.capture import capture_model
from normaudit.capture.errors import config_error, rope_section_conflicts, unset_config_keys
from normaudit.capture.parts import coverage
from normaudit.engine.evaluator import evaluate
from normaudit.engine.loader import load_rules
from normaudit.engine.options import RuleOptions
from normaudit.engine.schema import Rule
from normaudit.errors import UsageError
from normaudit.facts.context import FactContext, Facts
from normaudit.facts.eps import ConfigSource
from normaudit.facts.axes import parse_input_axes
from normaudit.report import (SEVERITY_RANK, CaptureInfo, Finding, ModelFacts, Report, Summary,
                              TargetInfo)
from normaudit.suppress import filter_findings
from normaudit.loaders.config import is_library, load_config, model_configs
from normaudit.loaders import ModelUnderAudit, load_model
from normaudit.loaders.inputs import infer_inputs
from normaudit.phases import phase
from normaudit.pipeline import collect_facts
from normaudit.options import AuditOptions
from normaudit.vocabulary.dtypes import AUDIT_DTYPES, torch_dtype



def _selected(rule: Rule, select: list[str], ignore: list[str]) -> bool:
    def match(patterns: list[str]) -> bool:
        return any(rule.id.startswith(p) or rule.name == p or rule.category == p for p in patterns)

    if select and not match(select):
        return False
    return not match(ignore)


def build_report(opts: AuditOptions, mua: ModelUnderAudit, rules: dict[str, Rule]) -> Report:
    """Capture ``mua.model``, derive facts, evaluate ``rules`` and assemble the report.

    The weights audited with the model are ``opts.checkpoint``, else those beside a Hugging Face
    ``config.json`` the model was built from; a checkpoint given as the target itself is inspected alone
    (:func:`checkpoint_only_report`), an ONNX file read as its own graph (:func:`normaudit.audit_onnx.onnx_report`).
    """
    from normaudit.loaders.checkpoint import open_checkpoint

    if mua.kind in ("checkpoint", "gguf"):
        return checkpoint_only_report(opts, mua, rules)
    if mua.kind == "onnx":
        return onnx_report(opts, mua, rules)
    path = checkpoint_path(opts, mua)
    if path is None:
        return _build_report(opts, mua, rules, None)
    phase("checkpoint")
    with open_checkpoint(path) as ckpt:
        return _build_report(opts, mua, rules, ckpt)


def checkpoint_path(opts: AuditOptions, mua: ModelUnderAudit) -> Optional[str]:
    """``--checkpoint``, else the directory of a Hugging Face ``config.json`` that has weights beside it."""
    if opts.checkpoint:
        return opts.checkpoint
    if mua.kind == "hf_dir" and mua.weights and mua.file:
        return str(Path(mua.file).parent)
    return None


#: ``torch.manual_seed`` of inferred inputs (random token ids, pixel values): the same inputs on every run, so
#: a data-dependent branch, a probe's measurement and a report do not change between runs
INPUT_SEED = 0


def _inferred_inputs(model: Any) -> tuple[Any, str]:
    """:func:`normaudit.loaders.inputs.infer_inputs` under :data:`INPUT_SEED`, the caller's RNG state kept
    (``torch.random.fork_rng``). Raises ValueError as ``infer_inputs`` does."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INPUT_SEED)
        return infer_inputs(model)


@dataclasses.dataclass
class _ConfigInForce:
    """The config the eps rules compare with (:func:`_config_in_force`): its keys, where it came from
    (``source``: a file name, ``origin``: ``cli``, ``checkpoint``, ``library``, ``model`` or None), every
    config source the eps facts read (:class:`~normaudit.facts.eps.ConfigSource`) and the model's own configs."""

    data: dict[str, Any]
    source: Optional[str]
    origin: Optional[str]
    sources: list[ConfigSource]


def _inputs_of(opts: AuditOptions, mua: ModelUnderAudit) -> tuple[Any, Optional[str]]:
    """The example inputs and what was assumed about them: the target's own, else inferred from the model
    (:func:`_inferred_inputs`). Raises UsageError when none can be inferred."""
    if mua.inputs is not None:
        return mua.inputs, mua.inputs_assumed
    phase("inputs")
    try:
        return _inferred_inputs(mua.model)
    except ValueError as err:
        raise UsageError(str(err), file=opts.target) from err


def _config_in_force(opts: AuditOptions, mua: ModelUnderAudit, ckpt: Any) -> _ConfigInForce:
    """The config of the audit, first found of: ``opts.config_data``, ``--config``, the checkpoint's config
    (:func:`checkpoint_config_source`, unless the config came from the command line), the model's own
    (:func:`normaudit.loaders.config.model_configs`); an empty one with no source when there is none."""
    own = model_configs(mua.model)
    own_config = dict(own[0].data) if own else None
    config: dict[str, Any] = {}
    source = origin = None
    if own_config:
        # A config owned by a library (transformers' PretrainedConfig) comes with code that may keep another
        # eps on purpose; a plain dict/dataclass on a user's model is the user's own statement of intent.
        config, source = dict(own_config), own[0].source
        origin = "library" if own[0].library else "model"
    if opts.config:
        config, source, origin = load_config(opts.config), Path(opts.config).name, "cli"
    if opts.config_data is not None:
        config, source, origin = dict(opts.config_data), "the given config", "cli"
    ckpt_config = checkpoint_config_source(ckpt, mua, own_config)
    if ckpt_config is not None and origin != "cli":
        config, source, origin = dict(ckpt_config.data), ckpt_config.source, ckpt_config.origin
    sources = [s for s in (ConfigSource("cli", source, config) if origin == "cli" else None, ckpt_config)
               if s is not None] + own_config_sources(own)
    return _ConfigInForce(data=config, source=source, origin=origin, sources=sources)


def _batch_of(opts: AuditOptions, inputs: Any) -> Optional[int]:
    """``--batch-size``, else the first dimension of the first input tensor (None when it has none)."""
    if opts.batch_size is not None:
        return opts.batch_size
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else (inputs[0] if inputs else None)
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return int(first.shape[0])
    return None


def _evaluated_findings(opts: AuditOptions, mua: ModelUnderAudit, rules: dict[str, Rule], facts: Facts,
                        cfg: _ConfigInForce, options: RuleOptions, by_path: dict) -> tuple[list[Finding], Any]:
    """The selected rules over the sites and model facts, less the suppressed findings
    (:func:`normaudit.suppress.filter_findings`), sorted by severity, module and rule; and the filter's result
    (its notes). A numerics finding without a source gets its module's construction line from ``by_path``."""
    sites = [r.site for r in facts.records]
    active = [r for r in rules.values() if _selected(r, opts.select, opts.ignore)]
    findings = evaluate(active, sites, facts.model, cfg.data, cfg.source, options)
    kept = filter_findings(findings, sites=sites, model=facts.model, rules=rules, active=active,
                           per_module_ignores=opts.per_module_ignores, config=cfg.data, config_source=cfg.source,
                           options=options, target_file=mua.file, factory=mua.factory)
    findings = kept.findings
    for f in findings:  # a numerics finding may name any module (the producer): its construction line
        if f.source is None and f.category == "numerics" and f.module in by_path:
            f.source = by_path[f.module]
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], f.module, f.rule_id))
    return findings, kept


def _summary(sites: list, findings: list[Finding]) -> Summary:
    """The report's counts: sites (and per kind) and findings per severity."""
    by_kind: dict[str, int] = {}
    for s in sites:
        by_kind[s.kind] = by_kind.get(s.kind, 0) + 1
    return Summary(sites=len(sites), by_kind=by_kind,
                   errors=sum(f.severity == "error" for f in findings),
                   warnings=sum(f.severity == "warning" for f in findings),
                   infos=sum(f.severity == "info" for f in findings))


def _capture_notes(cap: Any, info: CaptureInfo) -> list[str]:
    """What the report says about the capture: the parts' coverage, a failed capture, the eval-mode fallback."""
    from normaudit.capture.parts import coverage_note

    notes = coverage_note(info.parts, info.unaudited, cap.complete)
    if not cap.complete and not info.parts:
        notes.append("capture failed: sites come from walking named_modules(); placement, axes and formula facts "
                     "are unknown (report incomplete)")
    if cap.eval_fallback:
        notes.append(f"captured in eval mode: in train mode the model failed ({cap.train_error})")
    return notes


def _numerics_notes(section: Any) -> list[str]:
    """What the report says about the ``--probe numerics`` run (``section``: its report section, or None)."""
    if section is None:
        return []
    notes = section.notes + ([f"numerics probe failed: {section.error}"] if section.error else [])
    if section.weights == "random":
        notes.append("numerics probe: no checkpoint, so the statistics come from the factory's random "
                     "initial weights, not trained ones (give --checkpoint)")
    return notes


def _build_report(opts: AuditOptions, mua: ModelUnderAudit, rules: dict[str, Rule], ckpt: Any) -> Report:
    """The audit of a model target in named steps: inputs, config, capture and facts (:func:`_capture_facts`),
    the numerics probe, the rules, then the report's capture info, notes and summary."""
    dtype = torch_dtype(opts.dtype)
    inputs, assumed = _inputs_of(opts, mua)
    cfg = _config_in_force(opts, mua, ckpt)
    declared = parse_input_axes(opts.input_axes, inputs) if opts.input_axes else None
    batch = _batch_of(opts, inputs)
    numerics = [p for p in opts.probes if p.startswith("numerics")]
    if numerics:
        from normaudit.probes.numerics import check_size

        check_size(mua.model, opts.max_params, mua.file or opts.target)
    # Capture turns a meta model into fake tensors in place; probes that run real numbers get an untouched
    # meta copy or the user's real model (capture works on its own copy of a real model). The copy of a meta
    # model is made only before the model itself is captured (_untouched_probe_model): the depth-independent
    # capture works on a copy of its reduced model and leaves the user's untouched.
    by_path = {name: mua.origins[id(m)] for name, m in mua.model.named_modules() if id(m) in mua.origins}
    phase("capture")
    options = RuleOptions(dtype=opts.dtype, batch_size=batch, checkpoint=ckpt is not None, probes=list(opts.probes),
                          config_origin=cfg.origin, library_model=_library_config(mua.model))
    shared = dict(input_axes=declared, probe_model=mua.model, inputs=inputs, config=cfg.data,
                  config_source=cfg.source, config_sources=cfg.sources, checkpoint=ckpt, dtype=opts.dtype,
                  batch_size=batch, probes=list(opts.probes), config_origin=cfg.origin,
                  build_fn=getattr(mua, "build_fn", None), file=mua.file or opts.target)
    fast = getattr(opts, "repeats", True) and not opts.probes and ckpt is None
    cap, ctx, facts = _capture_facts(opts, mua, inputs, dtype, by_path, shared, options, fast)
    section = facts.numerics
    if section is not None:
        options.numerics = section
    phase("rules")
    sites = [r.site for r in facts.records]
    findings, kept = _evaluated_findings(opts, mua, rules, facts, cfg, options, by_path)
    facts.model.config_source = cfg.source
    info = CaptureInfo(method=options.capture_method, complete=cap.complete, attempts=cap.attempts,
                       num_nodes=len(cap.gm.graph.nodes) if cap.gm is not None else 0,
                       inputs=_describe_inputs(inputs), inputs_assumed=assumed, fake_tensors=True)
    parts, unaudited = coverage(ctx.cap, sites)
    identity = set(facts.model.identity_norms)
    info.parts, info.unaudited = parts, [u for u in unaudited if u.module not in identity]
    notes = (list(facts.notes) + list(mua.notes) + kept.notes() + _capture_notes(cap, info)
             + _numerics_notes(section))
    target = TargetInfo(path=opts.target, kind=target_kind(mua), factory=mua.factory, config=opts.config,
                        checkpoint=str(ckpt.path) if ckpt is not None else None, dtype=opts.dtype, batch_size=batch,
                        resolved=mua.resolved)
    return Report(version=__version__, target=target, capture=info, model=facts.model, sites=sites,
                  findings=findings, summary=_summary(sites, findings), notes=notes, numerics=section)


def _capture_facts(opts: AuditOptions, mua: ModelUnderAudit, inputs: Any, dtype: torch.dtype, by_path: dict,
                   shared: dict, options: RuleOptions, fast: bool) -> tuple[Any, FactContext, Facts]:
    """Capture ``mua.model`` and collect its facts: the one place the capture is chosen. With ``fast``, a
    model with stacks of identical blocks is captured with each stack reduced to four blocks and the facts
    carried over to the others (:mod:`normaudit.capture.repeats`); whenever that cannot be proven exact, the
    full model is captured. Returns ``(capture, context, facts)``; ``context.cap`` sees the full model's
    modules. Sets ``capture_method``, ``train_error``, ``capture_error``, ``unset_config_keys``,
    ``config_conflicts`` and ``config_error`` in the rules' ``options``."""
    from normaudit.capture import repeats
    from normaudit.capture.parts import covers_all

    plan = repeats.plan_repeats(mua.model, mua.origins) if fast else None
    # a meta model is materialised in place: the reduced one gets its own (free) copy of the kept modules
    if plan is not None:
        target = copy.deepcopy(plan.reduced) if mua.on_meta else plan.reduced
    else:
        target = _untouched_probe_model(mua, shared)
    cap = capture_model(target, inputs, mua.on_meta, dtype)
    if plan is not None and (any(repeats.ELIDED_MESSAGE in (a.error or "") for a in cap.attempts)
                             or not repeats.check_reduced(plan, cap, inputs, dtype)):
        plan = None
        cap = capture_model(_untouched_probe_model(mua, shared), inputs, mua.on_meta, dtype)
    if not cap.complete and mua.inputs is not None and not mua.inputs_assumed:
        check_inputs_fit(cap, inputs, dtype, mua.file or opts.target)
    # Capture works on its own copy of a real model: carry the construction lines over by module path.
    origins = dict(mua.origins)
    origins.update({id(cap.modules[n]): loc for n, loc in by_path.items() if n in cap.modules})
    options.capture_method = "parts" if covers_all(cap) else cap.method
    options.train_error = cap.train_error
    options.capture_error = next((a.error for a in cap.attempts if not a.ok), None)
    if not cap.complete:  # a config the forward cannot run with: a value unset (NK110), values that disagree (NK111)
        errors = [a.error for a in cap.attempts if not a.ok]
        own = [(s.scope, s.data) for s in shared["config_sources"] if s.scope is not None]
        options.unset_config_keys = unset_config_keys(errors, own)
        options.config_conflicts = rope_section_conflicts(errors, own)
        if options.unset_config_keys or options.config_conflicts:
            options.config_error = config_error(errors, options.unset_config_keys)
    ctx = FactContext(cap=cap, origins=origins, train_error=cap.train_error, **shared)
    phase("facts")
    facts = collect_facts(ctx, plan)
    if plan is None:
        return cap, ctx, facts
    if facts is None:
        phase("capture")
        return _capture_facts(opts, mua, inputs, dtype, by_path, shared, options, False)
    for attempt in cap.attempts:
        if attempt.ok:
            attempt.method += " (depth-independent: " + "; ".join(
                f"{s.child(s.elided[0])}..{s.elided[-1]} carried over from {s.child(s.rep)}" for s in plan.stacks) + ")"
    ctx.cap = dataclasses.replace(cap, modules=repeats.full_view(plan, cap))
    return cap, ctx, facts


def _untouched_probe_model(mua: ModelUnderAudit, shared: dict) -> nn.Module:
    """``mua.model``, about to be captured whole: a meta model is materialised (fake tensors) in place by the
    capture, so ``shared["probe_model"]`` becomes a deep copy of it first, still on meta (free of storage)."""
    if mua.on_meta and shared["probe_model"] is mua.model:
        shared["probe_model"] = copy.deepcopy(mua.model)
    return mua.model


#: Errors of fake tensors themselves (data-dependent values, ops without a fake kernel): the model may be fine
#: on real tensors, so they never blame the inputs.
_FAKE_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
                "UnsupportedFakeTensorException", "GuardOnDataDependentSymNode", "MetadataMismatchError")


def check_inputs_fit(cap: Any, inputs: Any, dtype: torch.dtype, where: str) -> None:
    """After every capture method failed on the user's own ``example_inputs()``: run the model's forward
    eagerly on fake tensors of those inputs. When that fails too (a shape that does not fit, a crash in the
    model's code), no audit can happen: raise UsageError with the cause and the user's line. Failures that
    only fake tensors have (:data:`_FAKE_LIMITS`) are left to the capture warning (NK101)."""
    from normaudit.capture.fake import fake_inputs
    from normaudit.loaders.pyfile import user_error

    root = cap.root
    tensor = next(iter(list(root.parameters()) + list(root.buffers())), None)
    mode = getattr(tensor, "fake_mode", None)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
    args = fake_inputs(inputs, mode, dtype)
    try:
        with mode, torch.no_grad():
            root(**args) if isinstance(args, dict) else root(*args)
    except Exception as exc:  # noqa: BLE001 - the model's forward may raise anything
        names = {type(e).__name__ for e in _chain(exc)}
        if names & set(_FAKE_LIMITS):
            return
        err = user_error(exc, Path(where), "the model's forward fails on its example_inputs()")
        if dtype != torch.float32:
            err = _blame_dtype_mismatch(err, root, fake_inputs(inputs, mode, dtype), mode, where, dtype)
        raise err from exc


def _blame_dtype_mismatch(err: UsageError, root: nn.Module, args: Any, mode: Any, where: str,
                          dtype: torch.dtype) -> UsageError:
    """``err`` (the forward failed in a reduced precision) pointed at the first module whose input dtype
    differs from its weights' (:func:`normaudit.probes.dtype_mismatch.first_dtype_mismatch`), with the line that
    calls it: on fake tensors a float32 tensor the forward made passes a float16 Linear and fails modules later.
    ``err`` unchanged when every module's inputs match its weights."""
    from normaudit.probes.dtype_mismatch import first_dtype_mismatch, mismatch_advice

    found = first_dtype_mismatch(root, args, mode, where)
    if found is None:
        return err
    name = str(dtype).removeprefix("torch.")
    return UsageError(f"{err.message}; {mismatch_advice(found, name)}", file=err.file,
                      line=found.line if found.line is not None else err.line)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 20:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _library_config(model: Any) -> bool:
    """True when the model is a library's: its class or its ``config`` comes from a library
    (:func:`normaudit.loaders.config.is_library`: transformers, diffusers, timm, anything installed)."""
    cfg = getattr(model, "config", None)
    return is_library(type(model)) or (cfg is not None and is_library(type(cfg)))


def own_config_sources(own: list) -> list[ConfigSource]:
    """The configs the model keeps (:func:`normaudit.loaders.config.model_configs`) as config sources, each
    scoped to the submodule keeping it (origin ``library`` for a library's config)."""
    return [ConfigSource("library" if c.library else "model", c.source, dict(c.data), scope=c.path) for c in own]


def checkpoint_config_source(ckpt: Any, mua: ModelUnderAudit, own_config: Optional[dict]) -> Optional[ConfigSource]:
    """The config that came with the checkpoint, unless it is the very file the model was built from. Its origin
    is ``library`` when the model is a transformers model and the config names the same ``model_type`` (the
    library's code then decides which eps each norm keeps), else ``checkpoint``."""
    if ckpt is None or not ckpt.config or not ckpt.config_source:
        return None
    where = ckpt.config_source
    file_part = where.split(":__metadata__")[0]
    if mua.file and Path(file_part).is_file() and Path(file_part).resolve() == Path(mua.file).resolve():
        return None
    library = (_library_config(mua.model) and bool(own_config)
               and ckpt.config.get("model_type") == (own_config or {}).get("model_type"))
    name = Path(file_part).name + where[len(file_part):]
    return ConfigSource("library" if library else "checkpoint", f"{name} (with the checkpoint)", dict(ckpt.config))


def _inspect_checkpoint(path: str) -> Any:
    """A checkpoint's weights-only inspection (:class:`normaudit.audit_gguf.WeightsOnly`): its norms found by key
    name and shape (:func:`normaudit.loaders.checkpoint.inspect_norm_params`), gain form unknown, the config
    beside or inside it."""
    import math

    from normaudit.audit_gguf import WeightsOnly
    from normaudit.loaders.checkpoint import inspect_norm_params, open_checkpoint

    with open_checkpoint(path) as ckpt:
        sites = [g.to_site() for g in inspect_norm_params(ckpt)]
        config, config_source = dict(ckpt.config or {}), ckpt.config_source
        num_parameters = sum(math.prod(ckpt.shape(k)) for k in ckpt.keys())
        fmt, weights_path, tensors = ckpt.format, ckpt.weights_path, len(ckpt)
    for s in sites:
        s.gain_form = "unknown"
    model = ModelFacts(class_name="checkpoint only", num_parameters=num_parameters, config_source=config_source)
    note = (f"checkpoint only ({fmt}, {tensors} tensors, {weights_path}): no model code, so norms were found by "
            "key name and shape, kinds are guesses, eps, axes and placement are unknown and only the checkpoint "
            "rules ran; audit the model with --checkpoint for the rest")
    return WeightsOnly(sites=sites, config=config, config_source=config_source,
                       config_origin="checkpoint" if config else None, model=model, notes=[note])


def target_kind(mua: ModelUnderAudit) -> str:
    """The report's ``target.kind``: ``hub`` for a hub id, else the kind of what was loaded."""
    return "hub" if mua.hub else mua.kind


def checkpoint_only_report(opts: AuditOptions, mua: ModelUnderAudit, rules: dict[str, Rule]) -> Report:
    """Weights without model code, a checkpoint or a GGUF file: its norms found by key or tensor name
    (:func:`_inspect_checkpoint`, :func:`normaudit.audit_gguf.inspect_gguf`), each a site with ``weights``; kinds
    are guesses, nothing is captured (``capture.method`` ``none``) and only the checkpoint rules run."""
    path = mua.file or opts.target
    if opts.checkpoint and Path(opts.checkpoint).resolve() != Path(path).resolve():
        raise UsageError("the target is a checkpoint already: give --checkpoint with a model target only",
                         file=opts.checkpoint)
    if mua.kind == "gguf":
        from normaudit.audit_gguf import inspect_gguf

        inspected = inspect_gguf(opts, path)
    else:
        inspected = _inspect_checkpoint(path)
    sites, model, config, config_source = inspected.sites, inspected.model, inspected.config, inspected.config_source
    options = RuleOptions(dtype=opts.dtype, batch_size=opts.batch_size, checkpoint=True, capture_method="none",
                          config_origin=inspected.config_origin, checkpoint_only=True)
    # Without model code only the checkpoint's own facts exist: rules over eps, axes, placement or formulas
    # would read facts that are unknown here, so only the checkpoint rules run.
    active = [r for r in rules.values() if r.category == "checkpoint" and _selected(r, opts.select, opts.ignore)]
    findings = evaluate(active, sites, model, config, config_source, options)
    kept = filter_findings(findings, sites=sites, model=model, rules=rules, active=active,
                           per_module_ignores=opts.per_module_ignores, config=config, config_source=config_source,
                           options=options, target_file=None)
    findings = kept.findings
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], f.module, f.rule_id))
    notes = inspected.notes + list(mua.notes) + kept.notes()
    if any(p.startswith("numerics") for p in opts.probes):
        notes.append("--probe numerics needs model code to run: a checkpoint alone was only inspected (give the model "
                     "file with --checkpoint)")
    summary = _summary(sites, findings)
    target = TargetInfo(path=opts.target, kind=target_kind(mua), config=opts.config, checkpoint=str(path),
                        dtype=opts.dtype, batch_size=opts.batch_size, resolved=mua.resolved)
    info = CaptureInfo(method="none", complete=False, fake_tensors=False)
    return Report(version=__version__, target=target, capture=info, model=model, sites=sites, findings=findings,
                  summary=summary, notes=notes)


def _describe_inputs(inputs: Any) -> list[str]:
    def one(name: str, t: Any) -> str:
        if isinstance(t, torch.Tensor):
            return f"{name}: {str(t.dtype).replace('torch.', '')}{list(t.shape)}"
        return f"{name}: {type(t).__name__}"

    if isinstance(inputs, dict):
        return [one(k, v) for k, v in inputs.items()]
    return [one(f"arg{i}", v) for i, v in enumerate(inputs)]


def run_audit(opts: AuditOptions, rules: Optional[dict[str, Rule]] = None) -> Report:
    """Load the target and audit it. Raises UsageError for bad input.

    The target's import folders (:func:`~normaudit.loaders.pyfile.target_search_paths`) stay on ``sys.path``
    for the whole audit, so imports inside ``build_model()``, ``example_inputs()`` or ``forward`` work."""
    if opts.dtype not in AUDIT_DTYPES:
        raise UsageError(f"unknown dtype {opts.dtype!r}; use float32, float16 or bfloat16")
    from normaudit.loaders.pyfile import on_sys_path, target_search_paths

    rules = rules if rules is not None else load_rules(opts.rules_dirs)
    with on_sys_path(target_search_paths(opts.target)):  # imports inside build_model()/forward, as at import
        mua = load_model(opts.target, opts.max_params)
        return build_report(opts, mua, rules)
