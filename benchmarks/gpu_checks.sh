#!/usr/bin/env bash
# The GPU checks of this repository, in one script (a lent GPU machine has no network and a bare
# Python with torch + transformers + peft; the rest travels as wheels in .whl/, see docs/performance.md).
#
#   bash benchmarks/gpu_checks.sh tests    # pytest -m gpu, then a 1-repeat smoke of every benchmark   (~5 min)
#   bash benchmarks/gpu_checks.sh speed    # 0.5B, 151,936-token vocab: this round's paths vs the previous ones (~9 min)
#   bash benchmarks/gpu_checks.sh profile  # the same, 1 repeat, GPU busy fraction per side               (~6 min)
#   bash benchmarks/gpu_checks.sh char     # 0.5B layers with the 192-token vocab, and last round's 0.48B LLaMA (~8 min)
#   bash benchmarks/gpu_checks.sh options  # 0.5B: each of this round's settings switched off alone (~6 min)
#   bash benchmarks/gpu_checks.sh round    # tests, 0.5B speed with engine=trl, profile: one call (~9 min)
#   bash benchmarks/gpu_checks.sh all      # all of them in order (more than the device tool's 10 min per call)
#
# One device-tool call per stage fits its 10-minute limit; a session's 30 minutes hold four of them,
# so run `tests` and `speed` first, then `profile` and `options` (or `char`). Logs and JSON results go to $OUT (or ./gpu_logs); each stage has
# its own time limit so a hang cannot eat the rest. REPEATS and SIDES override the defaults.
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
    tail -n 30 "$OUT/$name.log"
}

BENCH="python3 benchmarks/bench_vs_trl.py --device cuda --steps 5 --warmup-steps 2"
# this round's defaults (graph decode, fused AdamW, host update_norm snapshot, chunked LM head) against
# the previous round's settings on the same fast forward
OLD="prorl_fast@decode=dynamic+update_norm=device+adamw=foreach"
NEW_SIDES="trl,prorl_hf,prorl_fast,$OLD,prorl_native"

run_tests() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, transformers, peft, trl, datasets, hydra; print(sys.version.split()[0], torch.__version__,
torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__)"
    stage gpu_tests 240 python3 -m pytest -m gpu tests/e2e/test_gpu.py -q -p no:cacheprovider -rs
    stage bench_tiny 150 $BENCH --size tiny --repeats 1 --sides "trl,prorl_hf,prorl_fast,$OLD,prorl_native" \
        --results "$OUT/bench_tiny.json"
}
run_speed() {
    stage bench_05b 560 $BENCH --size 0.5b --repeats "${REPEATS:-2}" --sides "${SIDES:-$NEW_SIDES}" \
        --results "$OUT/bench_05b.json"
}
run_profile() {
    stage profile_05b 420 $BENCH --size 0.5b --repeats 1 --sides "${SIDES:-trl,prorl_fast,$OLD}" --profile \
        --results "$OUT/profile_05b.json"
}
run_char() {
    stage bench_05b_char 280 $BENCH --size 0.5b --vocab char --repeats 1 --sides "${SIDES:-trl,prorl_fast,$OLD}" \
        --results "$OUT/bench_05b_char.json"
    stage bench_048b_llama 280 $BENCH --size 0.48b-llama --repeats 1 --sides "${SIDES:-trl,prorl_fast,$OLD}" \
        --results "$OUT/bench_048b_llama.json"
}

run_options() {  # what each setting buys: the new defaults, then one setting back to the previous round's
    stage options_05b 560 $BENCH --size 0.5b --repeats 1 --sides "${SIDES:-prorl_fast,prorl_fast@decode=static,\
prorl_fast@decode=dynamic,prorl_fast@adamw=foreach,prorl_fast@update_norm=device,prorl_fast@update_norm=off}" \
        --results "$OUT/options_05b.json"
}

run_round() {  # one device call of ~9 min (a session's 15 minutes hold one): tests, speed incl. engine=trl, profile
    run_tests_only
    stage bench_05b 220 $BENCH --size 0.5b --repeats 1 --sides "${SIDES:-trl,prorl_fast,prorl_trl,$OLD}" \
        --results "$OUT/bench_05b.json"  # 2026-11-27 on an H200: 155 s of side processes
    # 2026-11-27: 150 s stopped this after the TRL side (each profiled side's process took ~90 s)
    stage profile_05b 200 $BENCH --size 0.5b --repeats 1 --sides "trl,prorl_fast" --profile \
        --results "$OUT/profile_05b.json"
}
run_tests_only() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch, transformers, peft, trl, datasets, hydra; print(sys.version.split()[0], torch.__version__,
torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__)"
    stage gpu_tests 150 python3 -m pytest -m gpu tests/e2e/test_gpu.py -q -p no:cacheprovider -rs --timeout 90
}

case ${1:-tests} in
tests) run_tests ;;
speed) run_speed ;;
profile) run_profile ;;
char) run_char ;;
options) run_options ;;
round) run_round ;;
all) run_tests; run_speed; run_profile; run_options; run_char ;;
*) echo "usage: $0 round|tests|speed|profile|char|options|all" >&2; exit 2 ;;
esac
