#!/usr/bin/env bash
# The GPU checks of this repository, in one script (a lent GPU machine has no network and a bare
# Python with torch + transformers + peft; the rest travels as wheels in .whl/, see docs/performance.md).
#
#   bash benchmarks/gpu_checks.sh tests      # pytest -m gpu, then a 1-repeat smoke of every benchmark
#   bash benchmarks/gpu_checks.sh speed      # bench_vs_trl at ~0.5B, 3 interleaved repeats
#   bash benchmarks/gpu_checks.sh profile    # pytest -m gpu, then one repeat at ~0.5B with the GPU busy fraction
#
# Logs go to $OUT (or ./gpu_logs); each stage has its own time limit so a hang cannot eat the rest.
set -u
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=$PWD:/tmp/site
else
    export PYTHONPATH=$PWD
fi

stage() {  # stage NAME SECONDS CMD...: run with a limit, log to $OUT/NAME.log, never stop the script
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T))"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "=== $name rc=$? ($(date +%T))"
    tail -n 25 "$OUT/$name.log"
}

case ${1:-tests} in
tests)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, transformers, peft, trl, datasets, hydra; print(sys.version.split()[0], torch.__version__,
torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__)"
    stage gpu_tests 200 python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -x -rs
    stage bench_tiny 150 python3 benchmarks/bench_vs_trl.py --device cuda --size tiny --steps 5 --warmup-steps 2 \
        --repeats 1 --sides trl,trl_gc,prorl_hf,prorl_fast,prorl_native --results "$OUT/bench_tiny.json"
    stage ref_memory 120 python3 benchmarks/bench_ref_memory.py --device cuda --hidden 1024 --layers 16
    ;;
profile)
    stage gpu_tests 200 python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider -x -rs
    stage profile_05b 420 python3 benchmarks/bench_vs_trl.py --device cuda --size 0.5b --steps 5 --warmup-steps 2 \
        --repeats 1 --sides trl,prorl_fast,prorl_native,prorl_hf --profile --results "$OUT/profile_05b.json"
    ;;
speed)
    stage bench_05b 560 python3 benchmarks/bench_vs_trl.py --device cuda --size 0.5b --steps 5 --warmup-steps 2 \
        --repeats "${REPEATS:-3}" --sides "${SIDES:-trl,prorl_hf,prorl_fast,prorl_native}" --results "$OUT/bench_05b.json"
    ;;
esac
