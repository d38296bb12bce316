#!/bin/bash
# Issue 33's runs on a lent GPU machine (H100/H200, 16 cores, no network), in the repo root:
#     bash benchmarks/gpu_session.sh env pretrain packages tests ceiling serve cpu16 workers
#     bash benchmarks/gpu_session.sh env mfu             # BERT-base's step: 6 settings, ~6 min
# What it needs there, carried in .gpu/ (git-ignored; each call carries at most 64 MiB, so the
# 244 MiB onnxruntime-gpu wheel travels in pieces, in calls less than 30 s apart; a carried path
# does not outlive its call, so each piece's call runs this script with no stage, which copies
# the piece to /tmp/parts):
#   .gpu/p*/ort.0N     onnxruntime-gpu 1.31.1 cp312 manylinux (CUDA 13: the image's CUDA wheels
#                      serve it) cut with `split -n 5 -d`; .gpu/ort.sha256 its sha256
#   .gpu/p*/mini.0N    all-MiniLM-L6-v2's model.safetensors as fp16 (45 MB), cut in 4; the
#                      other files of its folder in .gpu/minilm/
#   .gpu/whl/          the service's wheels the image lacks (fastapi, starlette, pydantic(-core,
#                      -settings), python-dotenv, annotated-types, typing-inspection, uvicorn,
#                      orjson, httptools, opentelemetry-api, importlib-metadata), cp312
#                      (PACKAGES, VARIANTS: what the packages stage builds)
#   .gpu/data/         sst2/{train,dev}.tsv, stsb/dev.tsv, vocab/bert-base-uncased and corpus/
#                      (its books and wikitext-2) from ../shared/data
# The `step` and `evidence` stages need only .gpu/data and .gpu/whl (torch is the image's).
# Results land in /tmp/results, packed into $OUT/results.tgz after every step.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p /tmp/parts /tmp/results $OUT
cp .gpu/p*/* /tmp/parts/ 2>/dev/null
R=/tmp/results
PY=${PY:-python3}
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 ))s $*"; }
pack() { tar -czf $OUT/results.tgz -C /tmp results; }
collect() {  # the evidence runs finished so far (each fine-tuning writes evidence.json when done)
  for f in /tmp/pe-*/sst2-*/evidence.json /tmp/pe-*/*/log.jsonl; do
    [ -f "$f" ] && mkdir -p $R/evidence-runs && cp "$f" "$R/evidence-runs/$(echo ${f#/tmp/} | tr / _)"
  done
}
deps() {  # project deps (service) into /tmp/site; the image's torch, tokenizers, numpy stay
  [ -d /tmp/site/fastapi ] || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site
  mkdir -p ../shared; [ -e ../shared/data ] || ln -s $PWD/.gpu/data ../shared/data
}
ortgpu() {  # onnxruntime-gpu joined from its pieces, ahead of the image's CPU onnxruntime
  if [ ! -d /tmp/ortsite/onnxruntime ]; then
    cat /tmp/parts/ort.0* > /tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
    sha256sum /tmp/onnxruntime_gpu-*.whl | cut -c1-64 | diff - .gpu/ort.sha256 || { echo "ort wheel sha mismatch"; return 1; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ortsite /tmp/onnxruntime_gpu-*.whl 2>&1 | tail -2
  fi
  export PYTHONPATH=/tmp/ortsite:/tmp/site
}
minilm() {  # .gpu/minilm16.safetensors whole (45 MB: fits one call beside the tree), or its pieces
  if [ ! -f /tmp/minilm/model.safetensors ]; then
    mkdir -p /tmp/minilm; cp -r .gpu/minilm/. /tmp/minilm/
    if [ -f .gpu/minilm16.safetensors ]; then cp .gpu/minilm16.safetensors /tmp/; else cat /tmp/parts/mini.0* > /tmp/minilm16.safetensors; fi
    $PY -c "
from safetensors.torch import load_file, save_file
t = load_file('/tmp/minilm16.safetensors')
save_file({k: v.float().contiguous() for k, v in t.items()}, '/tmp/minilm/model.safetensors')"
  fi
  export MINILM=/tmp/minilm
}
for stage in "$@"; do
  log "stage $stage"
  case $stage in
  env)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; $PY -V; nproc; free -g | head -2
    lscpu | grep -E 'Model name|Flags' | cut -c1-200
    $PY -c "import torch, onnxruntime; print('torch', torch.__version__, torch.version.cuda, 'ort', onnxruntime.__version__)" ;;
  step)  # where BERT-base's pretraining step spends its time: loader vs device
    deps
    timeout 150 $PY -m benchmarks.pretrain_step --config base --batch-size 128 --steps 30 > $R/pretrain-step.log 2>&1
    echo "rc=$?"; cat $R/pretrain-step.log | grep -v '^corpus' ;;
  evidence)  # mini and small side by side: each pretrains ${BUDGET:-4m}, then 8 fine-tunings at once
    deps
    (while sleep 20; do collect; pack; done) & packer=$!
    pids=()
    for c in mini small; do
      lr=1e-3; [ $c = small ] && lr=5e-4
      timeout ${EVIDENCE_S:-520} $PY -m benchmarks.pretrain_evidence --config $c --budget ${BUDGET:-4m} \
        --batch-size 256 --lr $lr --warmup 300 --eval-every 500 --finetune-epochs 1 --low-data 2000 \
        --low-data-epochs 5 --jobs 8 --work /tmp/pe-$c --results $R --name pretrain_evidence_gpu_$c ${EVIDENCE_ARGS:-} \
        > $R/evidence-$c.log 2>&1 & pids+=($!)
    done
    for pid in "${pids[@]}"; do wait $pid; echo "rc=$?"; done; kill $packer; collect
    for c in mini small; do grep -v '^corpus\|it/s\]' $R/evidence-$c.log | tail -30; done ;;
  mfu)  # BERT-base's step: the MLM head's two ways, eager vs compiled, blocks vs whole files
    deps
    run=0
    for spec in "blocks chosen 128 -" "blocks fixed 128 -" "files fixed 128 compile" "files chosen 128 compile" \
                "files fixed 256 compile" "files fixed 256 reduce-overhead"; do
      set -- $spec; run=$((run + 1))
      flags="--documents $1 --head $2 --batch-size $3"
      [ $4 = compile ] && flags="$flags --compile"
      [ $4 = reduce-overhead ] && flags="$flags --compile --compile-mode reduce-overhead"
      modes="device trained"; [ $run = 2 ] && modes="loader device inline trained"
      timeout ${MFU_S:-100} $PY -m benchmarks.pretrain_step --config base --steps 20 --warmup 4 --cache-dir /tmp/cache \
        --modes $modes $flags > $R/mfu-$run.log 2>&1
      echo "rc=$? $spec"; grep -v '^corpus\|^tokeniz' $R/mfu-$run.log | tail -6; pack
    done ;;
  profile)  # BERT-base compiled at batch 512, one pretrain_step run per flag set in PROFILE_RUNS
    # (comma-separated; default: the kernel profile, then Q, K, V as three GEMMs)
    deps
    run=0
    IFS=, read -ra extras <<< "${PROFILE_RUNS:---profile 3,--three-qkv}"
    for extra in "${extras[@]}"; do
      run=$((run + 1))
      timeout ${MFU_S:-150} $PY -m benchmarks.pretrain_step --config base --steps 15 --warmup 4 --cache-dir /tmp/cache \
        --modes device --documents files --head fixed --batch-size 512 --compile $extra > $R/profile-$run.log 2>&1
      echo "rc=$? $extra"; grep -v '^corpus\|^tokeniz' $R/profile-$run.log | tail -40 | cut -c1-200; pack
    done ;;
  pretrain)
    mkdir -p /tmp/corpus; find training service heads benchmarks demo tests -name '*.py' -exec cp --backup=numbered {} /tmp/corpus/ \;
    for c in off on; do
      flag=; [ $c = on ] && flag=--compile
      timeout 300 $PY -m training.pretrain --corpus /tmp/corpus --tokenizer .gpu/data/vocab/bert-base-uncased/vocab.txt \
        --config base --max-seq-length 128 --batch-size 128 --steps ${STEPS:-50} --log-every 10 --save-every 1000000 \
        --documents files --out /tmp/pt-$c --no-progress $flag > $R/pretrain-compile-$c.log 2>&1
      echo "rc=$?"; tail -4 $R/pretrain-compile-$c.log; cp /tmp/pt-$c/log.jsonl $R/pretrain-compile-$c.jsonl 2>/dev/null
    done ;;
  lora)  # issue 52's quality: full / LoRA / frozen fine-tuning of all-MiniLM-L6-v2, SST-2 and CoNLL-2003
    # (.gpu/data/sst2/{train.tsv.gz,dev.tsv}, .gpu/data/conll2003/{eng.train.gz,eng.testa})
    deps; minilm
    mkdir -p /tmp/qdata; cp -r .gpu/data/. /tmp/qdata/; gunzip -f /tmp/qdata/*/*.gz
    for t in conll sst2; do for w in frozen lora full; do  # one run each: a timeout loses one row only
      e=${EPOCHS:-2}; [ $t = sst2 ] && e=${EPOCHS_SST2:-$e}
      timeout ${LORA_S:-150} $PY -m benchmarks.lora_quality --tasks $t --ways $w --epochs $e --init $MINILM \
        --data /tmp/qdata --out /tmp/lora-runs --results $R/lora-$t-$w ${LORA_ARGS:-} > $R/lora-$t-$w.log 2>&1
      echo "rc=$? $t $w"; grep "^| $t" $R/lora-$t-$w/lora_quality.md 2>/dev/null || tail -5 $R/lora-$t-$w.log; pack
    done; done ;;
  tests)
    deps; ortgpu
    timeout 240 $PY -m pytest -p no:cacheprovider -m gpu -q tests/service/test_gpu.py \
      tests/training/test_finetune.py::test_fp16_with_loss_scaling_trains_on_a_gpu > $R/gpu-tests.log 2>&1
    echo "rc=$?"; tail -15 $R/gpu-tests.log ;;
  packages)
    deps; ortgpu; minilm
    timeout 300 $PY -m benchmarks.packages --only ${PACKAGES:-minilm-embed base-classify} --variants ${VARIANTS:-fp32,int8,fp16} \
      --out models/bench --results $R > $R/packages.log 2>&1; echo "rc=$?"; tail -5 $R/packages.log ;;
  ceiling)
    deps; ortgpu
    for p in base-classify minilm-embed; do
      timeout 120 $PY -m benchmarks.gpu_ceiling --package models/bench/$p --variants fp32 fp16 \
        --batch-sizes 1 8 32 128 256 --budget 0.8 --out $R > $R/ceiling-$p.log 2>&1; echo "rc=$?"; tail -14 $R/ceiling-$p.log; pack
    done ;;
  shapes)  # what an unseen (batch, length) costs on the CUDA provider, fp32 vs fp16 (why fp16 served slower)
    deps; ortgpu
    timeout 240 $PY -m benchmarks.gpu_ceiling --package models/bench/base-classify --variants fp32 fp16 \
      --batch-sizes 32 --budget 0.5 --new-shapes 200 --tag shapes --out $R > $R/shapes.log 2>&1
    echo "rc=$?"; tail -12 $R/shapes.log ;;
  serve)
    deps; ortgpu
    for p in base-classify minilm-embed; do
      timeout 200 $PY -m benchmarks.serve --package models/bench/$p --variants fp32 fp16 --levels 1 8 32 128 \
        --repeat 1 --duration 4 --warmup 1.5 --batch-sizes 1 8 32 64 128 --raw-budget 0.4 --no-peer \
        --quality-inputs 300 --requests 1000 --tag gpu --out $R --device cuda > $R/serve-$p.log 2>&1
      echo "rc=$?"; tail -25 $R/serve-$p.log; pack
    done ;;
  workers)
    deps; ortgpu
    for w in 2 4; do
      timeout 100 $PY -m benchmarks.serve --package models/bench/base-classify --variants fp16 --levels 128 \
        --repeat 1 --duration 4 --warmup 2 --batch-sizes 64 --raw-budget 0.3 --no-peer --no-quality --requests 1000 \
        --tag gpu-workers$w --out $R --device cuda --server-arg=--workers=$w > $R/serve-workers$w.log 2>&1
      echo "rc=$?"; tail -12 $R/serve-workers$w.log; pack
    done ;;
  cpu16)
    deps  # the image's CPU onnxruntime
    for layout in 1x16 4x4 8x2 16x1; do
      w=${layout%x*}; t=${layout#*x}
      timeout 90 $PY -m benchmarks.serve --package models/bench/minilm-embed --variants fp32 int8 --levels 32 128 \
        --threads $t --repeat 1 --duration 3 --warmup 1.5 --batch-sizes 16 32 64 --raw-budget 0.4 --no-peer --no-quality \
        --requests 1000 --tag cpu16-$layout --out $R --server-arg=--workers=$w > $R/cpu16-$layout.log 2>&1
      echo "rc=$?"; tail -12 $R/cpu16-$layout.log; pack
    done ;;
  esac
  pack
done
log done
