"""``torch.compile(fullgraph=True)`` of the token-level PolicyLoss presets: no graph break, and the loss and
its gradient equal eager.

The compiled function is ``batch -> loss_fn(batch).loss`` with the :class:`rlzoo.PolicyBatch` built outside
it (``check_values=False``: the value check is a device sync by design). It runs in a child Python process:
under pytest the jaxtyping/beartype import hook wraps every rlzoo function, and Dynamo cannot trace
beartype's checks - the hook is the test-time type checker, not the code users compile.

Default suite: three presets with the ``aot_eager`` backend (Dynamo tracing with ``fullgraph=True`` plus
AOTAutograd's forward/backward graphs, no C++ compile). ``-m slow``: every preset with ``aot_eager``, and eleven
token-level presets with inductor.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tolerances import tol

REPO = Path(__file__).resolve().parents[1]
TOKEN_LEVEL = ["ppo", "grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "gpg", "two_sided", "dro", "vespo",
               "clip_cov", "kl_cov", "dppo_tv", "dppo_kl"]
SEQUENCE_LEVEL = ["gspo", "gspo_token", "gmpo", "luspo"]
INDUCTOR = TOKEN_LEVEL[:11]
FAST = ["grpo", "dr_grpo", "cispo"]


def _run_child(backend: str, presets: list[str]) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), backend, *presets], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(results: dict[str, dict], presets: list[str]) -> None:
    assert sorted(results) == sorted(presets)
    atol, rtol = tol(torch.float64)["atol"], tol(torch.float64)["rtol"]
    for name, r in results.items():
        assert r["error"] is None, f"{name}: {r['error']}"
        for key in ("loss", "grad_logprobs", "grad_entropies"):
            if r[key] is not None:
                diff, scale = r[key]
                assert diff <= atol + rtol * scale, f"{name}: compiled {key} differs from eager by {diff}"


def test_token_level_presets_compile_without_graph_breaks():
    _check(_run_child("aot_eager", FAST), FAST)


@pytest.mark.slow
def test_every_preset_compiles_without_graph_breaks():
    import rlzoo

    assert sorted(TOKEN_LEVEL + SEQUENCE_LEVEL) == rlzoo.list_losses()
    _check(_run_child("aot_eager", TOKEN_LEVEL + SEQUENCE_LEVEL), TOKEN_LEVEL + SEQUENCE_LEVEL)


@pytest.mark.slow
def test_token_level_presets_inductor_equal_eager():
    _check(_run_child("inductor", INDUCTOR), INDUCTOR)


# ------------------------------------------------------------------------------------- child process
def _child(backend: str, presets: list[str]) -> dict[str, dict]:
    import rlzoo

    b, t = 6, 9
    g = torch.Generator().manual_seed(0)
    base = -torch.rand(b, t, generator=g, dtype=torch.float64) - 0.05
    noise = [0.2 * torch.randn(b, t, generator=g, dtype=torch.float64) for _ in range(3)]
    lengths = torch.tensor([9, 1, 5, 9, 3, 7])
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    entropies = torch.rand(b, t, generator=g, dtype=torch.float64)
    results = {}
    for name in presets:
        loss_fn = rlzoo.get_loss(name, max_completion_length=t)  # a universal option (dr_grpo, dppo need it)

        def make(base=base):
            lp = base.clone().requires_grad_()
            ent = entropies.clone().requires_grad_()
            batch = rlzoo.PolicyBatch(
                logprobs=lp, old_logprobs=(base + noise[0]).clamp(max=0), ref_logprobs=(base + noise[1]).clamp(max=0),
                rollout_logprobs=(base + noise[2]).clamp(max=0), entropies=ent, advantages=adv,
                completion_mask=mask, check_values=False,
            )
            return batch, lp, ent

        def loss_of(batch, loss_fn=loss_fn):
            return loss_fn(batch).loss

        torch._dynamo.reset()
        compiled = torch.compile(loss_of, fullgraph=True, backend=backend)
        out = {"error": None, "loss": None, "grad_logprobs": None, "grad_entropies": None}
        try:
            values = []
            for fn in (loss_of, compiled):
                batch, lp, ent = make()
                loss = fn(batch)
                grads = torch.autograd.grad(loss, (lp, ent), allow_unused=True)
                values.append((loss.detach(), *grads))
            (l0, gl0, ge0), (l1, gl1, ge1) = values

            def diff(x, y):
                if x is None and y is None:
                    return None
                if x is None or y is None:
                    return [float("inf"), 0.0]
                return [float((x - y).abs().max()), float(x.abs().max())]

            out.update(loss=diff(l0, l1), grad_logprobs=diff(gl0, gl1), grad_entropies=diff(ge0, ge1))
        except Exception as err:  # noqa: BLE001 - reported to the parent test, which fails with the message
            out["error"] = f"{type(err).__name__}: {str(err)[:3000]}"
        results[name] = out
    return results


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(_child(sys.argv[1], sys.argv[2:])))
