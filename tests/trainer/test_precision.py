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
