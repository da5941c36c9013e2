#!/bin/sh
# Command-line contract of distlab-lecture: `all --check` reproduces every figure the lecture
# states (no DIFF, exit 0), each section runs alone (03: an 8-layer MLP through the pipeline
# engine on rank threads; 04: ZeRO on rank threads), --json gives
# one record per figure and a summary, usage errors exit 2 with one line on stderr, and --help /
# --version work. Run by `make check` from the build directory (./apps/distlab-lecture).

SELF=test_lecture
. "$(dirname "$0")/lib.sh"
APP=$(app_bin distlab-lecture) || exit 1
# after a wrong status: the DIFF lines
run_failed() { grep "^DIFF" "$TMP/out" | head -20; }

# ---- everything, checked ----
if run "all --check" 0 all --check; then
  grep -q "^DIFF" "$TMP/out" && fail "all --check: a DIFF line"
  for ref in "§1.2" "§1.3" "§2 " "§3.3" "§3.4" "§3.5" "§4.1" "§4.2" "§4.3" "§4.4" "§5.2" "§6.2" "§6.3" "§6.4" "ex. 6"; do
    has_re "all --check" "^MATCH  *$ref"
  done
  has_re "all --check" " 0 DIFF"
  [ -s "$TMP/err" ] && fail "all --check: stderr not empty: $(head -c 300 "$TMP/err")"
fi

# ---- each section alone ----
if run "01" 0 01 --check; then
  has_re 01 "2.87 GB"
  has_re 01 "275 GB"
  has_re 01 "1.864 s"
  has_re 01 "both directions"
  grep -q "§2 " "$TMP/out" && fail "01 printed section 02"
fi
if run "02" 0 02 --check; then
  has_re 02 "352.3 MB"
  has_re 02 "512 vs 2048"
  has_re 02 "TP 4 vs one rank"
  has_re 02 "heads split 8 ways"
  has_re 02 "= 2(N-1)/N x"
fi
if run "03" 0 03 --check; then
  has_re 03 "GPU 4  ···0aa1bb2cc3dd4ee5ff6gg7hh······"
  has_re 03 "1F1B (8 micro-batches): bubble 27.3%, activations held per stage 4 / 3 / 2 / 1"
  has_re 03 "15.8%"
  # beyond the lecture: the zero-bubble grids with W in capitals and the papers' formulas
  has_re 03 "GPU 4  ···0a1b2c3dA4eB5fC6gD7hEFGH"
  has_re 03 "^MATCH .*zb-h1 (m = 8), simulated *11.1% .*paper (p-1)(F+B-W): 11.1%"
  # DualPipeV: its grid, and its paper formula shown as the bound it is (no verdict)
  has_re 03 "GPU 4  ···001122334aA4aA5bB5bB6cC6cC7dD7deeffgghhDEEFFGGHH"
  has_re 03 "^  .*dualpipev (m = 8), simulated *5.9% .*a bound: 11.1%"
  has_re 03 "0-1, 2-5, 6-9, 10-11: 4 / 4 / 4 / 5, max 5"
  # code 03 part 2: the 8-layer MLP in 4 stages through the pipeline engine (GPipe m = 1 / 4 / 8,
  # 1F1B m = 4 / 8), gradients against the full batch at rounding level (f32 <= 1e-5, f64
  # <= 1e-12: a larger difference is a DIFF, and --check exits 1), activations held as simulated
  n=$(grep -c '^MATCH .*8-layer MLP, .* vs full batch, max |grad diff| (f32)' "$TMP/out")
  [ "$n" -eq 5 ] || fail "03: $n of 5 pipelined MLP runs within 1e-5 of the full batch in f32"
  n=$(grep -c '^MATCH .*8-layer MLP, .* vs full batch, max |grad diff| (f64)' "$TMP/out")
  [ "$n" -eq 5 ] || fail "03: $n of 5 pipelined MLP runs within 1e-12 of the full batch in f64"
  has_re 03 "^MATCH .*8-layer MLP, GPipe m = 1 vs full batch, max |grad diff| (f32) *0.0e+00"
  has_re 03 "^MATCH .*8-layer MLP, 1F1B m = 8: activations each stage held (measured) *4 / 3 / 2 / 1"
  has_re 03 "^MATCH .*8-layer MLP, GPipe m = 8: activations each stage held (measured) *8 / 8 / 8 / 8"
  has_re 03 "1F1B, m = 8 .* 4 / 3 / 2 / 1 *24576 B"
  has_re 03 " 0 DIFF"
  [ -s "$TMP/err" ] && fail "03 --check: stderr not empty: $(head -c 300 "$TMP/err")"
fi
if run "04" 0 04 --check; then
  # measured bytes per parameter (16 / 7 / 5.5 / 4 plus padding), elements sent (2Psi, 3Psi
  # (N-1)/N at the padded 1636), ZeRO-1..3 bitwise equal, f32 within round-off, Figure 1
  has_re 04 "16.029 (26176 B)"
  has_re 04 "7.013 (11452 B)"
  has_re 04 "5.510 (8998 B)"
  has_re 04 "4.007 (6544 B)"
  has_re 04 "2454 = RS 1227 + AG 1227"
  has_re 04 "3681 = RS 1227 + 2 AG 2454"
  has_re 04 "^MATCH .*1.500 x"
  has_re 04 "^MATCH .*0.0e+00, 0.0e+00"
  has_re 04 "^MATCH .*f32 params and grads, P_os+g+p (ZeRO-3) vs single rank"
  has_re 04 "31.41 GB"
  has_re 04 "1.88 GB"
  has_re 04 "18 MATCH, 0 DIFF"
  [ -s "$TMP/err" ] && fail "04 --check: stderr not empty: $(head -c 300 "$TMP/err")"
fi
if run "04 --json" 0 04 --json --check; then
  n=$(grep -c '^{"type":"figure","schema":"distlab/1","app":"distlab-lecture","section":"04"' "$TMP/out")
  [ "$n" -ge 20 ] || fail "04 --json: $n figure records"
  grep -q '"id":"zero3_bytes_per_param","label":[^}]*"value":4.00' "$TMP/out" || fail "04 --json: ZeRO-3 bytes"
  tail -n 1 "$TMP/out" | grep -q '"type":"summary".*"diff":0,.*"ok":true' || fail "04 --json: summary"
  grep -qv '^{' "$TMP/out" && fail "04 --json: a line that is not a JSON object"
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json,sys
for l in open(sys.argv[1]): json.loads(l)' "$TMP/out" || fail "04 --json: invalid JSON"
  fi
fi
if run "05" 0 05 --check; then
  has_re 05 "27, 18 fit"
  has_re 05 "27, 14 fit"
  has_re 05 "8 x 8 x 16"
fi
if run "06" 0 06 --check; then
  # the capacity sweep on 4 rank threads (step 1's exact counts: drops fall to 0 as C grows, the
  # experts' idle share grows), two all-to-alls per MoE layer counted from the bytes, and the
  # planner's Mixtral-sized layer: 2 x 8192 x 2 x 4096 x 2 B x 7/8 = 234.9 MB, 4.70 / 14.59 ms
  has_re 06 "^MATCH .*too small a capacity factor: tokens overflow"
  has_re 06 "^MATCH .*too large a capacity factor: some GPUs idle"
  has_re 06 "^MATCH .*all-to-alls per MoE layer in the forward (bytes counted) *2 (dispatch + combine)"
  has_re 06 "^MATCH .*bytes a GPU sends, forward *234.9 MB"
  has_re 06 "^MATCH .*cross-node communication / compute *0.322"
  has_re 06 "C no limit: choices dropped, step 1 *0.0%"
  has_re 06 "InfiniBand 50 GB/s per GPU per direction"
  has_re 06 " 0 DIFF"
  [ -s "$TMP/err" ] && fail "06 --check: stderr not empty: $(head -c 300 "$TMP/err")"
fi
if run "exercises" 0 exercises --check; then
  has_re exercises "1120 GB, 14 GPUs"
  has_re exercises "17.5 GB"
  has_re exercises "4.4 + 0.8 = 5.2 GB"
  has_re exercises "m >= 64"
  has_re exercises "7/39"
fi
# without --check: no marks, status 0
if run "01 plain" 0 01; then
  grep -q "MATCH" "$TMP/out" && fail "01 without --check printed MATCH"
fi

# ---- JSON Lines ----
if run "03 --json" 0 03 --json --check; then
  n=$(grep -c '^{"type":"figure","schema":"distlab/1","app":"distlab-lecture"' "$TMP/out")
  [ "$n" -ge 10 ] || fail "03 --json: $n figure records"
  for id in pipe_gpipe_m1 pipe_gpipe_m4 pipe_gpipe_m8 pipe_1f1b_m4 pipe_1f1b_m8; do
    for t in f32 f64; do
      grep -q "\"id\":\"${id}_$t\".*\"check\":\"MATCH\"" "$TMP/out" || fail "03 --json: ${id}_$t not a MATCH record"
    done
  done
  tail -n 1 "$TMP/out" | grep -q '"type":"summary".*"diff":0,.*"ok":true' || fail "03 --json: summary"
  grep -qv '^{' "$TMP/out" && fail "03 --json: a line that is not a JSON object"
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json,sys
for l in open(sys.argv[1]): json.loads(l)' "$TMP/out" || fail "03 --json: invalid JSON"
  fi
fi

# ---- usage ----
usage_error "bad section" "unknown section 'zz'" zz
usage_error "no section" "missing SECTION" --check
usage_error "two sections" "one SECTION only" 01 03
usage_error "bad option" "unknown option" 01 --bogus
usage_error "did you mean" "unknown option '--chek' (did you mean '--check'?" 01 --chek
if run "--help" 0 --help; then
  for w in 01 02 03 04 05 06 exercises all --check --json --help --version; do
    has_re "--help" " $w"
  done
fi
if run "--version" 0 --version; then
  has_re "--version" "^distlab-lecture (distlab) "
fi

finish "ok"
