#!/usr/bin/env bash
# The open issues' H200 checks in one device call (each call costs ~50 s of start and transfer): runs the
# scripts named (default: what the last closing note says is owed), each under its own time
# limit, and starts none that could not finish before the call's 600 s are up. Each script's output goes
# to $OUT/<name>.log beside its own results; the summary line per script is printed last.
#   bash tests/gpu/open.sh                      # owed (stop 55): the second judgement set whole on the merged main (its three known misses: tests/rules.rs), and issue 43's verdicts with it; both ran on c498e5a (7 BAD, 0 BAD), compiled_step alone on its mend
#   bash tests/gpu/open.sh frameworks_cost.sh:"8 tensorflow"   # owed where TensorFlow is on the device: the tf.function counter's cost on a custom loop (none had TF at stop 54)
#   bash tests/gpu/open.sh others_arrived.sh    # any of tests/gpu/*.sh, with its arguments after a colon
#   bash tests/gpu/open.sh judgement.sh         # the held-out judgement (tests/gpu/judgement.py): ten programs, what an expert says of each
#   bash tests/gpu/open.sh judgement2.sh        # its second set (tests/gpu/judgement2.py): nine more programs, judged by the same checker
# Expects what each script expects (.device/gpudoc; .whl/ for notebook.sh: see its header).
set -u
start=$SECONDS
budget=${OPEN_BUDGET_S:-570}
# name:args (or name alone) and its limit in seconds (a script past its limit is ended and said TIMED OUT).
declare -A limit=([judgement.sh]=420 [judgement2.sh]=330 [fit.sh:frag]=150 [fit.sh]=330 [where.sh]=220 [notebook.sh]=220 [others_arrived.sh]=150 [forecast.sh]=200 [eval_clock.sh:5]=330 [shim_round3.sh]=300 [record_phases.sh:verdicts]=200 [cost_round3.sh:3]=240 [cost_round3.sh:4]=480 [cost_round3.sh:5]=570 [frameworks.sh]=240 [frameworks_cost.sh]=200)
(($#)) || set -- "judgement2.sh" "record_phases.sh:verdicts"
summary=()
for item in "$@"; do
  name=${item%%:*}; args=; [[ $item == *:* ]] && args=${item#*:}
  lim=${limit[$item]:-${limit[$name]:-200}}
  left=$((budget - (SECONDS - start)))
  if ((left < lim)); then
    summary+=("$name: not started ($left s left, it may take $lim s)"); continue
  fi
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout --signal=INT --kill-after=10 "$lim" bash "tests/gpu/$name" $args > "$OUT/${name%.sh}.log" 2>&1
  rc=$?
  bad=$(grep -c 'BAD' "$OUT/${name%.sh}.log")
  what="rc $rc"; ((rc == 124)) && what="TIMED OUT after $lim s"
  summary+=("$name ${args}: $what, $((SECONDS - t0)) s, $bad BAD line(s)")
done
printf '%s\n' "${summary[@]}" | tee "$OUT/open.summary"
