"""Shared pytest set-up: hypothesis profiles, float64 default for math tests, markers."""

import atexit
import os
import shutil
import tempfile

# No network in CI: hub ids resolve from the local cache only (else each miss retries for a minute). Read by
# huggingface_hub, transformers and datasets when they are first imported, so it is set before any of them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")  # wandb without an account or a network
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="rlzoo-test-trackio-")  # a fresh store, never the user's
atexit.register(shutil.rmtree, os.environ["TRACKIO_DIR"], ignore_errors=True)  # one per session and worker: not left

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

