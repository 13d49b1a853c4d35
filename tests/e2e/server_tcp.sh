#!/usr/bin/env bash
# A CUDA server (tests/workloads/cuda_server, fake GPU) keeps its clients across a dump and restore with
# CRIU's --tcp-established: two connections held open by this shell (not in the dumped tree), a request
# sent while the server is dumped (in flight: answered after the restore, as TCP retransmits it), and every
# answer after the restore equal to the one before. Prints the restore-to-first-answer time against the
# server's cold start to first answer.
source "$(dirname "$0")/lib.sh"
e2e_setup
command -v iptables >/dev/null || PATH=$PATH:/usr/sbin:/sbin
command -v iptables >/dev/null || fail "no iptables: CRIU's network lock needs it (scripts/install-deps.sh)"
SERVER=$BUILD_DIR/tests/workloads/cuda_server
[ -x "$SERVER" ] || fail "no $SERVER"
MB=${SERVER_TCP_MB:-64} # MiB of device memory
start_fake_gpu
# Descriptors this shell inherited (flock's lock file, from `flock LOCK ctest`) would be inherited by the
# server, and CRIU refuses to dump a file lock it holds: closed here (fds 3 and 4 are the clients', below).
exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
STATE=$T/server.state

# secs_since T0: seconds from the $EPOCHREALTIME T0 to now.
secs_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'; }

# pong_on_new_connection: a fresh connection is answered pong (the server is up and serving).
pong_on_new_connection() {
	(exec 5<>"/dev/tcp/127.0.0.1/$port" && echo ping >&5 && read -r -t 2 answer <&5 && [ "$answer" = pong ])
}

# state_is KEY VALUE: the server's state file says KEY=VALUE (it is rewritten after each verified pass).
state_is() { [ "$(state_value "$STATE" "$1")" = "$2" ]; }

# ask FD REQUEST: the one-line answer on connection FD, in $answer (10 s at most).
ask() {
	printf '%s\n' "$2" >&"$1" || fail "cannot send '$2' on fd $1"
	read -r -t 10 answer <&"$1" || fail "no answer to '$2' on fd $1 (read exit status $?)"
}

# 1. Cold start: process start to the first answer on a new connection.
t0=$EPOCHREALTIME
start_cuda server "$SERVER" --mb "$MB" --port "$port" --state "$STATE" --interval-ms 20
pid=$LAST_PID
wait_for "the server's first answer" 30 pong_on_new_connection
cold_s=$(secs_since "$t0")
expect_healthy "$STATE"

# 2. Two clients hold their connections (opened after the server started: it inherits neither).
exec 3<>"/dev/tcp/127.0.0.1/$port" 4<>"/dev/tcp/127.0.0.1/$port"
on_exit 'exec 3>&- 4>&-'
chunks=(0 7 $((MB / 2)) $((MB - 1)))
declare -A before
for c in "${chunks[@]}"; do
	ask 3 "chunk $c"
	[[ "$answer" =~ ^chunk\ $c\ gen\ 1\ hash\ [0-9a-f]{16}$ ]] || fail "answer to 'chunk $c': '$answer'"
	before[$c]=$answer
	ask 4 "chunk $c"
	[ "$answer" = "${before[$c]}" ] || fail "the two connections disagree on chunk $c: '${before[$c]}', '$answer'"
done
[ "${before[0]}" != "${before[7]}" ] || fail "chunks 0 and 7 have the same hash: '${before[0]}'"
ask 3 ping
[ "$answer" = pong ] || fail "ping answered '$answer'"
ask 4 "chunk $MB"
[[ "$answer" == error* ]] || fail "a chunk out of range answered '$answer'"
wait_for "the server to count 2 clients" 10 state_is clients 2

# 3. The dump: CRIU dumps the established connections and locks them (iptables) until the restore.
dump "$pid" "$T/img" --tcp-established 3>&- 4>&- || fail "criu dump --tcp-established failed"
wait_gone "$pid"
requests=$(state_value "$STATE" requests)
expect_summary "$T/dump.log" dump 1 "no dump summary"
expect_log "$T/dump.log" "Dumping TCP connection|TCP connection.*dump|tcp.*repair" "CRIU did not dump a TCP connection"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "errors in the dump log"

# 4. While the server is down (SERVER_TCP_DOWN_S, default 1 s), a request goes out on connection 3: no
# answer, and no reset (no EOF).
printf 'chunk 7\n' >&3 || fail "cannot send while the server is dumped"
rc=0
read -r -t "${SERVER_TCP_DOWN_S:-1}" answer <&3 || rc=$?
[ $rc -gt 128 ] || fail "connection 3 while the server is dumped: read exit status $rc ('${answer:-}'), expected a timeout"
# The lock holds the established connections only: a new one is refused (the listening socket is gone).
! (exec 5<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || fail "a new connection was accepted while the server is dumped"

# The client's retransmission timer (its backoff sets how soon after the restore the request gets through).
rto=$(ss -tinH state established "( sport = :$port or dport = :$port )" 2>/dev/null | grep -oE 'rto:[0-9.]+ backoff:[0-9]+' | head -n1 || true)
log "client socket before the restore: ${rto:-no rto/backoff from ss}"

# 5. The restore; the request in flight is answered as TCP retransmits it, then more on both connections.
t1=$EPOCHREALTIME
restore "$T/img" --tcp-established 3>&- 4>&- || fail "criu restore --tcp-established failed"
restore_s=$(secs_since "$t1")
t2=$EPOCHREALTIME
read -r -t 60 answer <&3 || fail "the request in flight was not answered within 60 s of the restore (read exit status $?)"
first_s=$(secs_since "$t1")
after_restore_s=$(secs_since "$t2")
[ "$answer" = "${before[7]}" ] || fail "the request in flight: '$answer', before the dump '${before[7]}'"
expect_summary "$T/restore.log" restore 1 "no restore summary"
[ -z "$(plugin_errors "$T/restore.log")" ] || fail "errors in the restore log"
alive "$pid" || fail "pid $pid not running after the restore"
for c in "${chunks[@]}"; do
	for fd in 3 4; do
		ask $fd "chunk $c"
		[ "$answer" = "${before[$c]}" ] || fail "chunk $c on fd $fd after the restore: '$answer', before '${before[$c]}'"
	done
done
ask 4 ping
[ "$answer" = pong ] || fail "ping after the restore answered '$answer'"
wait_for "a new connection's answer" 10 pong_on_new_connection
expect_healthy "$STATE"
wait_for "the server to count its 2 clients and a request more than before" 10 state_is clients 2
[ "$(state_value "$STATE" requests)" -gt "$requests" ] || fail "no request counted since the dump: $(cat "$STATE")"

log "cold start to first answer ${cold_s} s; restore ${restore_s} s; restore to first answer ${first_s} s" \
	"(${after_restore_s} s after criu restore returned; the request in flight, retransmitted by TCP)"
log PASS
