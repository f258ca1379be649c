#!/usr/bin/env bash
# The guests' side of the two-VM end-to-end run (make vagrant-e2e, driven by
# deploy/vagrant/vm-e2e.sh on the host; deploy/README.md). Run as root inside
# the VMs:
#
#   e2e.sh xdp-matrix         (collector) attach with --xdp-mode native and auto
#                             at 1 and 2 virtio queue pairs (ethtool -L), and
#                             with an MTU native XDP refuses; print what happened
#   e2e.sh unit-check         (collector) the shipped systemd unit, started by
#                             systemd as PID 1: active, pinned, healthy,
#                             restarted, stopped with the limiter left pinned
#   e2e.sh collector-start    (collector) rsyslog with imudp on COLLECTOR_IP:514,
#                             tierlimit run --xdp-mode $XDP_MODE on the private
#                             NIC, and the baseline of the per-window check
#   e2e.sh burst              (sender) one burst of BURST syslog datagrams (trafgen)
#   e2e.sh window-check SENT  (collector) check the window the burst made
#   e2e.sh collector-report   (collector) totals, tierlimit status, then detach
#   e2e.sh collector-stop     (collector) stop and detach, quietly
#   e2e.sh kernel-suite       (collector) the bpf package's tests on this kernel
#   e2e.sh deb-install        (collector) the previous release's .deb, enable --now
#   e2e.sh deb-op OP          (collector) restart, upgrade to today's .deb, or
#                             reinstall it (dpkg -r, then dpkg -i)
#   e2e.sh shed-check [-init] (collector) the last burst was shed
#   e2e.sh deb-purge          (collector) pins elsewhere, then apt-get purge
#
# Environment: COLLECTOR_IP, SENDER_IP (the Vagrantfile's), MAX and WINDOW
# (the policy: default tiers, max per window), BURST (datagrams per burst),
# XDP_MODE (native). The binaries are the host's (/usr/local/bin, local box)
# or are built here from /vagrant (public box, Go installed by provision.sh).
set -euo pipefail

COLLECTOR_IP=${COLLECTOR_IP:-192.168.56.10}
SENDER_IP=${SENDER_IP:-192.168.56.11}
MAX=${MAX:-500}
WINDOW=${WINDOW:-2s}
BURST=${BURST:-3000}
XDP_MODE=${XDP_MODE:-native}
SRC=${SRC:-/vagrant}
BIN=/usr/local/bin
CONFIG=/etc/tierlimit/e2e.yaml
RSYSLOG_OUT=/var/log/tierlimit-e2e.log
STATE=/run/tierlimit-e2e.state
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin
export GOFLAGS=${GOFLAGS:--buildvcs=false} # the synced folder has no .git

log() { echo "e2e: $*"; }
die() { echo "e2e: $*" >&2; exit 1; }

# iface_of IP: the interface that holds IP.
iface_of() {
	ip -o -4 addr show | awk -v ip="$1" '{ split($4, a, "/"); if (a[1] == ip) print $2 }'
}

# binaries: the host's static builds (provision.sh --prebuilt), else build
# from the synced tree (the public box's Go-in-guest path).
binaries() {
	if [ -x "$BIN/tierlimit" ] && [ -x "$BIN/tierlimit-bench" ]; then
		return
	fi
	log "building tierlimit and tierlimit-bench from $SRC"
	(cd "$SRC" && go build -o "$BIN/tierlimit" ./cmd/tierlimit && go build -o "$BIN/tierlimit-bench" ./cmd/tierlimit-bench)
}

write_policy() {
	mkdir -p /etc/tierlimit
	cat >"$CONFIG" <<-YAML
		# make vagrant-e2e: the default tiers with a max the sender's bursts exceed,
		# in the ordinal shape: window-check counts each tier's packets exactly.
		mode: enforce
		shape: ordinal
		window: $WINDOW
		max: $MAX
	YAML
	tierlimit check --config "$CONFIG" >/dev/null
}

# start_agent MODE IFACE: tierlimit run as a transient unit; waits for status.
start_agent() {
	systemctl stop tierlimit-e2e 2>/dev/null || true
	systemctl reset-failed tierlimit-e2e 2>/dev/null || true
	systemd-run --quiet --unit tierlimit-e2e --collect \
		"$BIN/tierlimit" run --iface "$2" --xdp-mode "$1" --config "$CONFIG"
	for _ in $(seq 100); do
		if tierlimit status >/dev/null 2>&1 && metrics_up; then
			return 0
		fi
		systemctl is-active --quiet tierlimit-e2e || break
		sleep 0.3
	done
	return 1
}

# metrics_up: the agent's metrics endpoint listens.
metrics_up() { ss -Hltn "sport = :9713" | grep -q .; }

agent_log() { journalctl -u tierlimit-e2e -o cat --no-pager 2>/dev/null | tail -"${1:-5}"; }

stop_agent() {
	systemctl stop tierlimit-e2e 2>/dev/null || true
	tierlimit detach --iface "$1" >/dev/null 2>&1 || true
}

# xdp_mode_of IFACE: the XDP mode the kernel reports on the link's line
# (xdp = native, xdpgeneric = generic), or none.
xdp_mode_of() {
	ip -o link show dev "$1" | awk '{
		for (i = 1; i <= NF; i++) {
			if ($i == "xdpgeneric") { print "generic"; exit }
			if ($i == "xdp" || $i == "xdpdrv") { print "native"; exit }
		}
		print "none"
	}'
}

# try_mode MODE IFACE LABEL: attach, report, detach.
try_mode() {
	local mode=$1 ifc=$2 label=$3 res why
	dmesg -C 2>/dev/null || true
	if start_agent "$mode" "$ifc"; then
		res="attached ($(xdp_mode_of "$ifc"))"
		why=$(agent_log 20 | grep -o 'native XDP refused.*' | head -1 || true)
	else
		res="refused"
		why=$(agent_log 20 | grep -iE 'error|refused' | tail -1 || true)
	fi
	local k
	k=$(dmesg 2>/dev/null | grep -iE 'virtio|xdp' | tail -1 | sed 's/^\[[^]]*\] //' || true)
	printf '%-16s %-7s %-22s %s%s\n' "$label" "$mode" "$res" "${why:+log: $why }" "${k:+kernel: $k}"
	stop_agent "$ifc"
}

xdp_matrix() {
	local ifc maxq q mtu
	ifc=$(iface_of "$COLLECTOR_IP")
	[ -n "$ifc" ] || die "no interface has $COLLECTOR_IP"
	binaries
	write_policy
	maxq=$(ethtool -l "$ifc" | awk '/^Pre-set maximums/ { p = 1 } p && /^Combined:/ { print $2; exit }')
	log "native XDP on virtio_net $ifc ($(nproc) vCPUs, $maxq queue pairs at most, kernel $(uname -r))"
	printf '%-16s %-7s %-22s %s\n' "case" "mode" "result" "why"
	for q in 2 1; do
		[ "$q" -le "$maxq" ] || { printf '%-16s %-7s %-22s\n' "$q queue pairs" "-" "skipped (device has $maxq)"; continue; }
		ethtool -L "$ifc" combined "$q"
		# virtio_net gives XDP_TX a queue per CPU when q + CPUs fit the
		# device's maximum; else (Linux >= 5.17) it shares them under a lock.
		if [ $((q + $(nproc))) -le "$maxq" ]; then
			log "$q queue pair(s): $q + $(nproc) CPUs <= $maxq, XDP_TX gets its own queues"
		else
			log "$q queue pair(s): $q + $(nproc) CPUs > $maxq, XDP_TX shares queues under a lock (the kernel warns once)"
		fi
		for mode in native auto; do
			try_mode "$mode" "$ifc" "$q queue pair(s)"
		done
	done
	ethtool -L "$ifc" combined "$maxq"
	# virtio_net refuses native XDP above an MTU that fits one page.
	mtu=$(cat "/sys/class/net/$ifc/mtu")
	if ip link set dev "$ifc" mtu 9000 2>/dev/null; then
		for mode in native auto; do
			try_mode "$mode" "$ifc" "mtu 9000"
		done
		ip link set dev "$ifc" mtu "$mtu"
	fi
}

# healthz: GET /healthz on the default metrics address (bash's /dev/tcp;
# the box has no curl); prints the status line.
healthz() {
	exec 3<>/dev/tcp/127.0.0.1/9713 || return 1
	printf 'GET /healthz HTTP/1.0\r\n\r\n' >&3
	head -1 <&3 | tr -d '\r'
	exec 3<&-
}

# unit_up: the unit is active, the limiter pinned (under PIN) and /healthz
# 200; status is read with $TL, the binary under test.
unit_up() {
	for _ in $(seq 100); do
		if systemctl is-active --quiet tierlimit && "${TL:-tierlimit}" status --pin-path "${PIN:-/sys/fs/bpf/tierlimit}" >/dev/null 2>&1 &&
			[[ "$(healthz 2>/dev/null)" == *" 200 "* ]]; then
			return 0
		fi
		systemctl is-failed --quiet tierlimit && break
		sleep 0.3
	done
	systemctl status tierlimit --no-pager -l | tail -20 || true
	journalctl -u tierlimit -o cat --no-pager | tail -20 || true
	return 1
}

# unit_check runs deploy/systemd/tierlimit.service as shipped, started by
# systemd as PID 1 (issue 24 part 2): only the interface and the policy are
# set, in /etc/default/tierlimit as an operator would.
unit_check() {
	local ifc probe=/sys/fs/bpf/tierlimit-e2e-probe
	ifc=$(iface_of "$COLLECTOR_IP")
	[ -n "$ifc" ] || die "no interface has $COLLECTOR_IP"
	binaries
	write_policy
	stop_agent "$ifc"
	# What the unit avoids: systemd keeps the bpffs read-only under
	# ProtectKernelTunables=yes, whatever ReadWritePaths= says.
	if systemd-run --quiet --wait --collect -p PrivateMounts=yes -p ProtectKernelTunables=yes \
		-p ReadWritePaths=/sys/fs/bpf /bin/mkdir "$probe" 2>/dev/null; then
		log "systemd $(systemctl --version | awk 'NR == 1 { print $2 }'): ProtectKernelTunables=yes with ReadWritePaths=/sys/fs/bpf leaves the bpffs writable"
		rmdir "$probe"
	else
		log "systemd $(systemctl --version | awk 'NR == 1 { print $2 }'): ProtectKernelTunables=yes with ReadWritePaths=/sys/fs/bpf leaves the bpffs read-only (the shipped unit does not set it)"
	fi
	local linked=0
	[ -e /usr/bin/tierlimit ] || { ln -s "$BIN/tierlimit" /usr/bin/tierlimit; linked=1; }
	install -m 0644 "$SRC/deploy/systemd/tierlimit.service" /etc/systemd/system/tierlimit.service
	printf 'TIERLIMIT_IFACES="%s"\nTIERLIMIT_CONFIG="%s"\nTIERLIMIT_OPTS=""\n' "$ifc" "$CONFIG" >/etc/default/tierlimit
	systemctl daemon-reload
	log "systemctl start tierlimit (the shipped unit) on $ifc"
	systemctl start tierlimit || true # unit_up says why
	unit_up || die "the shipped unit did not start, pin and report healthy"
	log "active, pinned, /healthz $(healthz); $ifc runs XDP in $(xdp_mode_of "$ifc") mode"
	systemctl restart tierlimit || true
	unit_up || die "the shipped unit did not come back after systemctl restart"
	log "restarted: active, pinned, healthy"
	systemctl stop tierlimit
	[ "$(xdp_mode_of "$ifc")" != none ] || die "the limiter left $ifc when the unit stopped; it is pinned to stay"
	tierlimit status >/dev/null || die "tierlimit status reads no pinned state after the unit stopped"
	log "stopped: the limiter stays attached and pinned"
	tierlimit detach --iface "$ifc" >/dev/null
	rm -f /etc/systemd/system/tierlimit.service /etc/default/tierlimit
	[ "$linked" = 0 ] || rm -f /usr/bin/tierlimit
	systemctl daemon-reload
	systemctl reset-failed tierlimit 2>/dev/null || true
}

# ---- kernel-suite: the bpf package's tests on this kernel -------------------

# kernel_suite runs the bpf package's test binary, built on the host (go
# test -c), on this kernel: the verifier's budget and the test_run and
# model tests (issue 25 part 4), and a collector behind IPVS
# (TestIPVSCollector), which must find IPVS here: Debian's kernel has
# ip_vs and dummy as modules, where CI's host kernel has neither. BPF_RUN
# and BPF_SKIP are -test.run and -test.skip.
kernel_suite() {
	local bin=$SRC/.vagrant-bin/bpf.test out=/run/tierlimit-bpf-suite.log rc=0
	[ -x "$bin" ] || die "$bin missing (vm-e2e.sh builds it)"
	log "bpf tests on Linux $(uname -r): -test.run '${BPF_RUN:-.}' -test.skip '${BPF_SKIP:-}'"
	# The tests read testdata/ beside the package's sources.
	(cd "$SRC/bpf" && TIERLIMIT_REQUIRE_BPF=1 TIERLIMIT_REQUIRE_IPVS=1 timeout 900 "$bin" -test.v -test.count=1 -test.timeout=14m \
		-test.run "${BPF_RUN:-.}" -test.skip "${BPF_SKIP:-^$}") >"$out" 2>&1 || rc=$?
	grep -a -E '^(--- (FAIL|SKIP)|PASS$|FAIL$|panic)' "$out" || true
	grep -a -E 'verifier processed|deepest chain' "$out" | head -8 || true
	log "$(grep -c '^--- PASS' "$out") passed, $(grep -c '^--- FAIL' "$out") failed, $(grep -c '^--- SKIP' "$out") skipped; slowest: $(grep -E '^--- PASS' "$out" | sed 's/.*: \(\S*\) (\(.*\)s)/\2 \1/' | sort -rn | head -3 | awk '{ printf "%s %ss, ", $2, $1 }')"
	if [ "$rc" -ne 0 ]; then
		# What the failed tests printed (cat -v: a verifier log may hold
		# bytes that are not text).
		awk '/^=== RUN/ { name = $3; buf = "" } { buf = buf $0 "\n" } /^--- FAIL/ { printf "%s", buf }' "$out" |
			cat -v | cut -c1-400 | head -150
		die "the bpf tests failed on Linux $(uname -r) (exit $rc)"
	fi
}

rsyslog_udp() {
	cat >/etc/rsyslog.d/tierlimit-e2e.conf <<-EOF
		# make vagrant-e2e: the collector. One line per datagram on $COLLECTOR_IP:514.
		module(load="imudp")
		template(name="tierlimitE2E" type="string" string="%msg%\n")
		ruleset(name="tierlimitE2E") {
		  action(type="omfile" file="$RSYSLOG_OUT" template="tierlimitE2E")
		  stop
		}
		input(type="imudp" address="$COLLECTOR_IP" port="514" ruleset="tierlimitE2E" rcvbufSize="16m")
	EOF
	sysctl -qw net.core.rmem_max=33554432
	rm -f "$RSYSLOG_OUT"
	systemctl restart rsyslog
	for _ in $(seq 50); do
		ss -Hlun "sport = :514" | grep -q . && return 0
		sleep 0.2
	done
	die "rsyslog does not listen on $COLLECTOR_IP:514"
}

collector_start() {
	local ifc
	ifc=$(iface_of "$COLLECTOR_IP")
	[ -n "$ifc" ] || die "no interface has $COLLECTOR_IP"
	binaries
	stop_agent "$ifc"
	write_policy
	rsyslog_udp
	log "attaching tierlimit to $ifc (virtio_net, $(ethtool -l "$ifc" | awk '/^Combined:/ { c = $2 } END { print c }') queue pairs) with --xdp-mode $XDP_MODE"
	if ! start_agent "$XDP_MODE" "$ifc"; then
		agent_log 20
		die "tierlimit did not attach to $ifc in $XDP_MODE mode; see deploy/README.md (native XDP on virtio)"
	fi
	tierlimit status
	[ "$XDP_MODE" != native ] || [ "$(xdp_mode_of "$ifc")" = native ] || die "$ifc runs XDP in $(xdp_mode_of "$ifc") mode, not native"
	tierlimit-bench window-check -init -max "$MAX" -window "$WINDOW" -log "$RSYSLOG_OUT" -state "$STATE"
}

burst() {
	local ifc mac
	ifc=$(iface_of "$SENDER_IP")
	[ -n "$ifc" ] || die "no interface has $SENDER_IP"
	binaries
	if [ ! -s /run/tierlimit-flood.cfg ]; then
		ping -c 2 -W 2 "$COLLECTOR_IP" >/dev/null
		mac=$(ip neigh show "$COLLECTOR_IP" dev "$ifc" | awk '{ for (i = 1; i < NF; i++) if ($i == "lladdr") print $(i+1) }')
		[ -n "$mac" ] || die "no MAC for $COLLECTOR_IP"
		tierlimit-bench trafgen-config -src-mac "$(cat "/sys/class/net/$ifc/address")" -dst-mac "$mac" \
			-src "$SENDER_IP" -dst "$COLLECTOR_IP" >/run/tierlimit-flood.cfg
	fi
	# Bounded by -n; -t 0ns is trafgen's per-frame sendto path.
	trafgen --dev "$ifc" --conf /run/tierlimit-flood.cfg -n "$BURST" -P 1 -t 0ns \
		--no-sock-mem --notouch-irq -q >/dev/null 2>&1 || die "trafgen failed"
}

window_check() {
	tierlimit-bench window-check -max "$MAX" -window "$WINDOW" -log "$RSYSLOG_OUT" -state "$STATE" -sent "${1:-0}"
}

collector_report() {
	local rc=0
	tierlimit-bench window-check -total -max "$MAX" -window "$WINDOW" -log "$RSYSLOG_OUT" -state "$STATE" || rc=1
	log "udp: $(awk '/^Udp:/ && !h { h = 1; split($0, k); next } /^Udp:/ { for (i = 2; i <= NF; i++) printf "%s=%s ", k[i], $i }' /proc/net/snmp)"
	tierlimit status || rc=1
	collector_stop
	return $rc
}

collector_stop() {
	local ifc
	ifc=$(iface_of "$COLLECTOR_IP")
	systemctl stop tierlimit-e2e 2>/dev/null || true
	if [ -n "$ifc" ] && command -v tierlimit >/dev/null; then
		if tierlimit status >/dev/null 2>&1; then
			tierlimit detach --iface "$ifc"
		fi
		[ "$(xdp_mode_of "$ifc")" = none ] || die "$ifc still runs an XDP program after detach"
	fi
	log "stopped and detached"
}

# ---- deb-*: the .deb's life under systemd (issue 24 part 3) -----------------

DEBS=$SRC/.vagrant-bin/debs
TLPKG=/usr/bin/tierlimit
LINES=/run/tierlimit-e2e.lines

# deb_install installs the previous release's .deb, sets the syslog NIC and
# a policy the bursts exceed, enable --now; then window-check's baseline.
deb_install() {
	local ifc
	ifc=$(iface_of "$COLLECTOR_IP")
	[ -n "$ifc" ] || die "no interface has $COLLECTOR_IP"
	[ "$(xdp_mode_of "$ifc")" = none ] || die "$ifc runs an XDP program before the package is installed"
	rsyslog_udp
	dpkg -i "$DEBS/old.deb" >/dev/null
	# The package's conffiles, edited as an operator would. No shape key:
	# the old version knows none (ordinal, its only shape); today's reads
	# the same file as smooth.
	cat >/etc/tierlimit/policy.yaml <<-YAML
		mode: enforce
		window: $WINDOW
		max: $MAX
	YAML
	sed -i "s/^TIERLIMIT_IFACES=.*/TIERLIMIT_IFACES=\"$ifc\"/" /etc/default/tierlimit
	# That release's unit sets ProtectKernelTunables=yes, which leaves the
	# bpffs read-only here (issue 24 part 2): as shipped it cannot pin.
	# Its operators' fix, a drop-in, until the upgrade removes the need.
	systemctl start tierlimit || true
	for _ in $(seq 20); do
		journalctl -u tierlimit -o cat --no-pager | grep -q -i 'read-only file system' && break
		sleep 0.5
	done
	log "the previous release's unit as shipped: $(journalctl -u tierlimit -o cat --no-pager | grep -i -m1 -o '[^"]*read-only file system[^"]*' || echo "no read-only bpffs error logged (it was predicted)")"
	systemctl stop tierlimit
	systemctl reset-failed tierlimit 2>/dev/null || true
	$TLPKG detach --iface "$ifc" >/dev/null 2>&1 || true
	mkdir -p /etc/systemd/system/tierlimit.service.d
	printf '[Service]\nProtectKernelTunables=no\n' >/etc/systemd/system/tierlimit.service.d/old-release.conf
	systemctl daemon-reload
	systemctl enable --now tierlimit 2>/dev/null
	TL=$TLPKG unit_up || die "the previous release's unit (with ProtectKernelTunables=no) did not start, pin and report healthy"
	log "installed $(dpkg-query -W -f '${Version}' tierlimit) ($($TLPKG version | awk '$1 == "commit" { print substr($2, 1, 12) }')), enable --now: active, pinned, /healthz 200, $ifc in $(xdp_mode_of "$ifc") mode"
	tierlimit-bench window-check -init -max "$MAX" -window "$WINDOW" -log "$RSYSLOG_OUT" -state "$STATE"
}

# deb_op restart|upgrade|reinstall, while the host floods: systemctl
# restart, dpkg -i today's .deb, or dpkg -r then dpkg -i; then the unit
# must be active, pinned and healthy.
deb_op() {
	local t0=$SECONDS
	case "$1" in
	restart) systemctl restart tierlimit ;;
	upgrade)
		# Today's unit needs no drop-in: the postinst's daemon-reload
		# and try-restart run it as shipped.
		rm -rf /etc/systemd/system/tierlimit.service.d
		dpkg -i --force-confdef --force-confold "$DEBS/new.deb" >/dev/null
		;;
	reinstall)
		# dpkg -r keeps the conffiles, so the next install's postinst
		# gets the old version as if upgrading; the service, stopped
		# by the prerm, must start again (issue 35 B61).
		dpkg -r tierlimit >/dev/null
		! systemctl --quiet is-active tierlimit || die "the service runs after dpkg -r"
		dpkg -i --force-confdef --force-confold "$DEBS/new.deb" >/dev/null
		;;
	*) die "deb-op: restart, upgrade or reinstall" ;;
	esac
	TL=$TLPKG unit_up || die "after $1 the unit is not active, pinned and healthy"
	log "$1: active, pinned, /healthz 200 after $((SECONDS - t0))s; $(dpkg-query -W -f '${Version}' tierlimit), commit $($TLPKG version | awk '$1 == "commit" { print substr($2, 1, 12) }')"
	if [ "$1" = upgrade ]; then
		journalctl -u tierlimit -o cat --no-pager | grep -m1 'migrated pinned state' ||
			die "the upgraded agent logged no migration of the pinned state"
	fi
}

# shed_check [-init]: the burst just sent was shed, by whichever program
# ran: rsyslog's new lines (settled) are more than none and at most MAX.
# The model passes at most 439 of any burst under the default tiers at MAX
# 500 (+5σ: 468; smooth's first window at most 1.1 × that: 483), while a
# burst that met no limiter passes what XDP saw: at least half of it (the
# emulated NIC's ring loses the rest), 1500.
shed_check() {
	local lines last=-1 same=0 prev ifc
	prev=$(cat "$LINES" 2>/dev/null || echo 0)
	# The burst's first lines, then counts unchanged for 1.5 s.
	if [ "${1:-}" != -init ]; then
		for _ in $(seq 60); do
			[ "$(wc -l <"$RSYSLOG_OUT" 2>/dev/null || echo 0)" = "$prev" ] || break
			sleep 0.5
		done
	fi
	for _ in $(seq 120); do
		lines=$(wc -l <"$RSYSLOG_OUT" 2>/dev/null || echo 0)
		if [ "$lines" = "$last" ]; then
			same=$((same + 1))
			[ "$same" -lt 3 ] || break
		else
			same=0 last=$lines
		fi
		sleep 0.5
	done
	echo "$lines" >"$LINES"
	[ "${1:-}" != -init ] || return 0
	ifc=$(iface_of "$COLLECTOR_IP")
	log "burst: rsyslog got $((lines - prev)) of $BURST; $ifc in $(xdp_mode_of "$ifc") mode, unit $(systemctl is-active tierlimit)"
	[ $((lines - prev)) -gt 0 ] || die "no datagram of the burst reached rsyslog"
	[ $((lines - prev)) -le "$MAX" ] || die "the burst's window passed $((lines - prev)) > max $MAX: not shed"
}

# ifaces_with_xdp: every interface that runs an XDP program, with its mode.
ifaces_with_xdp() {
	local i m
	for i in $(ls /sys/class/net); do
		m=$(xdp_mode_of "$i")
		[ "$m" = none ] || printf '%s(%s) ' "$i" "$m"
	done
}

# deb_purge: the limiter pinned under another --pin-path (TIERLIMIT_OPTS),
# a second one on a veth under a pin path nobody recorded, then
# TIERLIMIT_IFACES and TIERLIMIT_OPTS changed with no restart; apt-get
# purge must leave no XDP program on any interface and no pinned state.
deb_purge() {
	local ifc other=/sys/fs/bpf/tle2eother hand=/sys/fs/bpf/tle2ehand out
	ifc=$(iface_of "$COLLECTOR_IP")
	systemctl stop tierlimit
	$TLPKG detach --iface "$ifc" >/dev/null
	sed -i "s|^TIERLIMIT_OPTS=.*|TIERLIMIT_OPTS=\"--pin-path $other\"|" /etc/default/tierlimit
	systemctl start tierlimit || true
	TL=$TLPKG PIN=$other unit_up || die "the unit did not start with --pin-path $other"
	ip link add tlp0 type veth peer name tlp1
	ip link set tlp0 up && ip link set tlp1 up
	systemd-run --quiet --unit tierlimit-hand --collect $TLPKG run --iface tlp0 --xdp-mode native \
		--pin-path "$hand" --metrics-addr 127.0.0.1:9714 --config /etc/tierlimit/policy.yaml
	for _ in $(seq 100); do
		$TLPKG status --pin-path "$hand" >/dev/null 2>&1 && break
		sleep 0.3
	done
	[ "$(xdp_mode_of tlp0)" != none ] || { journalctl -u tierlimit-hand -o cat --no-pager | tail -5; die "the agent run by hand did not attach to tlp0"; }
	systemctl stop tierlimit-hand
	# As if it had run before pin paths were recorded.
	rm -f "/run/tierlimit/$(echo "${hand#/}" | tr / _).lock"
	sed -i 's/^TIERLIMIT_IFACES=.*/TIERLIMIT_IFACES="tlp9"/; s/^TIERLIMIT_OPTS=.*/TIERLIMIT_OPTS=""/' /etc/default/tierlimit
	log "before purge: XDP on $(ifaces_with_xdp); pinned: $(ls -d /sys/fs/bpf/*/ | tr '\n' ' ')"
	out=$(DEBIAN_FRONTEND=noninteractive apt-get purge -y -q tierlimit 2>&1) || { echo "$out"; die "apt-get purge failed"; }
	echo "$out" | grep -E 'detached|removed pinned|nothing to detach|tierlimit:' || true
	local left
	left=$(ifaces_with_xdp)
	[ -z "$left" ] || die "after purge XDP programs remain: $left"
	[ ! -e "$other" ] && [ ! -e /sys/fs/bpf/tierlimit ] || die "after purge pinned state remains: $(ls -d /sys/fs/bpf/*/ | tr '\n' ' ')"
	! dpkg-query -W tierlimit >/dev/null 2>&1 || [ "$(dpkg-query -W -f '${db:Status-Status}' tierlimit)" = not-installed ] ||
		die "tierlimit is still installed: $(dpkg-query -W -f '${db:Status-Abbrev}' tierlimit)"
	log "purged: no XDP program on any interface, no pinned state at the default path or $other; $hand (unrecorded) keeps only its detached link's pin"
	rm -rf "$hand"
	ip link del tlp0
}

case "${1:-}" in
kernel-suite) kernel_suite ;;
deb-install) deb_install ;;
deb-op) deb_op "${2:-}" ;;
shed-check) shed_check "${2:-}" ;;
deb-purge) deb_purge ;;
xdp-matrix) xdp_matrix ;;
unit-check) unit_check ;;
collector-start) collector_start ;;
burst) burst ;;
window-check) window_check "${2:-0}" ;;
collector-report) collector_report ;;
collector-stop) collector_stop >/dev/null ;;
*) sed -n '2,26p' "$0"; exit 2 ;;
esac
