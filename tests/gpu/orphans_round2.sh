#!/usr/bin/env bash
# Real-GPU checks of `gpudoc orphans` and `run --kill-orphans` where people run jobs (issue 26, items
# 13-16), in one device call. Expects .device/gpudoc (a build of this commit). Prints what each check saw
# (verdict, reason, outcome, memory back, nvidia-smi after) and leaves them in $OUT/orphans2/.
set -u
G=$PWD/.device/gpudoc; chmod +x $G
R=${OUT:-/tmp}/orphans2; mkdir -p $R
export XDG_STATE_HOME=$R/state PYTHONUNBUFFERED=1
wait_for() { for i in $(seq 600); do grep -q "$1" "$2" 2>/dev/null && return; sleep 0.1; done; echo "timeout: $1 in $2"; }
verdict() { python3 -c "import json,sys; v=json.load(open('$1')); [print(h['pid'], h['verdict'], h['gpu_bytes'], h['reason']) for h in v['holders'] if h['pid']==$2]; [print(e) for e in v['ended']]; print('freed', v['freed'])"; }
apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; }

echo "== 16: main thread exited (pthread_exit), 2 GiB held, parent killed"
# A session of its own, led by a shell that is then killed: the job's leader is gone.
setsid -f bash -c "echo \$\$ > $R/leader; python3 tests/gpu/headless.py 2 > $R/headless.out 2>&1 & wait"
wait_for held $R/headless.out; H=$(awk '{print $2}' $R/headless.out); sleep 1; kill -9 $(cat $R/leader)
grep -E 'State|Threads' /proc/$H/status; apps
$G orphans --kill --yes --grace 5s --json $R/headless.json > $R/headless.txt 2>&1; echo "exit $?"
verdict $R/headless.json $H; apps

echo "== 16: the same under gpudoc run --kill-orphans"
$G run --kill-orphans --json $R/headless_run.json -- sh -c "python3 tests/gpu/headless.py 2 > $R/hr.out & while ! grep -q held $R/hr.out; do sleep 0.1; done; sleep 1" 2> $R/headless_run.txt
python3 -c "import json; print(json.load(open('$R/headless_run.json'))['orphans'])"; apps

echo "== 13: a script's gpudoc run leaves 2 GiB; the advice, from the same script"
bash -c "$G run -q --json $R/script.json -- sh -c 'python3 tests/gpu/hold.py 2 > $R/s.out & while ! grep -q held $R/s.out; do sleep 0.1; done'; \
  $G orphans --kill --yes --grace 5s --json $R/script_orphans.json > $R/script.txt 2>&1; echo \"orphans exit \$?\""
S=$(python3 -c "import json; print(json.load(open('$R/script.json'))['orphans'][0]['pid'])")
verdict $R/script_orphans.json $S; apps

echo "== 14: session leader left a zombie (does this PID 1 reap?)"
setsid -f bash -c "python3 tests/gpu/hold.py 2 > $R/z.out 2>&1 & exit"
wait_for held $R/z.out; sleep 1
Z=$(pgrep -f 'tests/gpu/hold.py 2' | head -1); ps -o pid,ppid,pgid,sid,stat,comm -p $Z -p $(ps -o sid= -p $Z)
$G orphans --kill --yes --grace 5s --json $R/zombie.json > $R/zombie.txt 2>&1; echo "exit $?"
verdict $R/zombie.json $Z; apps

echo "== 15: nohup, its shell gone: listed detached, ended only with --detached"
setsid -f bash -c "nohup python3 tests/gpu/hold.py 2 > $R/n.out 2>&1 &"
wait_for held $R/n.out; sleep 1; N=$(pgrep -f 'tests/gpu/hold.py 2' | head -1)
$G orphans --kill --yes --grace 5s --json $R/nohup.json > $R/nohup.txt 2>&1; echo "exit $?"; verdict $R/nohup.json $N
$G orphans --kill --yes --detached --grace 5s --json $R/nohup2.json > $R/nohup2.txt 2>&1; echo "exit $?"; verdict $R/nohup2.json $N
apps
