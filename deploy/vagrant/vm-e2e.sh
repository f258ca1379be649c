#!/usr/bin/env bash
# make vagrant-e2e: boot the two Vagrant VMs (collector, sender) with
# vagrant-libvirt, flood the collector from the sender in bursts of one
# policy window each, check every window against tiers.Expected, test native
# XDP on virtio_net, and tear everything down. Run as root on the host.
#
# The sandbox (SANDBOX=1, the default): everything the VMs use lives in a
# network namespace this script creates (tlvm-PID) and in a private mount
# namespace: its own libvirtd and virtlogd, started by hand (no systemd
# needed), with libvirt's config, state and images in a temporary directory
# bound over /etc/libvirt, /var/lib/libvirt, /run/libvirt, /var/log/libvirt
# and /var/cache/libvirt. The management and private networks are isolated
# libvirt networks (no NAT, no uplink): their bridges, the taps, dnsmasq and
# every VM address exist only in the namespace, and the host's root namespace
# gets no address on them. The flood goes from the sender VM to the collector
# VM only. On exit, also on failure or a signal, the VMs are destroyed, every
# process left in the namespace is killed (by its PID, from ip netns pids),
# the namespace is deleted and the temporary directory removed.
#
# SANDBOX=0 runs vagrant against the host's own libvirt instead (a KVM user's
# machine, BOX=public: the guests need the internet to provision).
#
# Environment (make variables of the same name):
#   BOX      local (default; make vagrant-box builds it) or public
#   MAX      the policy's max per window (500), default tiers
#   WINDOW   the policy's window (2s); one burst per window
#   WINDOWS  bursts, hence windows, checked (4)
#   BURST    datagrams per burst (6 × MAX): above max even when the
#            collector's emulated CPU loses half of them before XDP
#   QUEUES   the collector's private NIC's virtio queue pairs (2)
#   UNIT_CHECK  1 (default): the shipped unit under systemd; 0 skips it
#   KERNEL_SUITE  1 (default): the bpf package's tests on the collector's
#            kernel (BPF_RUN, BPF_SKIP: -test.run, -test.skip); 0 skips them
#   DEB_LIFE 1 (default): the .deb's life (OLD_COMMIT's .deb, 90e44a6,
#            cached in DEB_CACHE; today's); 0 skips it
#   E2E_TIMEOUT  the VMs' part, in seconds (2400); BOX_TIMEOUT the box build (1800)
#   PAUSE_ON_FAIL  seconds to keep the VMs up after a failure, to look (0)
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
BOX=${BOX:-local}
SANDBOX=${SANDBOX:-1}
MAX=${MAX:-500}
WINDOW=${WINDOW:-2s}
WINDOWS=${WINDOWS:-4}
BURST=${BURST:-$((6 * MAX))}
QUEUES=${QUEUES:-2}
E2E_TIMEOUT=${E2E_TIMEOUT:-2400}
# The previous release (the last one landed before the pinned layout was
# versioned: layout 0), whose .deb deb-life upgrades from.
OLD_COMMIT=${OLD_COMMIT:-90e44a685f8a6b120aab3d04785d83917945eaa0}
DEB_CACHE=${DEB_CACHE:-/var/cache/tierlimit/vagrant-debs}
DEB_LIFE=${DEB_LIFE:-1}
KERNEL_SUITE=${KERNEL_SUITE:-1}
# The bpf tests that run on the collector's kernel (issue 25 part 4): the
# verifier's budget and the deepest chain of stack frames (issue 42; not
# TestHotPathCalls nor TestJudgeFallback, whose counting build costs the
# verifier 340k on 6.18 and passes 6.1's limit of 1M: TestJudgeFallback
# failed there on 2026-12-03; TestVerifierComplexity loads both programs,
# the tail call's included), the kernel probes and the layout, the test_run verdict tables,
# the reference-model tests of both shapes, the kernel as the oracle,
# and a collector reached through IPVS (part 1); about 3 minutes under
# TCG. BPF_RUN=. runs them all but BPF_SKIP's
# (the long differential and traffic ones): about 11 minutes. Not
# TestWindowEdge: its gate case judges the tick gate against the clock to
# the millisecond, and a TCG guest's jiffies lag (one run of three: a packet
# at +50.67 ms of a 50 ms window was judged in it). Nor TestSmoothProgram:
# it paces 3,000 packets a window in real time and judges each tenth of a
# window, and after the oracle's 3 minutes of TCG its pacing missed (one
# full run of two failed on 2026-12-02; alone it passed); the host runs it
# in make test, and the smooth shape's test_run tests run here.
BPF_RUN=${BPF_RUN:-'^(TestVerifierComplexity|TestVerifierBudgetFor|TestStackDepth|TestContract|TestLayoutGolden|TestKernel.*|TestLoadRefusesMissingFeature|TestVerdictTable|TestTruncated|TestFragmentsFollowFirst|TestAddressFamilies|TestTierAccuracy|TestWindow|TestModes|TestSaturationBoundary|TestSeverityParse|TestSourcesDifferential|TestSharingSmooth|TestIPVSCollector)$'}
BPF_SKIP=${BPF_SKIP:-'^(TestDifferential|TestSeverityDifferential|TestApplySwapsUnderTraffic|TestSeverityDeterministic)$'}
VAGRANT=${VAGRANT:-vagrant}
GO=${GO:-go}
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin

T0=$(date +%s)
log() { printf 'vagrant-e2e: %s +%ss %s\n' "$(date -u +%H:%M:%S)" "$(($(date +%s) - T0))" "$*"; }
die() { echo "vagrant-e2e: $*" >&2; exit 1; }

preflight() {
	[ "$(id -u)" -eq 0 ] || die "run as root: the sandbox needs network and mount namespaces"
	local t
	for t in "$VAGRANT" ip unshare timeout ssh rsync "$GO"; do
		command -v "$t" >/dev/null || die "$t not found (apt-get install vagrant vagrant-libvirt libvirt-daemon-system qemu-system-x86 qemu-utils debootstrap dnsmasq-base rsync)"
	done
	if [ "$SANDBOX" = 1 ]; then
		for t in libvirtd virtlogd virsh qemu-system-x86_64 dnsmasq; do
			command -v "$t" >/dev/null || die "$t not found (apt-get install libvirt-daemon-system qemu-system-x86 dnsmasq-base)"
		done
	fi
	"$VAGRANT" plugin list 2>/dev/null | grep -q vagrant-libvirt || die "the vagrant-libvirt plugin is missing (apt-get install vagrant-libvirt)"
	case "$BOX" in local | public) ;; *) die "BOX=$BOX: want local or public" ;; esac
	[ "$BOX" = local ] || [ "$SANDBOX" = 0 ] || die "BOX=public needs SANDBOX=0: its guests download packages and Go, and the sandbox has no uplink"
	[ "$BURST" -gt "$MAX" ] || die "BURST=$BURST must exceed MAX=$MAX"
}

# build: static binaries for the guests (the local box has no Go), the bpf
# package's test binary (kernel-suite), and the two .debs of deb-life.
build() {
	log "building static tierlimit and tierlimit-bench into .vagrant-bin/"
	mkdir -p .vagrant-bin
	CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$GO" build -o .vagrant-bin/ ./cmd/tierlimit ./cmd/tierlimit-bench
	log "building the bpf package's tests (go test -c) for the collector's kernel"
	CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$GO" test -c -o .vagrant-bin/bpf.test ./bpf
	build_debs
}

# build_debs: today's .deb (make release, amd64 only) and the previous
# release's, OLD_COMMIT's, built with that commit's own make release from a
# git archive of it; cached by commit in DEB_CACHE. A shallow clone that
# lacks the commit fetches it from origin first.
build_debs() {
	local old=$DEB_CACHE/$OLD_COMMIT tmp
	rm -rf .vagrant-bin/debs && mkdir -p .vagrant-bin/debs
	if ! ls "$old"/tierlimit_*_amd64.deb >/dev/null 2>&1; then
		if ! git cat-file -e "$OLD_COMMIT^{commit}" 2>/dev/null; then
			log "fetching $OLD_COMMIT (a shallow clone?)"
			git fetch --quiet origin "$OLD_COMMIT" || die "commit $OLD_COMMIT (the previous release) is not in this clone and origin did not give it: fetch it (git fetch --unshallow)"
		fi
		log "building the previous release's .deb from $OLD_COMMIT (its make release), cached in $old"
		tmp=$(mktemp -d /var/tmp/tierlimit-old.XXXXXX)
		git archive "$OLD_COMMIT" | tar -x -C "$tmp"
		# Its OCI step is built too (that commit's make release does both).
		if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$tmp" release GO="$GO" RELEASE_ARCHES=amd64 DIST="$tmp/dist" \
			VERSION="0.0.0-build.${OLD_COMMIT:0:7}" COMMIT="$(git rev-parse "$OLD_COMMIT")" >"$tmp/build.log" 2>&1; then
			tail -20 "$tmp/build.log"
			rm -rf "$tmp"
			die "make release of $OLD_COMMIT failed"
		fi
		mkdir -p "$old"
		cp "$tmp"/dist/tierlimit_*_amd64.deb "$old/"
		rm -rf "$tmp"
	fi
	cp "$old"/tierlimit_*_amd64.deb .vagrant-bin/debs/old.deb
	log "building today's .deb (make release RELEASE_ARCHES=amd64)"
	tmp=$(mktemp -d /var/tmp/tierlimit-new.XXXXXX)
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory release GO="$GO" RELEASE_ARCHES=amd64 DIST="$tmp" >"$tmp.log" 2>&1 || { tail -20 "$tmp.log"; die "make release failed"; }
	cp "$tmp"/tierlimit_*_amd64.deb .vagrant-bin/debs/new.deb
	rm -rf "$tmp" "$tmp.log"
}

# ---- the outer side: namespace, time bound, cleanup -------------------------

NS=tlvm-$$
STATE=

# netns_clear kills every process in namespace $1 (TERM for 5 s, then
# KILL) and deletes it.
netns_clear() {
	local pids i
	for i in 1 2 3 4 5 6 7 8 9 10; do
		pids=$(ip netns pids "$1" 2>/dev/null || true)
		[ -n "$pids" ] || break
		if [ "$i" -le 5 ]; then
			kill -TERM $pids 2>/dev/null || true
		else
			kill -KILL $pids 2>/dev/null || true
		fi
		sleep 1
	done
	ip netns del "$1" 2>/dev/null || true
}

# runs_vm_e2e: whether PID $1 is a running vm-e2e.sh.
runs_vm_e2e() {
	[ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q 'vm-e2e'
}

outer_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$NS" ] && ip netns list | grep -qw "^$NS"; then
		# Whatever the inner side left (libvirtd, virtlogd, qemu, dnsmasq,
		# vagrant): all of them are in the namespace, and only they are.
		netns_clear "$NS"
	fi
	if [ -n "$STATE" ] && [ -d "$STATE" ]; then
		if [ "${KEEP_STATE:-0}" = 1 ]; then
			log "keeping $STATE (KEEP_STATE=1)"
		else
			rm -rf "$STATE"
		fi
	fi
	if [ "$rc" -eq 0 ]; then
		log "passed; VMs, namespace $NS and libvirt state removed"
	else
		log "FAILED (exit $rc); VMs, namespace $NS and libvirt state removed"
	fi
	exit "$rc"
}

# reap_stale removes what an earlier run left when it was killed with
# SIGKILL, so that its EXIT trap never ran: a namespace tlvm-PID and a state
# directory /var/tmp/tierlimit-vm.PID.* whose PID no longer runs this script.
# Whatever still runs in such a namespace (qemu, libvirtd) is killed first
# (netns_clear).
reap_stale() {
	local ns pid d
	for ns in $(ip netns list | awk '$1 ~ /^tlvm-[0-9]+$/ {print $1}'); do
		pid=${ns#tlvm-}
		runs_vm_e2e "$pid" && continue
		netns_clear "$ns"
		log "removed namespace $ns, left by a killed run (PID $pid no longer runs vm-e2e.sh)"
	done
	for d in /var/tmp/tierlimit-vm.*; do
		[ -d "$d" ] || continue
		pid=${d#/var/tmp/tierlimit-vm.}
		pid=${pid%%.*}
		case $pid in '' | *[!0-9]*) continue ;; esac
		runs_vm_e2e "$pid" && continue
		rm -rf "$d"
		log "removed $d, left by a killed run"
	done
}

outer() {
	preflight
	reap_stale
	build
	if [ "$BOX" = local ]; then
		log "make vagrant-box (cached)"
		VAGRANT="$VAGRANT" timeout --kill-after=30 "${BOX_TIMEOUT:-1800}" bash deploy/vagrant/build-box.sh
	fi
	if [ "$SANDBOX" = 0 ]; then
		STATE=$(mktemp -d "/var/tmp/tierlimit-vm.$$.XXXXXX")
		NS=
		trap outer_cleanup EXIT
		trap 'exit 130' INT TERM
		timeout --signal=TERM --kill-after=60 "$E2E_TIMEOUT" "$0" __run "$STATE"
		return
	fi
	STATE=$(mktemp -d "/var/tmp/tierlimit-vm.$$.XXXXXX")
	trap outer_cleanup EXIT
	trap 'exit 130' INT TERM
	ip netns add "$NS"
	log "sandbox: network namespace $NS, libvirt state in $STATE"
	timeout --signal=TERM --kill-after=60 "$E2E_TIMEOUT" \
		ip netns exec "$NS" unshare --mount --propagation private "$0" __sandbox "$STATE"
}

# ---- the inner side: in the namespace --------------------------------------

# sandbox_libvirt binds a private copy of libvirt's config and empty state
# directories over the system ones (this mount namespace only), then starts
# virtlogd and libvirtd.
sandbox_libvirt() {
	local s=$1
	ip link set lo up
	mkdir -p "$s/etc" "$s/lib/images" "$s/log" "$s/cache" "$s/run" "$s/console"
	cp -a /etc/libvirt/. "$s/etc/"
	# Not the host's networks, pools or domains: none of them autostart here.
	rm -rf "$s/etc/qemu/networks" "$s/etc/storage" "$s/etc/qemu/autostart"
	find "$s/etc/qemu" -maxdepth 1 -name '*.xml' -delete 2>/dev/null || true
	mkdir -p "$s/etc/qemu/networks/autostart"
	cat >>"$s/etc/qemu.conf" <<-'EOF'

		# tierlimit's vagrant-e2e sandbox: qemu runs as root and reads the box's
		# kernel from root's VAGRANT_HOME; no security driver to relabel files.
		user = "root"
		group = "root"
		dynamic_ownership = 0
		remember_owner = 0
		security_driver = "none"
	EOF
	mount --bind "$s/etc" /etc/libvirt
	mount --bind "$s/lib" /var/lib/libvirt
	mount --bind "$s/log" /var/log/libvirt
	mkdir -p /var/cache/libvirt && mount --bind "$s/cache" /var/cache/libvirt
	mkdir -p /run/libvirt && mount -t tmpfs -o mode=0755 tmpfs /run/libvirt
	virtlogd -d -p "$s/run/virtlogd.pid"
	libvirtd -d -p "$s/run/libvirtd.pid"
	for _ in $(seq 60); do
		virsh -c qemu:///system version >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "libvirtd did not start in the sandbox"
}

# guest ROLE CMD...: run e2e.sh in a guest as root.
guest() {
	local vm=$1
	shift
	# One string for the guest's shell, each word quoted (BPF_SKIP has | and ()).
	ssh -F "$STATE/ssh_config" -o LogLevel=ERROR "$vm" "$(printf '%q ' sudo env MAX="$MAX" WINDOW="$WINDOW" \
		BURST="$BURST" XDP_MODE=native BPF_RUN="$BPF_RUN" BPF_SKIP="$BPF_SKIP" /vagrant/deploy/vagrant/e2e.sh "$@")"
}

inner_cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ "$rc" -ne 0 ] && [ "${PAUSE_ON_FAIL:-0}" -gt 0 ]; then
		log "PAUSE_ON_FAIL: the VMs stay up for ${PAUSE_ON_FAIL}s: ip netns exec tlvm-PID ssh -F $STATE/ssh_config collector"
		sleep "$PAUSE_ON_FAIL"
	fi
	if [ "$rc" -ne 0 ]; then
		for f in "$STATE"/console/*.log; do
			[ -f "$f" ] || continue
			echo "--- the last lines of $(basename "$f" .log)'s console"
			tail -15 "$f" | tr -d '\r'
		done
	fi
	log "destroying the VMs"
	timeout 300 "$VAGRANT" destroy -f >/dev/null 2>&1 || log "vagrant destroy failed; the namespace's teardown kills what is left"
	if [ "$SANDBOX" = 1 ]; then
		for p in libvirtd virtlogd; do
			[ -f "$STATE/run/$p.pid" ] && kill "$(cat "$STATE/run/$p.pid")" 2>/dev/null || true
		done
	fi
	exit "$rc"
}

# kvm_boots: true when a guest runs under KVM here: the local box's kernel,
# booted by qemu with -accel kvm, prints its banner on the serial console
# within KVM_PROBE_SECONDS (TCG prints it in about 2 s; a working KVM at
# once). Without the local box's kernel it trusts the device.
KVM_PROBE_SECONDS=${KVM_PROBE_SECONDS:-20}
kvm_boots() {
	local k=${VAGRANT_HOME:-$HOME/.vagrant.d}/boxes/tierlimit-VAGRANTSLASH-bookworm-local/0/libvirt/vmlinuz
	[ -f "$k" ] || return 0
	local out
	out=$(mktemp)
	# The kernel panics without a root disk, and -no-reboot ends qemu then.
	timeout "$KVM_PROBE_SECONDS" qemu-system-x86_64 -accel kvm -m 256 -nographic -no-reboot \
		-kernel "$k" -append 'console=ttyS0 panic=-1' -serial stdio -monitor none -display none \
		</dev/null >"$out" 2>/dev/null || true
	local rc=0
	grep -a -q 'Linux version' "$out" || rc=1
	rm -f "$out"
	return "$rc"
}

run_vms() {
	STATE=$1
	export VAGRANT_DOTFILE_PATH="$STATE/dot" TIERLIMIT_BOX="$BOX" TIERLIMIT_QUEUES="$QUEUES"
	export VAGRANT_DEFAULT_PROVIDER=libvirt LIBVIRT_DEFAULT_URI=qemu:///system
	if [ "$SANDBOX" = 1 ]; then
		export TIERLIMIT_CONSOLE_DIR="$STATE/console" TIERLIMIT_MGMT_MODE=none
	fi
	trap inner_cleanup EXIT
	trap 'exit 143' INT TERM
	local driver=qemu
	# The Vagrantfile's test is a character device that opens read-write;
	# a /dev/kvm that opens but runs no guest (nested virtualisation the
	# host does not give: the guests then hang after the firmware, with
	# nothing on their consoles) fails kvm_boots, and the VMs run on TCG.
	if [ -n "${TIERLIMIT_LIBVIRT_DRIVER:-}" ]; then
		driver=$TIERLIMIT_LIBVIRT_DRIVER
	elif [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
		if kvm_boots; then
			driver=kvm
		else
			log "/dev/kvm opens but boots no kernel in ${KVM_PROBE_SECONDS}s: libvirt driver qemu (TCG)"
		fi
	fi
	export TIERLIMIT_LIBVIRT_DRIVER=$driver
	log "vagrant up collector sender (box $BOX, libvirt driver $driver)"
	# (Without the upload's progress meter: one \r-separated line per tick.)
	"$VAGRANT" up --provider=libvirt collector sender 2>&1 | grep --line-buffered -av 'Progress: '
	log "both VMs up and provisioned"
	"$VAGRANT" ssh-config collector sender >"$STATE/ssh_config"

	log "native XDP on virtio_net: queue pairs and modes"
	guest collector xdp-matrix

	# Issue 24 part 2 (UNIT_CHECK=0 skips it).
	if [ "${UNIT_CHECK:-1}" = 1 ]; then
		log "the shipped systemd unit, started by systemd as PID 1"
		guest collector unit-check
	fi

	log "collector: rsyslog (imudp) behind tierlimit run --xdp-mode native"
	guest collector collector-start
	local i w
	w=${WINDOW%s}
	for i in $(seq "$WINDOWS"); do
		# The next burst opens a new window: wait out the current one.
		[ "$i" -eq 1 ] || sleep "$w"
		guest sender burst
		# A failed window is counted in the state; collector-report fails then.
		guest collector window-check "$BURST" || true
	done
	log "totals, status and detach"
	guest collector collector-report
	log "per-window checks passed"

	if [ "$DEB_LIFE" = 1 ]; then
		deb_life
	fi

	if [ "$KERNEL_SUITE" = 1 ]; then
		log "the bpf package's tests on the collector's kernel"
		guest collector kernel-suite
	fi
}

# deb_life: the .deb's whole life on the collector, systemd as PID 1 (issue
# 24 part 3): the previous release installed and enabled, its windows
# checked; restart, then the upgrade to today's .deb, each under a flood
# with every burst's window checked shed; then the purge.
deb_life() {
	local i w=${WINDOW%s}
	log "deb: install the previous release (${OLD_COMMIT:0:7}), systemctl enable --now"
	guest collector deb-install
	for i in 1 2; do
		sleep "$w"
		guest sender burst
		guest collector window-check "$BURST"
	done
	deb_phase restart
	deb_phase upgrade
	log "deb: dpkg -r, then dpkg -i: the service the prerm stopped starts again"
	guest collector deb-op reinstall
	guest collector shed-check -init
	guest sender burst
	guest collector shed-check
	log "deb: apt-get purge with the pins elsewhere and TIERLIMIT_IFACES changed"
	guest collector deb-purge
	log "deb: the package's life passed"
}

# deb_phase OP: deb-op OP on the collector while the sender bursts, one
# window each; every burst's window must be shed, and at least one burst
# must go while OP runs (bounded: 12 bursts).
deb_phase() {
	local op=$1 pid i=0 during=0 w=${WINDOW%s}
	log "deb: $op during a flood"
	guest collector shed-check -init
	guest collector deb-op "$op" &
	pid=$!
	sleep 0.5
	while [ "$i" -lt 4 ] || { kill -0 "$pid" 2>/dev/null && [ "$i" -lt 12 ]; }; do
		i=$((i + 1))
		kill -0 "$pid" 2>/dev/null && during=$((during + 1))
		guest sender burst
		guest collector shed-check
		sleep "$w"
	done
	wait "$pid" || die "deb-op $op failed"
	[ "$during" -ge 1 ] || die "no burst was sent while $op ran"
	log "deb: $op: $i bursts, $during of them sent while it ran, each window shed"
}

case "${1:-}" in
__sandbox)
	sandbox_libvirt "$2"
	run_vms "$2"
	;;
__run) run_vms "$2" ;;
"") outer ;;
*) sed -n '2,37p' "$0"; exit 2 ;;
esac
