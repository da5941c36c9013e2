#!/bin/sh
# Schedule files in torch.distributed.pipelining's CSV form (tests/sched/README.md says what each
# fixture follows): distlab-train runs each good one and trains the model one rank trains
# (--check, f64), writes its schedule back (--write-schedule) identical for the newer-letter
# files; distlab-bench pipeline --write-schedule gives a file the trainer runs; each bad file is
# refused on one line with its row, cell and reason, exit status 2.
SELF=test_sched_file
SRC=${srcdir:-$(dirname "$0")/../..}
. "$SRC/tests/apps/lib.sh"
APP=$(app_bin distlab-train) || exit 1
BENCH=$(app_bin distlab-bench) || exit 1
D=$SRC/tests/sched
TINY="--d-model 32 --heads 4 --seq 16 --micro-batch 2 --log-every 0 --eval-windows 1 --dtype f64"

for f in newer_zb1p_p2_m4 older_letters_p2_m4 older_bw_full_p2_m2 zbv_p2_m4 comm_overlap_p2_m4; do
  m=${f##*_m}
  if run "$f" 0 $TINY --layers 4 --pp 2 --microbatches "$m" --steps 2 --check \
      --schedule-file "$D/$f.csv" --write-schedule "$TMP/$f.csv"; then
    has "$f" "verdict: PASS"
    has "$f" "wrote the schedule"
  fi
done
has comm_overlap "communication actions"
# written back without the idle cells
sed 's/,,*/,/g; s/^,//' "$D/newer_zb1p_p2_m4.csv" >"$TMP/packed.csv"
cmp -s "$TMP/packed.csv" "$TMP/newer_zb1p_p2_m4.csv" || fail "newer letters: written back differently"
cmp -s "$D/zbv_p2_m4.csv" "$TMP/zbv_p2_m4.csv" || fail "zb-v: written back differently"
# the older letters read as the same schedule as the newer
cmp -s "$TMP/older_letters_p2_m4.csv" "$TMP/newer_zb1p_p2_m4.csv" || fail "older letters: not the newer file's schedule"

# the bench writes what the trainer runs
if run_cmd "bench write" 0 "$BENCH" pipeline --quick --schedules zb-h1 --stages 2 \
    --microbatches 4 --overhead-steps 0 --steps 1 --write-schedule "$TMP/b.csv"; then
  run "bench file" 0 $TINY --layers 2 --pp 2 --microbatches 4 --steps 1 --schedule-file "$TMP/b.csv"
fi

refused "W before I" "row 2, cell 2 \('1W0'\).*weight gradient before its input gradient" \
  $TINY --layers 2 --pp 2 --microbatches 1 --schedule-file "$D/bad_w_before_i.csv"
refused "cycle" "row 1, cell 2 \('0B0'\).*deadlock" \
  $TINY --layers 2 --pp 2 --microbatches 2 --schedule-file "$D/bad_cycle.csv"
refused "missing micro-batch" "stage 1 never runs F1" \
  $TINY --layers 2 --pp 2 --microbatches 2 --schedule-file "$D/bad_missing_mb.csv"
refused "duplicated micro-batch" "row 1, cell 2 \('0F0'\).*repeats" \
  $TINY --layers 2 --pp 2 --microbatches 1 --schedule-file "$D/bad_duplicate_mb.csv"
refused "stage on two ranks" "row 2, cell 1 \('1F0'\): stage 1 is on two ranks" \
  $TINY --layers 2 --pp 2 --microbatches 1 --schedule-file "$D/bad_stage_two_ranks.csv"
refused "memory limit" "row 1, cell 3 \('0F2'\).*over the stage's memory limit 2" \
  $TINY --layers 2 --pp 2 --microbatches 4 --schedule-mem-limit 2 \
  --schedule-file "$D/bad_memory_limit_2.csv"
refused "malformed cell" "row 2, cell 4 \('1Q1'\): unknown action type" \
  $TINY --layers 2 --pp 2 --microbatches 2 --schedule-file "$D/bad_cell.csv"
refused "rows vs pp" "has 2 rows \(ranks\) for pp 4" \
  $TINY --layers 4 --pp 4 --microbatches 4 --schedule-file "$D/newer_zb1p_p2_m4.csv"
refused "m" "use --microbatches 4" \
  $TINY --layers 2 --pp 2 --microbatches 2 --schedule-file "$D/newer_zb1p_p2_m4.csv"
refused "with --schedule" "--schedule-file gives the schedule" \
  $TINY --layers 2 --pp 2 --microbatches 4 --schedule zb-h1 --schedule-file "$D/newer_zb1p_p2_m4.csv"
finish
