# Shared by the bench scripts (sourced): wall times in microseconds, their median and range.

# Runs a command; its wall time in microseconds goes to fd 3.
secs() { local s e; s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e - s) / 1000 )) >&3; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# The range of the microseconds on stdin, in seconds: 0.085-0.151.
spread() { sort -n | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.3f-%.3f", lo/1e6, hi/1e6}'; }
fmt() { awk -v u="$1" 'BEGIN {printf "%.3f", u/1e6}'; }
