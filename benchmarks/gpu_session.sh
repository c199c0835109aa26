#!/usr/bin/env bash
# The checks a session runs when it is lent a GPU machine (no package index there; see docs/benchmarks.md):
# the CUDA-marked tests, the trainer's, CLI's and TRL integration's tests on that machine (conftest.py runs the
# unmarked ones on the CPU: this checks they pass where a GPU is present), and the CLI end to end on CUDA (LoRA with
# a reference, eval, export; one-rank FSDP2 under torchrun).
# Wheels the machine lacks travel in .whl/ (pip download --python-version 3.12 ...; .git/info/exclude ignores it).
# Usage: bash benchmarks/gpu_session.sh [cuda|trainer|cli|all]; logs go to $OUT (or ./gpu-logs).
set -uo pipefail
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ -d .whl ]; then  # into the machine's own Python (it is given back afterwards), so subprocesses see them too
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade .whl/*.whl || exit 1
  for sdist in .whl/*.tar.gz; do  # C extensions without a cp312 wheel (pycosat, for reasoning-gym): built there
    [ -e "$sdist" ] && python3 -m pip install -q --no-index --no-deps --no-build-isolation "$sdist"
  done
fi
export PYTHONPATH=$PWD
what=${1:-all}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, peft, triton; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"

if [[ $what == cuda || $what == all ]]; then
  echo "== CUDA-marked tests"
  timeout 180 python3 -m pytest -m cuda -q -p no:cacheprovider tests 2>&1 | tee "$OUT/cuda_tests.log" | tail -8
fi

if [[ $what == cli || $what == all ]]; then
  echo "== CLI on CUDA: LoRA with a reference (auto: bf16-mixed), eval, export; one-rank FSDP2"
  run=/tmp/gpu-runs
  rm -rf $run
  (
    set -e
    common=(--model tiny-random --max-steps 3 --save-steps 1 --eval-size 8 --num-generations 4
            --per-device-train-batch-size 8 --max-completion-length 16 --no-progress)
    python3 -m rlzoo train "${common[@]}" --algorithm grpo --loss.beta 0.04 --peft.r 8 --peft.lora_alpha 16 \
      --peft.target_modules all-linear --mask-truncated-completions --output-dir $run/lora
    python3 -m rlzoo train "${common[@]}" --algorithm grpo --loss.beta 0.04 --peft.r 8 --peft.lora_alpha 16 \
      --peft.target_modules all-linear --mask-truncated-completions --output-dir $run/lora --resume latest --max-steps 4
    python3 -m rlzoo eval --run $run/lora --eval-size 16
    python3 -m rlzoo export $run/lora/checkpoints/step-000004 $run/merged
    python3 -c "import sys, transformers; m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]);
print('merged export loads:', type(m).__name__, sum(p.numel() for p in m.parameters()))" $run/merged
    torchrun --standalone --nproc_per_node 1 -m rlzoo train "${common[@]}" --algorithm dapo --parallelism fsdp \
      --peft.r 8 --peft.target_modules all-linear --gradient-checkpointing --output-dir $run/fsdp_lora
    torchrun --standalone --nproc_per_node 1 -m rlzoo train "${common[@]}" --algorithm grpo --loss.beta 0.04 \
      --parallelism fsdp --fsdp-cpu-offload --output-dir $run/fsdp_offload
    for d in lora fsdp_lora fsdp_offload; do echo "$d"; python3 -c "import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if 'loss' in row: print({k: row[k] for k in ('step', 'loss', 'grad_norm', 'reward', 'kl') if k in row})
" $run/$d/metrics.jsonl; done
  ) 2>&1 | tee "$OUT/cli.log" | grep -v "^\s*$" | tail -40
  echo "cli rc=${PIPESTATUS[0]}"
fi

if [[ $what == trainer || $what == all ]]; then
  echo "== the trainer's tests on the GPU machine (unmarked ones on its CPU)"
  timeout 280 python3 -m pytest tests/trainer tests/test_cli.py tests/integrations/test_trl.py --ignore=tests/trainer/test_trackers.py -q -p no:cacheprovider -n 14 -rfE \
    2>&1 | tee "$OUT/trainer_on_cuda.log" | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-300 | tail -60
  python3 -m rlzoo bench --output /tmp/bench.json --docs /tmp/bench.md -q -k "loss_eager and grpo and cpu" 2>&1 | tail -5
fi
