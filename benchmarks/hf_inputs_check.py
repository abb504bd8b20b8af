"""Quick coverage check of input building and capture over ~60 diverse transformers model types.

    nice -n 10 python benchmarks/hf_inputs_check.py [--timeout 120] [--types vit,whisper,...] [--tsv OUT]

Each type's config comes from ``transformers.AutoConfig.for_model(type)``, shrunk (hidden 32, 2 layers,
4 heads, image 32, patch 8, nested text/vision/audio sub-configs too), the ``AutoModel`` is built on the
meta device and audited through normaudit (``build_report``, as for a bare ``config.json``) in a
subprocess with a timeout. One line per type: capture method, complete, parts captured, norm sites,
norm modules, unaudited norm modules, warning+ findings, seconds; then the totals. Not a test: slow.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's normaudit, also when run from a copy

TYPES = [
    # vision
    "vit", "deit", "beit", "swin", "swinv2", "convnext", "convnextv2", "resnet", "dinov2", "mobilevit", "segformer",
    "levit", "poolformer", "dpt", "data2vec-vision", "videomae", "timesformer", "vivit", "hiera", "pvt_v2",
    # audio
    "whisper", "wav2vec2", "hubert", "wavlm", "sew", "unispeech", "data2vec-audio", "wav2vec2-conformer",
    "speech_to_text", "encodec", "mimi", "vits", "clap", "audio-spectrogram-transformer",
    # multimodal
    "clip", "siglip", "align", "blip", "owlvit", "chinese_clip", "xclip", "flava", "llava", "paligemma",
    "qwen2_vl", "idefics3", "seamless_m4t", "layoutlmv3",
    # encoder-decoder and text
    "t5", "bart", "mbart", "pegasus", "marian", "mt5", "bert", "gpt2", "llama", "reformer",
    # MoE
    "mixtral", "qwen2_moe", "jetmoe", "switch_transformers", "olmoe",
]

SMALL = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 2, "num_heads": 4,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
    "image_size": 64, "patch_size": 8, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "projection_dim": 32, "head_dim": 8,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
}


def shrink(config, depth: int = 0):
    """Set the SMALL sizes on ``config`` and its nested sub-configs (keys it already has only)."""
    from transformers import PretrainedConfig

    for key, value in SMALL.items():
        if key in config.to_dict() and isinstance(getattr(config, key, None), int):
            setattr(config, key, value)
    if depth < 2:
        for key in list(vars(config)):
            sub = getattr(config, key, None)
            if isinstance(sub, PretrainedConfig):
                shrink(sub, depth + 1)
    return config


def one(model_type: str) -> dict:
    """Audit one type in this process; returns the summary row."""
    import torch
    import transformers
    from torch import nn

    from normaudit.audit import AuditOptions, build_report
    from normaudit.engine.loader import load_rules
    from normaudit.loaders import ModelUnderAudit

    try:
        config = shrink(transformers.AutoConfig.for_model(model_type))
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(config)
    except Exception:  # noqa: BLE001 - sizes that do not fit this type: its default config
        config = transformers.AutoConfig.for_model(model_type)
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(config)
    norms = [n for n, m in model.named_modules() if type(m).__name__.endswith("Norm")
             or isinstance(m, (nn.LayerNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase, nn.GroupNorm))]
    t0 = time.perf_counter()
    report = build_report(AuditOptions(target=model_type),
                          ModelUnderAudit(model=model, inputs=None, on_meta=True, kind="hf_config"), load_rules())
    cap = report.capture
    extra = cap.model_dump()
    return {"type": model_type, "method": cap.method, "complete": cap.complete,
            "parts": len(extra.get("parts") or []), "sites": len(report.sites), "norm_modules": len(norms),
            "unaudited": len(extra.get("unaudited") or []), "loud": sum(f.severity != "info" for f in report.findings),
            "inputs": cap.inputs_assumed, "seconds": round(time.perf_counter() - t0, 1),
            "error": next((a.error for a in cap.attempts if not a.ok), None) if not cap.complete else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one")
    ap.add_argument("--types")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--tsv")
    ap.add_argument("--inproc", action="store_true", help="all types in this process (SIGALRM timeouts)")
    args = ap.parse_args()
    if args.one:
        try:
            row = one(args.one)
        except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash
            row = {"type": args.one, "method": "crash", "error": f"{type(exc).__name__}: {exc}"[:300]}
        print("ROW " + json.dumps(row))
        return 0
    types = args.types.split(",") if args.types else TYPES
    rows = []
    for t in types:
        t0 = time.perf_counter()
        if args.inproc:
            row = _inproc(t, args.timeout)
        else:
            row = _subprocess(t, args.timeout)
        row["wall"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print("\t".join(str(row.get(k, "")) for k in ("type", "method", "complete", "parts", "sites", "norm_modules",
                                                        "unaudited", "loud", "wall", "error")), flush=True)
    _summary(rows, args.tsv)
    return 0


def _inproc(t: str, timeout: float) -> dict:
    """One type in this process, stopped by SIGALRM after ``timeout`` seconds (saves an import per type)."""
    import gc
    import signal

    def stop(*_):
        raise TimeoutError(t)

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(int(timeout))
    try:
        return one(t)
    except TimeoutError:
        return {"type": t, "method": "timeout"}
    except Exception as exc:  # noqa: BLE001
        return {"type": t, "method": "crash", "error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        gc.collect()


def _subprocess(t: str, timeout: float) -> dict:
    """One type in a child process (a crash or hang of the model cannot take the sweep down)."""
    try:
        out = subprocess.run([sys.executable, __file__, "--one", t], capture_output=True, text=True,
                             timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"type": t, "method": "timeout"}
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")), None)
    if line:
        return json.loads(line[4:])
    return {"type": t, "method": "crash", "error": (out.stderr.strip().splitlines() or ["?"])[-1][:300]}


def _summary(rows: list[dict], tsv: str | None) -> None:
    full = sum(r.get("complete") is True for r in rows)
    parts = sum(r.get("complete") is not True and r.get("parts", 0) > 0 for r in rows)
    print(f"\n{len(rows)} types: {full} captured whole, {parts} by parts, "
          f"{sum(r['method'] in ('crash', 'timeout') for r in rows)} crash/timeout")
    if tsv:
        Path(tsv).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    sys.exit(main())
