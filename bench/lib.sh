# Shared by the bench scripts: `source "$(dirname "$0")/lib.sh"`.

# median: the median of the numbers on stdin (whitespace or newline separated).
median() {
  tr ' ' '\n' | grep -v '^$' | sort -g |
    awk '{a[NR] = $1} END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# lowest / highest: the smallest / largest of the numbers on stdin.
lowest() { tr ' ' '\n' | grep -v '^$' | sort -g | head -1; }
highest() { tr ' ' '\n' | grep -v '^$' | sort -g | tail -1; }

# cpu_snap: the machine's CPU counters from /proc/stat, as "busy steal total"
# in clock ticks. Busy is user + nice + system + irq + softirq: the work every
# process and the kernel did, wherever it was charged. Steal is time the
# hypervisor ran other guests instead of this one; it makes every figure noisy.
cpu_snap() {
  awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit }' /proc/stat
}
# cpu_busy_s "SNAP0" "SNAP1": busy CPU seconds between two snapshots.
cpu_busy_s() {
  local b0 b1 _
  read -r b0 _ _ <<<"$1"; read -r b1 _ _ <<<"$2"
  awk -v d=$((b1 - b0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", d / hz }'
}
# cpu_steal_pct "SNAP0" "SNAP1": steal in % of all CPU time between the two.
cpu_steal_pct() {
  local s0 s1 t0 t1 _
  read -r _ s0 t0 <<<"$1"; read -r _ s1 t1 <<<"$2"
  awk -v s=$((s1 - s0)) -v t=$((t1 - t0)) 'BEGIN { printf "%.1f", (t > 0 ? s * 100 / t : 0) }'
}
# cpu_busy_us_per_tx "SNAP0" "SNAP1" TRANSACTIONS: the machine's busy CPU
# microseconds per transaction between two snapshots ("%.1f").
cpu_busy_us_per_tx() {
  awk -v b="$(cpu_busy_s "$1" "$2")" -v t="$3" 'BEGIN { printf "%.1f", (t > 0 ? b * 1e6 / t : 0) }'
}

# balanced_order N ROUND: the order (0-based indexes, space separated) in
# which round ROUND (1-based) runs N contenders: a Williams design. For even
# N, over any N consecutive rounds every contender runs in every position
# once and right after every other contender once; for odd N that takes 2N
# rounds (the square, then its rows reversed), where each runs in every
# position twice and right after every other twice. So neither a position
# in the round nor the run before (warm caches, dirty pages, a host that
# slows a guest after a busy stretch) favours one contender. A plain
# rotation keeps the same neighbours in every round: one contender always
# follows the same other one.
balanced_order() {
  local n=$1 period=$(( $1 % 2 ? 2 * $1 : $1 )) j k seq=()
  local i=$(( ($2 - 1) % period ))
  local r=$(( i % n ))
  # First row 0, 1, n-1, 2, n-2, ...; row r adds r to each, modulo n.
  for ((j = 0; j < n; j++)); do
    if ((j == 0)); then k=0
    elif ((j % 2)); then k=$(( (j + 1) / 2 ))
    else k=$(( n - j / 2 )); fi
    seq+=($(( (k + r) % n )))
  done
  if ((i >= n)); then  # odd N, second square: the rows reversed
    local rev=()
    for ((j = n - 1; j >= 0; j--)); do rev+=("${seq[j]}"); done
    seq=("${rev[@]}")
  fi
  echo "${seq[*]}"
}

# settle_server PORT: brings the pgbench tables to the same state before each
# timed run, as pgbench itself does unless given -n (the benches pass -n,
# since pgbench's own vacuum would go through the path being measured): the
# small tables tpcb-like updates on every transaction vacuumed,
# pgbench_history emptied, and a checkpoint, so that no run pays for the
# writes or the dead rows of the one before it. Goes straight to the server
# on 127.0.0.1:PORT. The benches start the server with autovacuum off, so
# nothing vacuums in the middle of a run either.
settle_server() {
  psql -X -q -h 127.0.0.1 -p "$1" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "VACUUM pgbench_branches, pgbench_tellers" -c "TRUNCATE pgbench_history" -c "CHECKPOINT" >/dev/null
}

# --- a PostgreSQL on an emulated or a plain loop device ----------------------
# For emulate-overhead and emulate-vs-throttle. They use the caller's
# TIERLAB (the binary), PGBIN (PostgreSQL binaries), work (a scratch
# directory holding mnt/ and run/, run/ owned by postgres), port, and
# pg_cgroups (the cgroup v1 directories the server joins, space separated);
# they set emu_pid and dev (start_emulator) and pg_data (pg_start), which the
# caller's cleanup uses.

# start_emulator IMAGE TIER TIERS_FILE [ARG...]: `tierlab iosim emulate`
# (with the ARGs, e.g. --stats 1s) in the background, once its device is
# ready; its stderr is $work/err, and emu_t0 the time (date +%s.%N) it said
# it was ready, about when its --stats intervals start.
start_emulator() {
  "$TIERLAB" iosim emulate --tier "$2" --tiers-file "$3" --image "$1" "${@:4}" >"$work/dev" 2>"$work/err" &
  emu_pid=$!
  for _ in $(seq 100); do grep -q 'detaches it' "$work/err" && break; sleep 0.1; done
  emu_t0=$(date +%s.%N)
  dev=$(head -1 "$work/dev")
  [ -b "$dev" ] || { cat "$work/err" >&2; exit 1; }
}
stop_emulator() {
  kill -TERM "$emu_pid"; wait "$emu_pid" || true; emu_pid=
}

# pg_start / pg_stop: the server on $work/mnt/data, inside $pg_cgroups;
# $pg_listen (default none: the socket only) is its listen_addresses.
pg_start() {
  local opts="-p $port -k $work/run -c listen_addresses='${pg_listen:-}' -c shared_buffers=32MB" join="" g
  for g in $pg_cgroups; do join="$join echo \$\$ >$g/cgroup.procs &&"; done
  sh -c "$join exec runuser -u postgres -- $PGBIN/pg_ctl -D $work/mnt/data -w -l $work/run/log -o \"$opts\" start" >/dev/null
  pg_data=$work/mnt/data
}
pg_stop() {
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$work/mnt/data" -w -m fast stop >/dev/null
  pg_data=
}

# pg_image IMAGE SCALE: ext4 holding a data directory with pgbench's tables
# at SCALE, made once (IMAGE.ready marks it done).
pg_image() {
  [ -f "$1.ready" ] && return
  echo "== writing $1: ext4, pgbench -i -s $2"
  rm -f "$1"
  truncate -s $(($2 * 40 + 512))M "$1"
  local loop
  loop=$(losetup --find --show --direct-io=on "$1")
  mkfs.ext4 -q -F "$loop"
  mount "$loop" "$work/mnt"
  mkdir "$work/mnt/data"; chown postgres "$work/mnt/data"
  runuser -u postgres -- "$PGBIN/initdb" -D "$work/mnt/data" -A trust -U postgres >/dev/null
  pg_start
  "$PGBIN/pgbench" -h "$work/run" -p "$port" -U postgres -i -q -s "$2" postgres 2>/dev/null
  pg_stop
  umount "$work/mnt"; losetup -d "$loop"
  touch "$1.ready"
}

# pg_select_tps DEVICE SECONDS CLIENTS: TPS of pgbench -S on the data on
# DEVICE (mounted for the run, so its page cache starts cold).
pg_select_tps() {
  mount "$1" "$work/mnt"
  pg_start
  "$PGBIN/pgbench" -h "$work/run" -p "$port" -U postgres -n -S -T "$2" -c "$3" -j 2 postgres 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
  pg_stop
  umount "$work/mnt"
}

# profile_latency_us PROFILE_JSON read|write|flush: the mean device latency of
# that kind in a `tierlab profile --json` file, in microseconds (100 if the
# profile saw none).
profile_latency_us() {
  sed -n "/\"$2_latency\"/,/}/p" "$1" |
    awk -F: '/"count"/ {n=$2+0} /"mean_ms"/ {m=$2+0} END {printf "%.1f", (n>0 ? m*1000 : 100)}'
}
