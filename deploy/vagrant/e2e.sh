#!/usr/bin/env bash
# The two-VM end-to-end run (make vagrant-e2e; deploy/README.md). Run as root
# inside the VMs, from the synced folder /vagrant:
#
#   e2e.sh collector-start    (collector) build, attach tierlimit natively to
#                             the private-network NIC, start a UDP/514
#                             collector process and the per-window printer
#   e2e.sh flood              (sender) flood the collector with syslog
#   e2e.sh collector-report   (collector) print the per-window results, the
#                             collector's counters, then stop and detach
#
# Environment: COLLECTOR_IP, SENDER_IP (the Vagrantfile's), PACKETS (the
# flood), MAX (the policy's max per 1 s window).
set -euo pipefail

COLLECTOR_IP=${COLLECTOR_IP:-192.168.56.10}
SENDER_IP=${SENDER_IP:-192.168.56.11}
PACKETS=${PACKETS:-2000000}
MAX=${MAX:-20000}
SRC=${SRC:-/vagrant}
BIN=/usr/local/bin
export PATH=$PATH:/usr/local/go/bin
export GOFLAGS=${GOFLAGS:--buildvcs=false} # the synced folder has no .git

log() { echo "e2e: $*"; }

# iface_of IP: the interface that holds IP.
iface_of() {
	ip -o -4 addr show | awk -v ip="$1" '{ split($4, a, "/"); if (a[1] == ip) print $2 }'
}

build() {
	log "building tierlimit and tierlimit-bench from $SRC"
	(cd "$SRC" && go build -o "$BIN/tierlimit" ./cmd/tierlimit && go build -o "$BIN/tierlimit-bench" ./cmd/tierlimit-bench)
}

collector_start() {
	local ifc
	ifc=$(iface_of "$COLLECTOR_IP")
	[ -n "$ifc" ] || { echo "e2e: no interface has $COLLECTOR_IP" >&2; exit 1; }
	build
	collector_stop quiet
	mkdir -p /etc/tierlimit
	cat >/etc/tierlimit/e2e.yaml <<YAML
# make vagrant-e2e: the default tiers with a max the VM's flood saturates.
mode: enforce
window: 1s
max: $MAX
YAML
	tierlimit check --config /etc/tierlimit/e2e.yaml
	log "attaching tierlimit to $ifc in native mode"
	systemd-run --unit tierlimit-e2e --collect \
		"$BIN/tierlimit" run --iface "$ifc" --xdp-mode native --config /etc/tierlimit/e2e.yaml
	for _ in $(seq 50); do
		tierlimit status >/dev/null 2>&1 && break
		sleep 0.2
	done
	if ! tierlimit status; then
		journalctl -u tierlimit-e2e -o cat --no-pager | tail -20
		echo "e2e: tierlimit did not attach natively to $ifc; see deploy/README.md (virtio and native XDP)" >&2
		exit 1
	fi
	systemd-run --unit tierlimit-e2e-recv --collect \
		"$BIN/tierlimit-bench" receive -until-signal -addr "$COLLECTOR_IP:514"
	systemd-run --unit tierlimit-e2e-windows --collect \
		"$BIN/tierlimit-bench" windows -max "$MAX" -duration 10m
	log "collector ready on $COLLECTOR_IP:514 ($ifc)"
}

flood() {
	local ifc mac
	ifc=$(iface_of "$SENDER_IP")
	[ -n "$ifc" ] || { echo "e2e: no interface has $SENDER_IP" >&2; exit 1; }
	(cd "$SRC" && go build -o "$BIN/tierlimit-bench" ./cmd/tierlimit-bench)
	ping -c 2 -W 2 "$COLLECTOR_IP" >/dev/null
	mac=$(ip neigh show "$COLLECTOR_IP" dev "$ifc" | awk '{ for (i = 1; i < NF; i++) if ($i == "lladdr") print $(i+1) }')
	[ -n "$mac" ] || { echo "e2e: no MAC for $COLLECTOR_IP" >&2; exit 1; }
	tierlimit-bench trafgen-config -src-mac "$(cat "/sys/class/net/$ifc/address")" -dst-mac "$mac" \
		-src "$SENDER_IP" -dst "$COLLECTOR_IP" >/tmp/tierlimit-flood.cfg
	log "flooding $COLLECTOR_IP ($mac) from $ifc: $PACKETS syslog datagrams"
	# Bounded by -n; -t 0ns is trafgen's per-frame sendto path.
	trafgen --dev "$ifc" --conf /tmp/tierlimit-flood.cfg -n "$PACKETS" -P 1 -t 0ns \
		--no-sock-mem --notouch-irq
}

collector_report() {
	sleep 2 # let the last window close
	log "per-window results (offered = the window's count; model = tiers.Expected):"
	systemctl stop tierlimit-e2e-windows 2>/dev/null || true
	journalctl -u tierlimit-e2e-windows -o cat --no-pager | grep -v '^Started\|^Stopp' || true
	systemctl stop tierlimit-e2e-recv 2>/dev/null || true
	log "collector process (messages it received):"
	journalctl -u tierlimit-e2e-recv -o cat --no-pager | grep '^{' | tail -1 || true
	tierlimit status || true
	collector_stop
}

collector_stop() {
	local ifc
	ifc=$(iface_of "$COLLECTOR_IP")
	for u in tierlimit-e2e-windows tierlimit-e2e-recv tierlimit-e2e; do
		systemctl stop "$u" 2>/dev/null || true
	done
	if [ -n "$ifc" ] && command -v tierlimit >/dev/null; then
		tierlimit detach --iface "$ifc" >/dev/null 2>&1 || true
	fi
	[ "${1:-}" = quiet ] || log "stopped and detached"
}

case "${1:-}" in
collector-start) collector_start ;;
flood) flood ;;
collector-report) collector_report ;;
collector-stop) collector_stop ;;
*) sed -n '2,14p' "$0"; exit 2 ;;
esac
