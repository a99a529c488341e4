#!/usr/bin/env bash
# Measures KV-cache codecs on a real model's cache (issues 4 and 17): captures
# the KV cache over a calibration text, calibrates KVTC on it at several
# ratios, evaluates every codec on held-out text and writes a markdown
# table, a CSV and an SVG plot of compression ratio against loss increase
# (bench/kv_quality_plot.py; docs/kv_quality.md).
#
# usage: [MODEL=stories260K|shakespeare] bench/kv_quality.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR: a build with kvharbor-calibrate and kvharbor-kv-quality
#              (default build-cal); OUT_DIR default BUILD_DIR/kv_quality-$MODEL.
#   MODEL=stories260K (default): llama2.c's stories260K (MODEL_DIR, default
#     ../shared/stories260K); the first half of its 100 TinyStories
#     validation stories calibrates, the second half is held out.
#   MODEL=shakespeare: the model tools/train/train_shakespeare.py trains
#     (MODEL_DIR holds its model.bin, or the model.bin.part-NN pieces, and
#     tokenizer.bin); TEXT (default ../shared/text/tinyshakespeare.txt) is
#     split as the training script split it: the first 90% of the characters
#     (its training split) gives 64 calibration chunks of 510 characters
#     (512 tokens with BOS and the dummy space), evenly spaced; the last 10%
#     (never trained on) gives 32 held-out chunks.
#   RATIOS, GROUP_SIZES override the KVTC settings; ROW_KINDS (default
#   per_token, shakespeare: per_token,per_page) and LAYER_GROUPS (default
#   none, shakespeare: 4) add calibrations (per_token rows in that many
#   layer groups); COMMVQ_BITS=1,2 the CommVQ settings (codebooks trained on
#   the calibration text by kvharbor-kv-quality itself; empty: none).
#   CODECS (default: all) evaluates only these families, comma-separated
#   from identity,fp8,c8,kivi,nvfp4,kvtc,commvq (e.g. CODECS=commvq); without
#   kvtc the capture and the KVTC calibrations are skipped too. Every row is
#   deterministic, so a subset's rows equal those of a full run.
# Every codec's pages are stored one page per buffer, as the store evicts
# them, and bytes/token count every byte of those buffers.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cal}
MODEL=${MODEL:-stories260K}
OUT=${2:-$BUILD/kv_quality-$MODEL}
GROUP_SIZES=${GROUP_SIZES:-4,8,16,32,64,128}
COMMVQ_BITS=${COMMVQ_BITS-1,2}
CODECS=${CODECS:-}
mkdir -p "$OUT"
case "$MODEL" in
  stories260K)
    MODEL_DIR=${MODEL_DIR:-../shared/stories260K}
    RATIOS=${RATIOS:-4,8,16,32}
    ROW_KINDS=${ROW_KINDS:-per_token}
    LAYER_GROUPS=${LAYER_GROUPS:-}
    common=(--model "$MODEL_DIR/stories260K.bin" --tokenizer "$MODEL_DIR/tok512.bin"
            --text "$MODEL_DIR/validation_100.txt" --calib-fraction 0.5)
    ;;
  shakespeare)
    MODEL_DIR=${MODEL_DIR:?MODEL_DIR: the directory train_shakespeare.py wrote}
    TEXT=${TEXT:-../shared/text/tinyshakespeare.txt}
    RATIOS=${RATIOS:-4,8,16,32,64}
    ROW_KINDS=${ROW_KINDS:-per_token,per_page}
    LAYER_GROUPS=${LAYER_GROUPS-4}
    model="$MODEL_DIR/model.bin"
    if [[ ! -f "$model" ]]; then
      cat "$MODEL_DIR"/model.bin.part-* > "$OUT/model.bin"
      model="$OUT/model.bin"
    fi
    chars=$(wc -c < "$TEXT")
    train=$((chars * 9 / 10))  # train_shakespeare.py: int(len * 0.9)
    head -c "$train" "$TEXT" > "$OUT/train.txt"
    tail -c +"$((train + 1))" "$TEXT" > "$OUT/heldout.txt"
    common=(--model "$model" --tokenizer "$MODEL_DIR/tokenizer.bin"
            --calib-text "$OUT/train.txt" --text "$OUT/heldout.txt"
            --chunk-chars 510 --max-calib-sequences 64 --max-sequences 32)
    ;;
  *) echo "MODEL: '$MODEL' is not stories260K or shakespeare" >&2; exit 2 ;;
esac

cals=""
calibrate() {  # name, extra flags...
  local name=$1; shift
  "$BUILD/tools/kvharbor-calibrate" --samples "$OUT/samples.safetensors" \
    --out "$OUT/$name" --ratios "$RATIOS" --group-sizes "$GROUP_SIZES" \
    --page-size 16 --sink-tokens 4 --device cpu "$@" | tee -a "$OUT/calibration.txt"
  for r in ${RATIOS//,/ }; do cals+="$OUT/$name.${r}x.kvtc,"; done
}
eval_flags=(--commvq-bits "$COMMVQ_BITS")
if [[ -n "$CODECS" ]]; then eval_flags+=(--codecs "$CODECS"); fi
if [[ -z "$CODECS" || ",$CODECS," == *,kvtc,* ]]; then
  "$BUILD/tools/kvharbor-kv-quality" capture "${common[@]}" \
    --out "$OUT/samples.safetensors"
  : > "$OUT/calibration.txt"
  for kind in ${ROW_KINDS//,/ }; do calibrate "$kind" --row-kind "$kind"; done
  for g in ${LAYER_GROUPS//,/ }; do
    calibrate "groups$g" --row-kind per_token --layer-groups "$g"
  done
  eval_flags+=(--kvtc "${cals%,}")
fi
"$BUILD/tools/kvharbor-kv-quality" eval "${common[@]}" "${eval_flags[@]}" \
  --md "$OUT/table.md" --csv "$OUT/table.csv"

/usr/bin/python3 bench/kv_quality_plot.py "$OUT/table.csv" "$OUT/ratio_vs_loss.svg" \
  "$MODEL, held-out text: KV codec quality"
echo "plot: $OUT/ratio_vs_loss.svg"
echo "table: $OUT/table.md"
