#!/usr/bin/env bash
# make demo: the main job on real input, visibly.
#
# A stock PostgreSQL 15 primary's WAL flows through `safekeeper propose` into
# three `safekeeper run` processes; the primary's commits wait for a quorum
# (synchronous_standby_names names the proposer). pgbench runs for a while;
# a hot standby fed only by a safekeeper replays the WAL. Then the demo checks
# that the standby's query results equal the primary's. Then the bad day:
# under a ledger workload the primary's host is lost (kill -9 of the primary
# and the proposer), `safekeeper sync` commits the quorum's end of WAL, the
# standby replays to it and is promoted (PostgreSQL timeline 2), a new
# proposer protects it on the same safekeepers, and every acknowledged ledger
# transaction is counted on the promoted primary. Last, every complete WAL
# segment exported from each safekeeper is compared with the old primary's.
# All along the safekeepers archive the WAL (--remote-storage file://...):
# at the end every safekeeper's data and both primaries are gone, and a base
# backup taken before the load is restored from the archive alone to a
# point in time after the bad day: every acknowledged ledger transaction is
# there, a row committed after the target time is not. A report is printed
# and everything the demo made is removed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/bin/safekeeper
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
SCALE=${DEMO_SCALE:-5}
SECONDS_RUN=${DEMO_SECONDS:-10}
CLIENTS=${DEMO_CLIENTS:-8}
TENANT=de000000000000000000000000000001
TIMELINE=de000000000000000000000000000002
APP=proposer_$TIMELINE # the proposer's default slot and application_name

[ -x "$BIN" ] || { echo "demo: $BIN missing: run make build" >&2; exit 2; }
[ -x "$PGBIN/initdb" ] || { echo "demo: PostgreSQL 15 not found in $PGBIN (apt-get install -y postgresql-15)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/safekeeper-demo.XXXXXX)
chmod 0755 "$WORK"
pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres: "$WORK"; fi

PIDS=()
ALL_OK=1
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [ -f "$WORK/standby/postmaster.pid" ] && pg "$PGBIN/pg_ctl" -D "$WORK/standby" -m immediate -w stop >/dev/null 2>&1
  [ -f "$WORK/pitr/postmaster.pid" ] && pg "$PGBIN/pg_ctl" -D "$WORK/pitr" -m immediate -w stop >/dev/null 2>&1
  [ -f "$WORK/primary/postmaster.pid" ] && pg "$PGBIN/pg_ctl" -D "$WORK/primary" -m immediate -w stop >/dev/null 2>&1
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# stop_job SIGNAL PID: send SIGNAL to the background job PID and reap it at
# once, its status unreported: bash reports a job a signal ended
# ("demo.sh: line N: PID Killed  "$BIN" propose ...") when it reaps it,
# unless a wait whose stderr goes elsewhere reaps it.
stop_job() { kill "-$1" "$2" 2>/dev/null || true; wait "$2" 2>/dev/null || true; }

# free_port: a port on 127.0.0.1 nothing listens on.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}

# wait_until SECONDS WHAT CMD...: poll CMD until it succeeds, with a deadline.
wait_until() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then echo "demo: timed out waiting for $what" >&2; exit 1; fi
    sleep 0.2
  done
}

PPORT=$(free_port)
psql_p() { pg "$PGBIN/psql" -h 127.0.0.1 -p "$PPORT" -U postgres -d postgres -XAtq "$@"; }

say "initdb primary (PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}')) in $WORK"
pg "$PGBIN/initdb" -D "$WORK/primary" -U postgres --auth=trust >/dev/null
cat >> "$WORK/primary/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PPORT
unix_socket_directories = '$WORK'
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
synchronous_standby_names = '$APP'
wal_keep_size = '1GB'
CONF
pg "$PGBIN/pg_ctl" -D "$WORK/primary" -l "$WORK/primary.log" -w start >/dev/null

SKADDRS=()
for i in 1 2 3; do
  port=$(free_port)
  SKADDRS+=("127.0.0.1:$port")
  "$BIN" run --id "$i" --listen-pg "127.0.0.1:$port" --listen-http "127.0.0.1:$(free_port)" --data-dir "$WORK/sk$i" \
    --remote-storage "file://$WORK/archive" --partial-backup-interval 2s >"$WORK/sk$i.log" 2>&1 &
  PIDS+=($!)
done
listening() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }
for a in "${SKADDRS[@]}"; do wait_until 15 "safekeeper $a" listening "$a"; done
say "3 safekeepers listening: ${SKADDRS[*]}; they archive the WAL to file://$WORK/archive"

# The timeline is created once; the proposer never creates one (a mistyped
# id must not fork the WAL). Its slot and application_name default to
# proposer_<timeline id>: synchronous_standby_names above names it.
"$BIN" timeline create --upstream "host=127.0.0.1 port=$PPORT user=postgres" \
  --safekeepers "$(IFS=,; echo "${SKADDRS[*]}")" --tenant-id $TENANT --timeline-id $TIMELINE >"$WORK/create.log" 2>&1 \
  || { cat "$WORK/create.log"; exit 1; }
say "timeline $TENANT/$TIMELINE created on the 3 safekeepers"
"$BIN" propose --upstream "host=127.0.0.1 port=$PPORT user=postgres" \
  --safekeepers "$(IFS=,; echo "${SKADDRS[*]}")" --tenant-id $TENANT --timeline-id $TIMELINE >"$WORK/proposer.log" 2>&1 &
PROPOSER=$!
PIDS+=($PROPOSER)
proposer_sync() { [ "$(psql_p -c "select state||'/'||sync_state from pg_stat_replication where application_name='$APP'")" = streaming/sync ]; }
wait_until 60 "the proposer to stream as the synchronous standby" proposer_sync
START_LSN=$(psql_p -c "select pg_current_wal_flush_lsn()")
say "proposer streaming; primary WAL at $START_LSN; commits now wait for 2 of 3 safekeepers"

# status: one line with each safekeeper's flush/commit LSN (TIMELINE_STATUS).
sk_status() {
  local out="" a
  for a in "${SKADDRS[@]}"; do
    local row
    row=$(pg "$PGBIN/psql" "host=${a%:*} port=${a#*:} user=postgres replication=true options='-c tenant_id=$TENANT -c timeline_id=$TIMELINE'" \
          -XAtq -F' ' -c TIMELINE_STATUS 2>/dev/null | awk '{print "flush " $6 " commit " $7}') || row="down"
    out+=" | sk ${a#*:}: ${row:-down}"
  done
  echo "$out"
}
progress() {
  while :; do
    sleep 3
    local lsn mb
    lsn=$(psql_p -c "select round(pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '$START_LSN')/1048576.0, 1)" 2>/dev/null) || lsn="?"
    say "WAL streamed ${lsn} MB$(sk_status)"
  done
}

say "base backup without WAL for the point-in-time restore at the end (its WAL will come from the archive alone)"
pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PPORT" -U postgres -D "$WORK/pitr" -X none -c fast

say "pgbench -i -s $SCALE"
pg "$PGBIN/pgbench" -h 127.0.0.1 -p "$PPORT" -U postgres -i -s "$SCALE" -q postgres 2>&1 | sed 's/^/    /'

say "base backup for a hot standby that reads WAL only from safekeeper ${SKADDRS[0]}"
SPORT=$(free_port)
pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PPORT" -U postgres -D "$WORK/standby" -X stream -c fast
pg touch "$WORK/standby/standby.signal"
cat >> "$WORK/standby/postgresql.conf" <<CONF
port = $SPORT
synchronous_standby_names = ''
hot_standby = on
primary_conninfo = 'host=${SKADDRS[0]%:*} port=${SKADDRS[0]#*:} user=postgres application_name=standby1 options=''-c tenant_id=$TENANT -c timeline_id=$TIMELINE'''
wal_retrieve_retry_interval = 1s
CONF
pg "$PGBIN/pg_ctl" -D "$WORK/standby" -l "$WORK/standby.log" -w start >/dev/null

say "pgbench -c $CLIENTS -T $SECONDS_RUN (progress every 3 s)"
progress &
PROGRESS=$!
PIDS+=($PROGRESS)
(cd "$WORK" && pg "$PGBIN/pgbench" -h 127.0.0.1 -p "$PPORT" -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_RUN" -P 3 -l --log-prefix="$WORK/pgbench_log" postgres) 2>&1 \
  | tee "$WORK/pgbench.out" | grep --line-buffered '^progress' | sed -u 's/^/    pgbench /' \
  || { cat "$WORK/pgbench.out"; exit 1; }
stop_job TERM "$PROGRESS"
TXNS=$(awk '/number of transactions actually processed/ {split($NF,a,"/"); print a[1]}' "$WORK/pgbench.out")
FAILED=$(awk '/number of failed transactions/ {print $5}' "$WORK/pgbench.out")
TPS=$(awk '/^tps/ {print $3; exit}' "$WORK/pgbench.out")

psql_p -c "select pg_switch_wal()" >/dev/null
psql_p -c "create table demo_end(x int)" -c "insert into demo_end values (1)" >/dev/null
END_LSN=$(psql_p -c "select pg_current_wal_flush_lsn()")
WAL_BYTES=$(psql_p -c "select pg_wal_lsn_diff('$END_LSN', '$START_LSN')::bigint")
LAST_OLD=$(psql_p -c "select pg_walfile_name('$END_LSN')") # segments below it are complete

say "waiting for every safekeeper's commit_lsn and the standby's replay to reach $END_LSN"
sk_commit_ok() {
  local a c
  for a in "${SKADDRS[@]}"; do
    c=$(pg "$PGBIN/psql" "host=${a%:*} port=${a#*:} user=postgres replication=true options='-c tenant_id=$TENANT -c timeline_id=$TIMELINE'" -XAtq -F' ' -c TIMELINE_STATUS | awk '{print $7}')
    [ "$(psql_p -c "select '$c'::pg_lsn >= '$END_LSN'::pg_lsn")" = t ] || return 1
  done
}
wait_until 120 "safekeepers' commit_lsn" sk_commit_ok
standby_ok() { [ "$(pg "$PGBIN/psql" -h 127.0.0.1 -p "$SPORT" -U postgres -XAtqc "select pg_last_wal_replay_lsn() >= '$END_LSN'::pg_lsn")" = t ]; }
wait_until 120 "the standby's replay" standby_ok
Q="select count(*), sum(abalance) from pgbench_accounts union all select count(*), sum(delta) from pgbench_history"
P_RES=$(psql_p -c "$Q" | tr '\n' ' ')
S_RES=$(pg "$PGBIN/psql" -h 127.0.0.1 -p "$SPORT" -U postgres -XAtq -c "$Q" | tr '\n' ' ')
say "$(sk_status | sed 's/^ | //')"

# ---- The bad day: the primary's host is lost under load. ----
say "the bad day: a ledger workload, then kill -9 of the primary and the proposer (its host is lost)"
psql_p -c "create table ledger(id bigserial primary key, at timestamptz default now())" >/dev/null
echo "insert into ledger default values;" > "$WORK/ledger.sql"
chmod 0644 "$WORK/ledger.sql"
(cd "$WORK" && pg "$PGBIN/pgbench" -n -h 127.0.0.1 -p "$PPORT" -U postgres -c 4 -j 2 -T 60 -f "$WORK/ledger.sql" postgres >"$WORK/ledger1.out" 2>&1) &
LEDGER=$!
ledger_rows() { [ "$(psql_p -c "select count(*) >= 300 from ledger")" = t ]; }
wait_until 60 "300 ledger rows" ledger_rows
PMPID=$(head -1 "$WORK/primary/postmaster.pid")
stop_job KILL "$PROPOSER"
kill -9 "$PMPID" $(pgrep -P "$PMPID") 2>/dev/null || true # not jobs of ours: pg_ctl started them
wait "$LEDGER" 2>/dev/null || true
ACK1=$(awk '/number of transactions actually processed/ {split($NF,a,"/"); print a[1]}' "$WORK/ledger1.out")
say "primary killed -9 with ${ACK1:-0} ledger transactions acknowledged"

say "safekeeper sync: the quorum's end of WAL, committed"
SYNC_LSN=$("$BIN" sync --safekeepers "$(IFS=,; echo "${SKADDRS[*]}")" --tenant-id $TENANT --timeline-id $TIMELINE --timeout 60s 2>"$WORK/sync.log") \
  || { cat "$WORK/sync.log"; exit 1; }
say "synced at $SYNC_LSN; the standby (fed by safekeeper 1) replays to it, then is promoted"
standby_at() { [ "$(pg "$PGBIN/psql" -h 127.0.0.1 -p "$SPORT" -U postgres -XAtqc "select pg_last_wal_replay_lsn() >= '$SYNC_LSN'::pg_lsn")" = t ]; }
wait_until 120 "the standby's replay of $SYNC_LSN" standby_at
pg "$PGBIN/pg_ctl" -D "$WORK/standby" -w -t 60 promote >/dev/null
psql_s() { pg "$PGBIN/psql" -h 127.0.0.1 -p "$SPORT" -U postgres -d postgres -XAtq "$@"; }
promoted() { [ "$(psql_s -c "select pg_is_in_recovery()")" = f ]; }
wait_until 60 "the promotion" promoted
NEW_TLI=$(psql_s -c "select substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)::int")
psql_s -c "alter system set synchronous_standby_names = '$APP'" -c "select pg_reload_conf()" >/dev/null
say "standby promoted: PostgreSQL timeline $NEW_TLI; a proposer protects it on the same safekeepers"
"$BIN" propose --upstream "host=127.0.0.1 port=$SPORT user=postgres" \
  --safekeepers "$(IFS=,; echo "${SKADDRS[*]}")" --tenant-id $TENANT --timeline-id $TIMELINE >"$WORK/proposer2.log" 2>&1 &
PROPOSER=$!
PIDS+=($PROPOSER)
proposer2_sync() { [ "$(psql_s -c "select state||'/'||sync_state from pg_stat_replication where application_name='$APP'")" = streaming/sync ]; }
wait_until 90 "the proposer to stream as the new primary's synchronous standby" proposer2_sync
(cd "$WORK" && pg "$PGBIN/pgbench" -n -h 127.0.0.1 -p "$SPORT" -U postgres -c 4 -j 2 -T 3 -f "$WORK/ledger.sql" postgres >"$WORK/ledger2.out" 2>&1) \
  || { cat "$WORK/ledger2.out"; exit 1; }
ACK2=$(awk '/number of transactions actually processed/ {split($NF,a,"/"); print a[1]}' "$WORK/ledger2.out")
ROWS=$(psql_s -c "select count(*) from ledger")
# The point in time to restore to, and a row committed after it.
TARGET_TIME=$(psql_s -c "select now()")
psql_s -c "create table after_target(x int)" -c "insert into after_target values (1)" >/dev/null
FINAL_LSN=$(psql_s -c "select pg_current_wal_flush_lsn()")
TLIS=""
for a in "${SKADDRS[@]}"; do
  TLIS+=" $(pg "$PGBIN/psql" "host=${a%:*} port=${a#*:} user=postgres replication=true options='-c tenant_id=$TENANT -c timeline_id=$TIMELINE'" -XAtq -F' ' -c TIMELINE_STATUS | awk '{print $11}')"
done
BADDAY="none missing"
if [ "$ROWS" -lt $((${ACK1:-0} + ${ACK2:-0})) ] || [ "${ACK1:-0}" -eq 0 ] || [ "${ACK2:-0}" -eq 0 ]; then BADDAY="MISSING"; ALL_OK=0; fi
for t in $TLIS; do [ "$t" = "$NEW_TLI" ] || { BADDAY="$BADDAY; a safekeeper is on timeline $t"; ALL_OK=0; }; done
say "$((${ACK1:-0} + ${ACK2:-0})) ledger transactions acknowledged, $ROWS rows on the promoted primary: $BADDAY"

# backup_lsn is TIMELINE_STATUS's 22nd column.
archived() {
  local a b
  for a in "${SKADDRS[@]}"; do
    b=$(pg "$PGBIN/psql" "host=${a%:*} port=${a#*:} user=postgres replication=true options='-c tenant_id=$TENANT -c timeline_id=$TIMELINE'" -XAtq -F'|' -c TIMELINE_STATUS | awk -F'|' '{print $22}')
    [ "$(psql_s -c "select '$b'::pg_lsn >= '$FINAL_LSN'::pg_lsn")" = t ] && return 0
  done
  return 1
}
wait_until 120 "the archive to reach $FINAL_LSN" archived
say "the archive holds the WAL up to $FINAL_LSN (backup_lsn)"

say "stopping the proposer and safekeepers (SIGTERM), exporting WAL from each"
stop_job TERM "$PROPOSER"
for i in 1 2 3; do stop_job TERM "${PIDS[$((i-1))]}"; done
SEGSUM=""
for i in 1 2 3; do
  out="$WORK/export$i"
  "$BIN" wal export --data-dir "$WORK/sk$i" --tenant-id $TENANT --timeline-id $TIMELINE --output "$out" >/dev/null
  same=0 diff=0
  for f in "$out"/*; do
    n=$(basename "$f")
    case "$n" in *.partial) continue;; esac
    # The old primary's own segments, complete before its host was lost
    # (the one it was writing holds WAL it never acknowledged).
    if [ -f "$WORK/primary/pg_wal/$n" ] && [ "$n" \< "$LAST_OLD" ]; then
      if cmp -s "$f" "$WORK/primary/pg_wal/$n"; then same=$((same+1)); else diff=$((diff+1)); ALL_OK=0; fi
    fi
  done
  [ "$same" -gt 0 ] || ALL_OK=0
  SEGSUM+="    safekeeper $i (${SKADDRS[$((i-1))]}): $same complete segments identical to the primary's pg_wal, $diff different"$'\n'
done

# ---- Point-in-time restore from the archive alone. ----
say "removing every safekeeper's data and stopping the promoted primary: only the archive is left"
rm -rf "$WORK/sk1" "$WORK/sk2" "$WORK/sk3"
pg "$PGBIN/pg_ctl" -D "$WORK/standby" -m fast -w stop >/dev/null
# PostgreSQL runs restore_command as its own user: a copy of the binary it
# can run, and the archive readable by it (the safekeepers made it 0700).
cp "$BIN" "$WORK/safekeeper-restore"
chmod -R go+rX "$WORK/archive"
RPORT=$(free_port)
pg touch "$WORK/pitr/recovery.signal"
cat >> "$WORK/pitr/postgresql.conf" <<CONF
port = $RPORT
synchronous_standby_names = ''
restore_command = '$WORK/safekeeper-restore wal fetch --remote-storage file://$WORK/archive --tenant-id $TENANT --timeline-id $TIMELINE %f %p 2>>$WORK/restore-fetch.log'
recovery_target_time = '$TARGET_TIME'
recovery_target_timeline = 'latest'
recovery_target_action = 'promote'
CONF
say "restoring the base backup taken before the load, to $TARGET_TIME, from file://$WORK/archive"
pg "$PGBIN/pg_ctl" -D "$WORK/pitr" -l "$WORK/pitr.log" -w -t 300 start >/dev/null || { tail -20 "$WORK/pitr.log"; exit 1; }
psql_r() { pg "$PGBIN/psql" -h 127.0.0.1 -p "$RPORT" -U postgres -d postgres -XAtq "$@"; }
restored() { [ "$(psql_r -c "select pg_is_in_recovery()")" = f ]; }
wait_until 300 "the point-in-time restore to finish" restored
R_ROWS=$(psql_r -c "select count(*) from ledger")
R_RES=$(psql_r -c "$Q" | tr '\n' ' ')
R_AFTER=$(psql_r -c "select count(*) from pg_class where relname = 'after_target'")
R_SEGS=$(grep -c 'msg=fetched' "$WORK/restore-fetch.log" || true)
PITR="all acknowledged ledger transactions present, nothing after the target"
if [ "$R_ROWS" -lt $((${ACK1:-0} + ${ACK2:-0})) ]; then PITR="MISSING acknowledged ledger rows"; ALL_OK=0; fi
if [ "$R_AFTER" != 0 ]; then PITR="$PITR; WRONG: a table created after the target time is there"; ALL_OK=0; fi
[ "$R_RES" = "$P_RES" ] || { PITR="$PITR; pgbench tables DIFFER from the primary's"; ALL_OK=0; }
say "restored: $R_ROWS ledger rows, $R_SEGS files fetched from the archive: $PITR"
pg "$PGBIN/pg_ctl" -D "$WORK/pitr" -m fast -w stop >/dev/null

LAT=$(cat "$WORK"/pgbench_log* 2>/dev/null | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {if (NR) printf "p50 %.2f ms, p99 %.2f ms", a[int(NR*0.50)+ (NR*0.50>int(NR*0.50))]/1000, a[int(NR*0.99)+(NR*0.99>int(NR*0.99))]/1000}')

STANDBY="MATCH"
[ "$P_RES" = "$S_RES" ] || { STANDBY="DIFFER"; ALL_OK=0; }
cat <<REPORT

================ safekeeper demo report ================
transactions (pgbench -c $CLIENTS -T $SECONDS_RUN): $TXNS committed, ${FAILED:-0} failed, $TPS tps
commit latency (pgbench per-transaction log):    $LAT
WAL streamed through the proposer:               $WAL_BYTES bytes ($START_LSN .. $END_LSN)
WAL segments verified byte-identical:
${SEGSUM}standby fed only by safekeeper 1:                 $STANDBY
    primary: $P_RES
    standby: $S_RES
the bad day (kill -9 of primary and proposer under load, sync, promote, re-protect):
    ledger transactions acknowledged:            ${ACK1:-0} before the kill, ${ACK2:-0} on the promoted primary
    rows on the promoted primary:                $ROWS: $BADDAY
    sync at $SYNC_LSN; promoted standby on PostgreSQL timeline $NEW_TLI; safekeepers on timeline:$TLIS
point-in-time restore from the archive alone (every safekeeper's data removed, both primaries gone):
    base backup from before the load, recovery_target_time $TARGET_TIME
    files fetched from file://.../archive:       $R_SEGS
    ledger rows restored:                        $R_ROWS (${ACK1:-0} + ${ACK2:-0} acknowledged): $PITR
    pgbench tables:                              $R_RES
========================================================
REPORT
[ "$ALL_OK" = 1 ] || { echo "demo: verification FAILED" >&2; exit 1; }
echo "demo: all checks passed; cleaning up"
