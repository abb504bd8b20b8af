"""The sweep's worker: audits targets one at a time, as a long-lived process the driver restarts on a timeout.

Protocol: one JSON job per line on stdin (``{"corpus": "transformers", "name": "llama", "dir": ...}`` or
``{"corpus": "timm", "name": "resnet18", "family": "resnet", "dir": ...}``); one JSON result per job
written to the file descriptor given as ``--result-fd``. Everything the audited code and normaudit print
goes to ``<dir>/log.txt``, never to the result channel.

Each job: (1) write the target as a user would hand it to normaudit (an HF config directory via
``config.save_pretrained``, or a ``model.py`` with ``build_model()`` calling ``timm.create_model``);
(2) run ``normaudit DIR --format json -o report.json`` in-process (``normaudit.cli.main``, same code path
as the command); (3) build the model for real on CPU and count the norm modules one forward calls
(:mod:`forward`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tv_shim  # noqa: E402 - must precede any torchvision import (timm imports it)

tv_shim.install()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import forward  # noqa: E402
import targets  # noqa: E402

#: A real CPU build above this many parameters skips the forward (recall then reads "n/a").
MAX_FORWARD_PARAMS = 200_000_000


def _ground_truth(model, config) -> dict[str, Any]:
    """``norm_modules``, ``fwd_norms`` (None when no input set runs), ``fwd_inputs``, ``params`` of a model
    built for real on CPU, from one forward with hooks on every norm module (:mod:`forward`)."""
    called, label = forward.forward_norms(model, config)
    return {"norm_modules": forward.norm_modules(model), "fwd_norms": sorted(called) if called is not None else None,
            "fwd_inputs": label, "params": sum(p.numel() for p in model.parameters())}


def _level_runs(config, precheck: bool = False) -> tuple[bool, dict[str, Any]]:
    """Whether the model of a shrunk ``config`` runs a forward, and its ground truth.

    The model is first built on the meta device (no memory) to count its parameters. Up to
    :data:`MAX_FORWARD_PARAMS` it is then built for real on CPU and one forward decides (that forward is also
    the ground truth: no second build later). Above, only a forward on meta tensors is tried
    (:func:`forward.runs_on_meta`, weaker: a stop on ``.item()`` counts as running, and some meta kernels
    refuse what CPU runs, ``grouped_mm`` in float32), and the ground truth reads "skipped". With ``precheck``
    (every attempt after the first, the same level without its image cut too), a meta forward that fails on
    shapes rules the level out before any real build: a conv net whose last BatchNorm mismatches
    (EfficientNet's ``hidden_dim``) is not run for real once per level."""
    with torch.device("meta"):
        model = build_model(config)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > MAX_FORWARD_PARAMS:
        ok, label = forward.runs_on_meta(model, config)
        return ok, {"norm_modules": forward.norm_modules(model), "fwd_norms": None, "params": n_params,
                    "fwd_inputs": f"skipped: {n_params / 1e6:.0f}M params (meta forward: {label[:200]})"}
    if precheck:
        ok, label = forward.runs_on_meta(model, config)
        if not ok:
            return False, {"norm_modules": forward.norm_modules(model), "fwd_norms": None, "params": n_params,
                           "fwd_inputs": f"meta forward: {label[:300]}"}
    del model
    torch.manual_seed(0)
    truth = _ground_truth(build_model(config), config)
    return truth["fwd_norms"] is not None, truth


def build_model(config):
    """The model normaudit builds from ``config`` (``normaudit/loaders/hf.py``): the first class of ``architectures`` that
    transformers has, else ``AutoModel``."""
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls._from_config(config)
    return transformers.AutoModel.from_config(config)


_MISSING_ATTRIBUTE = re.compile(r"object has no attribute '(\w+)'")


def hf_config(model_type: str):
    """Shrunk config of ``model_type``: ``(config, level, ground truth, level errors)``; raises when no level
    builds.

    Where no level builds because the model reads a key its config class lacks (MoonshineStreaming's decoder
    reads ``num_key_value_heads``; the checkpoints' config.json has it), the key is given the value
    :func:`targets.missing_key_value` derives from the others, in the config and each sub-config that lacks
    it (:func:`targets.add_missing_key`: DBRX's ``attn_config`` reads ``rope_theta``), recorded in the errors
    under ``added``, and the levels tried again.
    """
    import transformers

    base = transformers.CONFIG_MAPPING[model_type]().to_dict()
    added: dict[str, Any] = {}
    while True:
        try:
            config, level, truth, errors = _choose_level(model_type, base)
            return config, level, truth, dict(errors, **({"added": str(added)} if added else {}))
        except RuntimeError as err:
            key = _MISSING_ATTRIBUTE.search(str(err))
            if not key or key[1] in added or not targets.add_missing_key(base, key[1]):
                raise
            added[key[1]] = targets.missing_key_value(base, key[1])


#: suffix of an error key: the level was tried with :func:`targets.shrink_image_sizes` and not used
_IMAGES = " (images cut)"


def _level_dicts(base: dict[str, Any]):
    """``(level name, config dict)`` in the order :func:`_choose_level` tries them: each level of
    :data:`targets.SHRINK_LEVELS` but "default" and "filled" first with its image sizes cut
    (:func:`targets.shrink_image_sizes`, named ``"<level> (images cut)"`` where that fails), then as it is:
    a model whose position-embedding grid or window sizes refuse the smaller image falls back to the sizes
    it had, at the same level. Where the cut changes nothing, the level is tried once; a level whose dict
    equals one already tried is left out (it fails the same way: "pairs" where no per-layer list has two
    kinds is "small"). A level whose widths cannot keep a relation the model checks
    (:class:`targets.ShrinkMisfit`) is yielded with the error in place of its dict, for the caller to record."""
    tried: list[dict[str, Any]] = []
    for level in targets.SHRINK_LEVELS:
        try:
            shrunk = targets.shrink_config_dict(base, level)
        except targets.ShrinkMisfit as err:
            yield level, err
            continue
        cut = shrunk if level in ("default", "filled") else targets.shrink_image_sizes(shrunk)
        for name, d in ((level + _IMAGES, cut), (level, shrunk)) if cut is not shrunk else ((level, shrunk),):
            if d not in tried or level == "filled":  # "filled" equal to "small": _choose_level stops there
                tried.append(d)
                yield name, d


def _level_name(level: str, errors: dict[str, str]) -> str:
    """The level as recorded (column ``shrink``): the plain level name; where its image sizes were cut,
    ``errors["images"]`` says so (changed in place)."""
    if level.endswith(_IMAGES):
        errors["images"] = "cut to <= %d px (targets.shrink_image_sizes)" % targets.IMAGE
    return level.removesuffix(_IMAGES)


def _choose_level(model_type: str, base: dict[str, Any]):
    """The level choice of :func:`hf_config` for the config dict ``base`` (the config class's defaults).

    The first level of :data:`targets.SHRINK_LEVELS` whose model builds and runs a forward (:func:`_level_runs`)
    wins: a shrink whose sizes no longer fit each other (rotary sections written for 128-wide heads, expert
    groups that no longer divide the experts) would otherwise be measured as a capture failure. When no
    level's forward runs (inputs the sweep cannot build), the first level that builds, with its forward's
    error as ground truth. The full-size "default" level is only a build fallback and never run for real;
    "filled" is tried only when no other level runs a forward, and only where it fills something in:
    a model built from sizes the defaults leave ``None`` may build and then fail on them (DeepSeek-V2:
    ``num_experts_per_tok`` None reaches ``topk``; DBRX: ``clip_qkv`` None reaches ``clamp``). A level too large for a real forward, judged by a
    meta forward only, never wins over a smaller level that built (PE-Audio-Video: once its ViT-L tower is
    shrunk, "small" runs for real and fails on the sweep's audio inputs; the 750M-parameter "layers" level
    then passed on meta and was audited until the capture timed out).
    ``level errors`` maps each level tried before the one chosen to why it was not chosen.
    """
    import transformers

    cls = transformers.CONFIG_MAPPING[model_type]
    errors: dict[str, str] = {}
    first_built = None
    for attempt, (level, shrunk) in enumerate(_level_dicts(base)):
        if level == "filled" and first_built is not None and _fills_nothing(base):
            break  # the defaults build and leave no size to the checkpoint: nothing to fill in
        try:
            if isinstance(shrunk, targets.ShrinkMisfit):
                raise shrunk
            config = targets.model_config(cls.from_dict(shrunk))
            targets.fill_rope_sections(config)
            if level == "default":
                with torch.device("meta"):
                    build_model(config)
                truth = {"fwd_norms": None, "fwd_inputs": "full-size config: no forward"}
            else:
                ok, truth = _level_runs(config, precheck=attempt > 0)
                if ok and truth["fwd_norms"] is None and first_built is not None:
                    break  # only a meta forward judged this larger level: the smaller one built is kept
                if ok:
                    return config, _level_name(level, errors), truth, errors
                errors[level] = f"forward: {truth['fwd_inputs'][:200]}"
        except Exception as err:  # noqa: BLE001 - try the next, milder shrink
            errors[level] = f"build: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
            continue
        if first_built is None:
            first_built = (config, level, truth)
    if first_built is not None:
        config, level, truth = first_built
        return config, _level_name(level, errors), truth, errors
    raise RuntimeError(f"no shrink level builds: {errors.get('default') or list(errors.values())[-1]}")


def _fills_nothing(base: dict[str, Any]) -> bool:
    """Whether the "filled" level of the config dict ``base`` equals its "small" level (or neither shrinks:
    :class:`targets.ShrinkMisfit`, widths that cannot keep a relation at hidden 64)."""
    try:
        return targets.shrink_config_dict(base, "filled") == targets.shrink_config_dict(base, "small")
    except targets.ShrinkMisfit:
        return True


#: how a transformers type's config is sized (``--mode``): "careful" (:func:`hf_config`: the levels of
#: :data:`targets.SHRINK_LEVELS`, relations kept, a real forward as ground truth), "full" (the config class's
#: defaults as they are, full size: built on the meta device only, audited, no forward), "plain"
#: (:func:`targets.plain_shrink_dict`: widths 64, 2 layers, no relation kept; a real forward where it runs)
MODES = ("careful", "full", "plain")


def full_size_config(model_type: str):
    """The library's default config of ``model_type``, full size, as a user holding it would audit it: the
    config class's defaults, only the class ``AutoModel`` builds named (:func:`targets.model_config`), and its
    ground truth from a build on the meta device (no forward: ``fwd_norms`` None, so coverage is the report's
    own ``complete`` or every norm module a graph site). Raises where the defaults do not build."""
    import transformers

    from normaudit.loaders.meta_init import meta_init_skipped

    config = targets.model_config(transformers.CONFIG_MAPPING[model_type]())
    with torch.device("meta"), meta_init_skipped():
        model = build_model(config)
    truth = {"norm_modules": forward.norm_modules(model), "fwd_norms": None, "fwd_inputs": "full-size config: no forward",
             "params": sum(p.numel() for p in model.parameters())}
    return config, truth


def plain_config(model_type: str):
    """``model_type``'s defaults through :func:`targets.plain_shrink_dict` (no relation kept) and its ground
    truth: a real forward where the model is small enough and one runs (:func:`_level_runs`), else none.
    Raises where the shrunk config does not build."""
    import transformers

    cls = transformers.CONFIG_MAPPING[model_type]
    config = targets.model_config(cls.from_dict(targets.plain_shrink_dict(cls().to_dict())))
    return config, _level_runs(config)[1]


def write_target(job: dict[str, Any]) -> tuple[Path, str, dict[str, Any]]:
    """Write the job's target into ``job['dir']``; returns ``(target path, shrink level, facts)``, where
    facts holds the ground truth already measured (transformers: by :func:`hf_config`, or for the modes
    "full" and "plain" by :func:`full_size_config` and :func:`plain_config`) and ``shrink_errors``."""
    out = Path(job["dir"])
    out.mkdir(parents=True, exist_ok=True)
    mode = job.get("mode", "careful")
    if job["corpus"] == "transformers" and mode != "careful":
        config, truth = (full_size_config if mode == "full" else plain_config)(job["name"])
        config.save_pretrained(out)
        return out, mode, truth
    if job["corpus"] == "transformers":
        config, level, truth, errors = hf_config(job["name"])
        config.save_pretrained(out)
        return out, level, dict(truth, shrink_errors=errors)
    (out / "model.py").write_text(
        "import timm\n\n\ndef build_model():\n"
        f"    return timm.create_model({job['name']!r}, pretrained=False)\n")
    return out / "model.py", "timm default", {}


def run_normaudit(target: Path, report: Path) -> int:
    """``normaudit TARGET --format json -o REPORT`` in this process; returns its exit status."""
    from normaudit.cli import main

    return main([str(target), "--format", "json", "-o", str(report)])


def library_line(location: Optional[dict[str, Any]]) -> str:
    """``file:line`` of a capture failure's location (the report's ``capture.attempts[].location``), the file
    relative to the site-packages folder it lies in (``transformers/models/clvp/modeling_clvp.py:735``); ''
    where the report names none."""
    if not location or not location.get("file"):
        return ""
    path = str(location["file"])
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            break
    return f"{path}:{location.get('line')}"


def summarise_report(report: Path) -> dict[str, Any]:
    """The TSV's fields from a normaudit JSON report (empty when the report is missing)."""
    if not report.is_file():
        return {}
    data = json.loads(report.read_text())
    capture = data.get("capture") or {}
    sites = data.get("sites") or []
    graph_sites = [s for s in sites if s.get("detected_by") not in ("module_walk", "checkpoint")]
    findings = [f for f in data.get("findings") or [] if f.get("severity") in ("warning", "error")]
    failed = [a for a in capture.get("attempts") or [] if not a.get("ok")]
    return {
        "capture": capture.get("method"), "complete": capture.get("complete"),
        "capture_error": (failed[-1].get("error") or "")[:300] if failed else "",
        "capture_location": library_line(failed[-1].get("location")) if failed else "",
        "sites": len(sites), "graph_site_modules": sorted({s["module"] for s in graph_sites}),
        "site_modules": sorted({s["module"] for s in sites}),
        "findings": [{"rule": f["rule_id"], "severity": f["severity"], "module": f["module"],
                      "message": f["message"][:300],
                      "source": f"{(f.get('source') or {}).get('file')}:{(f.get('source') or {}).get('line')}"}
                     for f in findings],
    }


def timm_forward(model) -> tuple[set[str] | None, str]:
    """Norms called by a timm model on ``(2, *pretrained_cfg['input_size'])`` random images."""
    size = tuple((getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224))
    x = torch.randn(2, *size)
    model.eval()
    try:
        with torch.no_grad():
            return forward.called_norms(model, lambda: model(x)), f"x{list(x.shape)}"
    except Exception as err:  # noqa: BLE001
        return None, f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def measure_timm_forward(job: dict[str, Any]) -> dict[str, Any]:
    """Ground truth of a timm target: ``fwd_norms`` (paths called), ``norm_modules`` (all), ``fwd_inputs``
    (which inputs ran, or the error), ``params``; the model built for real on CPU (random init)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(job["name"], pretrained=False)
    n_params = sum(p.numel() for p in model.parameters())
    norms = forward.norm_modules(model)
    if n_params > MAX_FORWARD_PARAMS:
        return {"norm_modules": norms, "fwd_norms": None, "fwd_inputs": f"skipped: {n_params / 1e6:.0f}M params"}
    called, label = timm_forward(model)
    return {"norm_modules": norms, "fwd_norms": sorted(called) if called is not None else None,
            "fwd_inputs": label, "params": n_params}


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children waited for (normaudit forks its audits)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Write, audit and measure one target; every phase's failure is recorded, never raised.

    Times (wall seconds): ``shrink_s`` (config shrink, level choice and, for transformers, the ground-truth
    forward), ``audit_s`` (normaudit), ``forward_s`` (timm's ground-truth forward), ``total_s``; ``cpu_s``
    is CPU seconds of the whole job, forked audit included."""
    result: dict[str, Any] = {"corpus": job["corpus"], "name": job["name"], "family": job.get("family", ""),
                              "mode": job.get("mode", "careful")}
    start, cpu = time.perf_counter(), _cpu_seconds()
    try:
        target, level, facts = write_target(job)
    except Exception as err:  # noqa: BLE001
        result.update(exit="build", error=f"{type(err).__name__}: {' '.join(str(err).split())[:300]}",
                      total_s=round(time.perf_counter() - start, 2))
        return result
    result.update(facts, shrink=level, shrink_s=round(time.perf_counter() - start, 2))
    report = Path(job["dir"]) / "report.json"
    # a sweep resumed into the same folder: normaudit refuses to write over a file of its target's directory,
    # and the last sweep's report would be summarised as this one's
    report.unlink(missing_ok=True)
    t0 = time.perf_counter()
    result["exit"] = run_normaudit(target, report)
    result["audit_s"] = round(time.perf_counter() - t0, 2)
    result.update(summarise_report(report))
    if job["corpus"] == "timm":
        t0 = time.perf_counter()
        try:
            result.update(measure_timm_forward(job))
        except Exception as err:  # noqa: BLE001
            result.update(fwd_norms=None, fwd_inputs=f"real build failed: {type(err).__name__}: {str(err)[:200]}")
        result["forward_s"] = round(time.perf_counter() - t0, 2)
    result["total_s"] = round(time.perf_counter() - start, 2)
    result["cpu_s"] = round(_cpu_seconds() - cpu, 2)
    result["rss_mb"] = _rss_mb()
    return result


def _rss_mb() -> float | None:
    """This process's resident memory now, in MB (``/proc/self/statm``; None where there is no /proc): the
    driver restarts a worker that grew past ``--max-rss-mb``."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's fd 1 and 2 (Python and C level) to ``path`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def main() -> None:
    """Serve jobs from stdin until it closes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = os.fdopen(args.result_fd, "w", buffering=1)
    for line in sys.stdin:
        job = json.loads(line)
        Path(job["dir"]).mkdir(parents=True, exist_ok=True)
        with output_to(Path(job["dir"]) / "log.txt"):
            try:
                result = run_job(job)
            except BaseException as err:  # noqa: BLE001 - a worker must answer every job
                result = {"corpus": job["corpus"], "name": job["name"], "mode": job.get("mode", "careful"), "exit": "crash",
                          "error": f"{type(err).__name__}: {err}"[:300], "trace": traceback.format_exc()[-800:]}
        results.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
