#!/usr/bin/env bash
# One H200 call of session 12 (2026-12-02), on a fresh machine: the kernels' wheels are built when no earlier call's
# wheels are carried, then the parts named in PARTS run in that order, each side by side inside the call:
#   ak     issue 23: FA3 FP8 with eager against compiled per-head quantization, Sage 2.2, cuDNN (attention_kernels.py)
#   fwd    issue 23: the dense 5 s 768x1344 forward, FA3 FP8 with compiled quantization, with eager, and Sage 2.2
#   gates  issue 19: the per-pair gates in runs of 4 pairs (gates_speed --pairs 4; GATE_THREADS="default 4/4 2" times
#          each setting: gates side by side / torch threads), then decoding one pair's clips with
#          the RGB conversion in 1, 2, 4 and 8 threads (h3.media.decode_video(convert_threads=))
#   goals  issue 23: bench/device/h200_goals.sh with GOALS_ARGS (e.g. --rows sparse768,request15) in GOALS_BOX_S;
#   goals2 the same again with GOALS2_ARGS in GOALS2_BOX_S (e.g. --rows decode15 --decode-levers compile,fp8)
#   ab     issue 23: bench/device/h200_ab.sh in AB_BOX_S (its H200_AB_* settings pass through), its results straight
#          under $OUT/ab (state.tgz, clips.tgz, rendered tables). Session 13's call s13B, the VAE decoder's compile
#          added to the fast recipe, measured through the runtime side by side with it and judged near:
#   CALL_S=470 PARTS=ab AB_BOX_S=450 H200_AB_QUICK=1 H200_AB_WARMUP=1 H200_AB_BASELINE=fast H200_AB_SEEDS=0,1,2,3 \
#     H200_AB_CANDIDATES=bench/device/turbo4-fp8-sage-compile-vaec.toml H200_AB_GATES_RESERVE_S=70 \
#     bash bench/device/h200_session12.sh
#
#   PARTS="ak fwd" bash bench/device/h200_session12.sh        (from the repository root)
#
# Session 12's calls: s12A `PARTS="ak fwd"` (builds, kernels, FA3 forwards), s12B `PARTS="goals" GOALS_BOX_S=420
# GOALS_ARGS="--rows sparse768,request15,request15all"`, s12D `CALL_S=550 PARTS="gates goals2 goals" GATES_BOX_S=170
# GOALS2_BOX_S=200 GOALS2_ARGS="--rows decode15 --decode-tiles 304x320 --decode-levers fp8,compile,compile+fp8"
# GOALS_BOX_S=300 GOALS_ARGS="--rows sparse768,request15all"`. What they did not reach, for the next call (~560 s):
#   CALL_S=560 PARTS="goals gates goals2" GOALS_BOX_S=280 GOALS_ARGS="--rows sparse768,request15all" \
#     GATE_THREADS="default 4/4" GATES_BOX_S=90 GOALS2_BOX_S=120 \
#     GOALS2_ARGS="--rows decode15 --decode-tiles 304x320 --decode-levers compile+fp8" bash bench/device/h200_session12.sh
#
# Prepared in session 20, not run (issue 23's CUDA graphs: each compiled block captured, shapes bucketed; and
# inductor's autotuning), beside the shipped fast recipe in one process, Sage built on the way (~105 s):
#   CALL_S=560 PARTS="fwd" FWD_BOX_S=400 FWD_VARIANTS=turbo4-fp8-sage-compile,turbo4-fp8-sage-compile+graphs,\
#     turbo4-fp8-sage-compile+autotune,turbo4-fp8-sage-compile bash bench/device/h200_session12.sh
# (the variant grammar: bench/h200_recipes_speed.py's COMPILE_MODES; autotune's first call may take minutes).
# Carry .whl_prod (diffusers 0.42.1, pydantic 2.14.4 and its three wheels, PyAV 18.1.0, lpips 0.1.4, pyloudnorm 0.2.0,
# scikit-video 1.1.11: 46 MB) and either the wheels an earlier call returned (.carry/sagewhl, .carry/fa3whl) or the
# sources (.carry/sage: `git archive d1a57a5 csrc sageattention setup.py pyproject.toml README.md LICENSE MANIFEST.in`
# of thu-ml/SageAttention; .carry/fa3/fa3-src.tgz as build_fa3.sh says). h3/assets/tiny out of the index (the tree with
# it and the wheels is over 64 MiB). The two builds run side by side (105 s in s12A, 16 cores); their wheels come back
# under $OUT (put them in .carry/sagewhl and .carry/fa3whl for later calls). On a fresh checkout, from the repository
# root (`echo /.carry/ >> .git/info/exclude; echo /.whl_prod/ >> .git/info/exclude` first):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl_prod \
#     diffusers==0.42.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection av==18.1.0 \
#     lpips==0.1.4 pyloudnorm==0.2.0 scikit-video==1.1.11
#   git -C <SageAttention> archive d1a57a5 csrc sageattention setup.py pyproject.toml README.md LICENSE MANIFEST.in \
#     | tar -C .carry/sage -xf -            (the fetch tool gives the mirrors; FA3's tarball: bench/device/build_fa3.sh)
# and `git rm -r -q --cached h3/assets/tiny; echo /h3/assets/tiny/ >> .git/info/exclude` for the call (undo after:
# delete that line, `git reset -q h3/assets/tiny && git checkout -q -- h3/assets/tiny`).
# BUILD=0: no kernel builds nor kernel wheels (the gates part needs none).
# Boxes: BUILD_BOX_S (240), AK_BOX_S (90), FWD_BOX_S (220), GATES_BOX_S (150 per setting, the first + GATES_PAIRS_S
# 90 for making the pairs), GOALS_BOX_S (250), GOALS2_BOX_S (200),
# each cut to what is left of CALL_S (570); FWD_VARIANTS picks the forwards.
# Returns results.tgz. It replaces h200_session11.sh (prepared in session 10 for a machine with the wheels carried;
# never run), whose three parts are its ak, fwd and gates.
set -u
t0=$SECONDS
R=/tmp/res; rm -rf $R; mkdir -p $R/ak $R/fwd $R/gates $R/g23 $R/build
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_prod/*.whl \
  >"$R/pip.log" 2>&1 || { echo pip failed; tail -5 "$R/pip.log"; }
echo "wheels installed at $((SECONDS - t0)) s"
box=${BUILD_BOX_S:-240}
if [ "${BUILD:-1}" = 0 ]; then echo "no kernel builds (BUILD=0)"; else
  if ! ls .carry/sagewhl/*.whl >/dev/null 2>&1; then
    mkdir -p .carry/sagewhl
    (cd .carry/sage && timeout $box bash ../../bench/device/build_sageattention.sh . "$PWD/../sagewhl") \
      >"$R/build/sage.log" 2>&1 &
  fi
  if ! ls .carry/fa3whl/*.whl >/dev/null 2>&1; then
    timeout $box bash bench/device/build_fa3.sh .carry/fa3/fa3-src.tgz .carry/fa3whl >"$R/build/fa3.log" 2>&1 &
  fi
  wait
  echo "builds done at $((SECONDS - t0)) s"; tail -2 "$R"/build/*.log 2>/dev/null
  for w in .carry/sagewhl/*.whl .carry/fa3whl/*.whl; do
    [ -f "$w" ] && [ "$(stat -c %s "$w")" -lt 16000000 ] && [ -n "$(ls $R/build)" ] && cp "$w" "$OUT/"
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/sagewhl/*.whl \
    .carry/fa3whl/*.whl >>"$R/pip.log" 2>&1 || { echo kernel wheels failed; tail -5 "$R/pip.log"; }
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
python3 -c 'import flash_attn_interface, sageattention; print("fa3 and sage import")' 2>&1 | tail -1
# CALL_S (default 570): when the last part must end; each part's box is cut to what is left of it.
cap() { local l=$((${CALL_S:-570} - (SECONDS - t0) - 10)); [ $l -lt 20 ] && l=20; [ "$1" -lt $l ] && echo "$1" || echo $l; }
for part in ${PARTS:-ak fwd}; do
  case $part in
  ak)
    timeout -k 5 $(cap ${AK_BOX_S:-90}) python3 bench/attention_kernels.py --out $R/ak >"$R/ak/ak.log" 2>&1
    echo "attention kernels rc $? at $((SECONDS - t0)) s"; grep "^fa3\|^sage\|^sdpa" "$R/ak/ak.log" | cut -c1-160 ;;
  fwd)
    V=${FWD_VARIANTS:-turbo4-fp8+fa3fp8+compile+bucket,turbo4-fp8+fa3fp8eager+compile+bucket,turbo4-fp8-sage-compile}
    timeout -k 10 $(cap ${FWD_BOX_S:-220}) python3 bench/h200_recipes_speed.py --out $R/fwd/recipes_fa3quant.json \
      --shapes 5s-768x1344 --repeats 2 --variants $V >"$R/fwd/recipes.log" 2>&1
    echo "forwards rc $? at $((SECONDS - t0)) s"; grep -v "W1\|Warning" "$R/fwd/recipes.log" | grep forward_s | cut -c1-200 ;;
  gates)
    # GATE_THREADS: the settings to time, in turn: "default" (h3eval.gaterun.gate_workers' own choice, 4 gates side
    # by side on this host, torch's threads one per core), W (W gates side by side: $H3EVAL_GATE_THREADS) or W/T (and
    # torch's intra-op threads T for the process: gates_speed --torch-threads); the later runs reuse the first's pairs.
    # The first setting also makes the run's 4 pairs of 5 s 768x1344 clips: its box is GATES_BOX_S + GATES_PAIRS_S
    # (90 s; in s13A a 90 s box in all ended the default setting before it timed anything).
    # A setting may end in +passive (OMP_WAIT_POLICY=PASSIVE: OpenMP's idle threads sleep instead of spinning) or
    # +blas1 (OPENBLAS_NUM_THREADS=1) or +blasfree (H3EVAL_GATE_BLAS_THREADS=0: the gates side by side without the
    # product's one-BLAS-thread limit, as before session 16), e.g. GATE_THREADS="default default+blasfree default"; a
    # setting named again gets its own tag (_b, _c), so that an A-B-A order keeps every run's file. GATES_REPEAT (2)
    # warm runs of the 4 pairs per setting (every run's time is in the JSON's full_pair_all_s: the rate of runs <= 1 s);
    # GATES_DECODE=0 skips the decode-threads timing after the settings. +ahead1 / +ahead2: H3EVAL_DECODE_AHEAD (pairs
    # decoded ahead, h3eval.gaterun.decode_ahead_pairs). GATES_PAIRS (4): pairs in the run (their tag says p<N>).
    W=/tmp/gates-s12; reuse=""; seen=" "
    for token in ${GATE_THREADS:-default}; do
      gt=${token%%+*}; envs=""; [ "$gt" != "$token" ] && envs=${token#*+}
      box=${GATES_BOX_S:-150}; [ -z "$reuse" ] && box=$((box + ${GATES_PAIRS_S:-90}))
      np=${GATES_PAIRS:-4}; tag=s12_side4_p$np; [ "$gt" = default ] || tag=s12_side4_p${np}_t${gt/\//x}
      [ -n "$envs" ] && tag=${tag}_${envs//+/_}
      k=$(printf '%s\n' $seen | grep -cx "$tag"); seen="$seen $tag"
      [ "$k" -gt 0 ] && tag=${tag}_$(printf "\\x$(printf %x $((97 + k)))")
      side=${gt%%/*}; tt=""; [ "$gt" != "$side" ] && tt="--torch-threads ${gt#*/}"
      (if [ "$gt" != default ]; then export H3EVAL_GATE_THREADS=$side; fi
       case "+$envs+" in *+passive+*) export OMP_WAIT_POLICY=PASSIVE ;; esac
       case "+$envs+" in *+blas1+*) export OPENBLAS_NUM_THREADS=1 ;; esac
       case "+$envs+" in *+blasfree+*) export H3EVAL_GATE_BLAS_THREADS=0 ;; esac
       case "+$envs+" in *+ahead1+*) export H3EVAL_DECODE_AHEAD=1 ;; esac
       case "+$envs+" in *+ahead2+*) export H3EVAL_DECODE_AHEAD=2 ;; esac
       timeout -k 5 $(cap $box) python3 bench/gates_speed.py --device cuda -o lpips_trunk=rand \
         --gates integrity,fidelity,audio,ghosting --repeat ${GATES_REPEAT:-2} --pairs ${GATES_PAIRS:-4} \
         --workdir $W --tag $tag \
         --out "$R/gates" \
         $tt $reuse >"$R/gates/$tag.log" 2>&1; echo "gates ($token, $tag) rc $? at $((SECONDS - t0)) s")
      reuse=--reuse-run
    done
    grep -H "all gates on the pair\|at once" $R/gates/gates_speed_gpu_s12_*.md 2>/dev/null
    [ "${GATES_DECODE:-1}" = 0 ] && continue
    timeout -k 5 $(cap 60) python3 - "$W" >"$R/gates/decode.json" 2>"$R/gates/decode.log" <<'PY'
import json, statistics, sys, time
from pathlib import Path
from h3.media import decode_video
clips = sorted(Path(sys.argv[1]).rglob("*.mp4"))[:2]
out = {"clips": [str(c) for c in clips], "seconds": {}}
for convert in (1, 2, 4, 8, 1, 2, 4, 8):
    for clip in clips:
        t = time.perf_counter(); decode_video(clip, threads=0, convert_threads=convert)
        out["seconds"].setdefault(str(convert), []).append(time.perf_counter() - t)
out["median_s"] = {k: statistics.median(v) for k, v in out["seconds"].items()}
print(json.dumps(out, indent=1))
PY
    echo "decode rc $? at $((SECONDS - t0)) s"; grep -A5 median_s "$R/gates/decode.json" ;;
  goals|goals2)  # goals2: a second box with GOALS2_ARGS / GOALS2_BOX_S, written under g23b/
    if [ $part = goals ]; then B=${GOALS_BOX_S:-250} G="$R/g23" A=${GOALS_ARGS:-}
    else B=${GOALS2_BOX_S:-200} G="$R/g23b" A=${GOALS2_ARGS:-}; fi
    B=$(cap $B)
    mkdir -p "$G"
    (export GOALS_BOX_S=$((B - 5)) GOALS_ARGS="$A"
     timeout -k 10 $B bash bench/device/h200_goals.sh "$G" >"$G/driver.log" 2>&1; echo "$part rc $? at $((SECONDS - t0)) s")
    tail -c 1500 "$G/h200_goals.log" ;;
  ab)
    mkdir -p "$OUT/ab"
    BUDGET_S=$(cap ${AB_BOX_S:-300}) timeout -k 10 $(cap $((${AB_BOX_S:-300} + 15))) bash bench/device/h200_ab.sh \
      "$OUT/ab" >"$R/ab.log" 2>&1
    echo "ab rc $? at $((SECONDS - t0)) s"; tail -25 "$R/ab.log" | cut -c1-220 ;;
  esac
done
tar -czf "$OUT/results.tgz" --exclude='*.mp4' -C $R .
ls -la "$OUT"
