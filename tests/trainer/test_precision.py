"""The device and dtype a run resolves; a device torch does not know is one line naming --device."""

import sys

import pytest

from rlzoo.trainer.config import ModelConfig
from rlzoo.trainer.precision import Precision


@pytest.mark.parametrize(("device", "meant"), [("gpu", " (did you mean 'cuda'?)"), ("gpu:1", " (did you mean 'cuda:1'?)"),
                                               ("CPU", " (did you mean 'cpu'?)"), ("cuda:x", "")])
def test_an_unknown_device_names_the_flag_and_the_valid_values(device, meant):
    """``--device gpu`` was torch's RuntimeError ("Expected one of cpu, cuda, ipu, xpu, ... device type at start of
    device string: gpu"), a traceback: now a ValueError, which the command prints as one line."""
    with pytest.raises(ValueError) as err:
        Precision.resolve(ModelConfig(device=device))
    assert str(err.value) == (f"--device {device!r} is not a device{meant}: use auto, cpu, cuda or cuda:N "
                              "(N: a GPU's index)")


def test_rlzoo_train_device_gpu_is_one_error_line(tmp_path, monkeypatch, capsys):
    from rlzoo.cli import console_main

    monkeypatch.setattr(sys, "argv", ["rlzoo", "train", "--model", "tiny-random", "--device", "gpu",
                                      "--output-dir", str(tmp_path / "run"), "--no-progress"])
    assert console_main() == 2
    err = capsys.readouterr().err
    assert "rlzoo: error: --device 'gpu' is not a device (did you mean 'cuda'?)" in err and "Traceback" not in err


def test_valid_devices_resolve():
    assert str(Precision.resolve(ModelConfig(device="cpu"))) == "cpu float32"
    assert str(Precision.resolve(ModelConfig(device="cpu", dtype="bf16-mixed"))) == "cpu float32 + bf16 autocast"


def test_float16_parameters_are_not_trained_but_a_lora_base_may_be_float16(tmp_path):
    """User trial: --dtype float16 trained with AdamW's eps 1e-8, which is 0 in float16: after the first step every
    weight was inf or NaN, and the run exited 0 (eval and export took the NaN model). Refused before the run
    directory exists; a LoRA adapter on a float16 base trains (peft keeps the adapter in float32) to finite
    weights."""
    import math

    import torch

    from rlzoo.trainer import TrainConfig, Trainer

    tiny = {"model": "tiny-random", "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 8,
            "eval_size": 0, "progress": False, "max_steps": 2, "learning_rate": 1e-3, "dtype": "float16"}
    with pytest.raises(ValueError, match=r"^--dtype float16 trains float16 parameters, which AdamW cannot update"):
        Trainer(TrainConfig(**tiny, output_dir=str(tmp_path / "full")))
    assert not (tmp_path / "full").exists()
    trainer = Trainer(TrainConfig(**tiny, peft={"r": 4, "target_modules": "all-linear"},
                                  output_dir=str(tmp_path / "lora")))
    rows = trainer.train()
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    assert trained and {p.dtype for p in trained} == {torch.float32}
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(row["loss"]) for row in rows if "loss" in row)
