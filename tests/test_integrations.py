"""normaudit.integrations.NormauditCallback in a real (tiny, CPU) transformers Trainer run."""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")      # the Trainer needs it

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from normaudit.integrations import NormauditCallback  # noqa: E402

VOCAB, SEQ, MAX_STEPS = 64, 16, 6


class RandomTokens(torch.utils.data.Dataset):
    """Random token ids, reproducible per index; labels = inputs (causal LM loss)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=VOCAB,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def run_trainer(tmp_path, model, callback, accumulation=1):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=MAX_STEPS, per_device_train_batch_size=4,
                             gradient_accumulation_steps=accumulation,
                             report_to=[], save_strategy="no", use_cpu=True, logging_steps=1000,
                             disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=[callback])
    trainer.train()
    return trainer


def inject_nan_at_forward(module, n):
    """One NaN in ``module``'s output on the n-th (1-based) training forward of the whole run."""
    count = [0]

    def hook(mod, args, out):
        if mod.training:
            count[0] += 1
            if count[0] == n:
                out = out.clone()
                out[0, 0, 0] = float("nan")
                return out
    module.register_forward_hook(hook)


@pytest.mark.parametrize("accumulation, forward", [(1, 3), (2, 5)])   # step 3: its only / first micro-batch
def test_callback_stops_training_at_the_step_and_layer_of_the_first_nan(tmp_path, caplog, accumulation, forward):
    model = tiny_gpt2()
    inject_nan_at_forward(model.transformer.h[1].mlp.c_fc, forward)
    callback = NormauditCallback(action="stop")
    with caplog.at_level(logging.WARNING, logger="normaudit"):
        trainer = run_trainer(tmp_path, model, callback, accumulation)
    assert callback.stopped_at == 3 and trainer.state.global_step == 3
    assert len(callback.events) == 1
    ev = callback.events[0]
    assert (ev.step, ev.phase, ev.cause, ev.module, ev.class_name) == (
        3, "forward", "module", "transformer.h.1.mlp.c_fc", "Conv1D")
    assert ev.first_norm == "transformer.ln_f"
    assert "step 3 in forward: produced by transformer.h.1.mlp.c_fc (Conv1D)" in caplog.text
    logged = [e for e in trainer.state.log_history if "normaudit_nonfinite" in e]
    assert [(e["step"], e["normaudit_nonfinite"]["module"]) for e in logged] == [(3, "transformer.h.1.mlp.c_fc")]
    assert all(not m._forward_hooks for m in model.modules() if m is not model.transformer.h[1].mlp.c_fc)


def test_callback_on_a_correct_run_reports_nothing_and_does_not_stop(tmp_path):
    callback = NormauditCallback(action="warn", modules="norms")
    trainer = run_trainer(tmp_path, tiny_gpt2(), callback)
    assert trainer.state.global_step == MAX_STEPS
    assert callback.events == [] and callback.stopped_at is None


def test_bad_action():
    with pytest.raises(ValueError, match="action must be 'stop' or 'warn'"):
        NormauditCallback(action="raise")
