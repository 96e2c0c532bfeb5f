#!/usr/bin/env bash
# The command's output on an interactive terminal: `script` gives each run a pseudo-terminal on all three
# standard fds (as a shell in a terminal window does), so under gpudoc the command gets a terminal of its own
# and every byte passes through gpudoc's relay. Bare and under `gpudoc run -q` (and a build before, with
# GPUDOC_BEFORE) alternated: medians and spread of wall time; the bytes that reached the terminal compared.
# NVML is off (this measures the output path).
#   bench/terminal.sh [RUNS]          (default 9)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUDOC:-}" ]; then cargo build --release -q; fi
G="${GPUDOC:-$PWD/target/release/gpudoc}"
B="${GPUDOC_BEFORE:-}"
RUNS="${1:-9}"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
export GPUDOC_NVML_LIB=/nonexistent
python3 -c "import sys; sys.stdout.buffer.write((b'x'*79+b'\n')*(100*1024*1024//80))" > "$W/lines80"

# name | command
WORKLOADS=(
  "100 MB of 80-character lines|cat $W/lines80"
  "100k short lines|seq 100000"
  "a tqdm-style bar redrawn 20,000 times|python3 -c \"import sys; [sys.stdout.write(chr(13) + '%6d|%s|' % (i, '#' * (i % 50))) for i in range(20000)]; print()\""
  "true (gpudoc's fixed start and end)|true"
)

. bench/timing.sh
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }

# Runs the workload's script $1 (under gpudoc $2 when given) on a fresh pseudo-terminal; what reached it
# goes to $3. script's stdin is a FIFO this shell holds open: nothing typed, and no end of input (at which
# script would type an end-of-file character into the terminal).
mkfifo "$W/keys"
exec 4<> "$W/keys"
on_tty() { script -qefc "${2:+$2 run -q -- }sh $1" "$3" < "$W/keys" > /dev/null; }

cols="| workload | bare (median, s) |"
[ -n "$B" ] && cols="$cols before (median, s) |"
echo "$cols gpudoc run (median, s) | gpudoc / bare | bare range | gpudoc range | bytes |"
echo "|---|---|$([ -n "$B" ] && echo '---|')---|---|---|---|---|"
for w in "${WORKLOADS[@]}"; do
  name="${w%%|*}"; cmd="${w#*|}"
  printf '%s\n' "$cmd" > "$W/job.sh"
  : > "$W/bare.t"; : > "$W/g.t"; : > "$W/b.t"
  for _ in $(seq "$RUNS"); do
    secs on_tty "$W/job.sh" "" "$W/bare.out" 3>> "$W/bare.t"
    if [ -n "$B" ]; then secs on_tty "$W/job.sh" "$B" "$W/before.out" 3>> "$W/b.t"; fi
    secs on_tty "$W/job.sh" "$G" "$W/g.out" 3>> "$W/g.t"
  done
  # script's own header and footer lines and gpudoc's one line saying NVML is off are not the command's.
  strip() { grep -av -e '^Script \(started\|done\)' -e 'gpudoc: GPU sampling was off' "$1" | tr -d '\r'; }
  same=$(cmp -s <(strip "$W/bare.out") <(strip "$W/g.out") && echo same || echo DIFFER)
  b=$(median < "$W/bare.t"); g=$(median < "$W/g.t")
  row="| $name | $(fmt "$b") |"
  [ -n "$B" ] && row="$row $(fmt "$(median < "$W/b.t")") |"
  echo "$row $(fmt "$g") | $(ratio "$g" "$b")x | $(spread < "$W/bare.t") | $(spread < "$W/g.t") | $same |"
done
