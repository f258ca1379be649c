#!/usr/bin/env bash
# Provision a Debian 12 (bookworm) machine to build, test and benchmark
# tierlimit: the Vagrant VMs (Vagrantfile), CI's machine, or a developer's.
# Idempotent: run it as often as you like; what is there already is kept.
#
#   provision.sh                   Debian packages, then Go if no suitable Go is found
#   provision.sh --packages-only   Debian packages only (CI: downloads nothing but apt packages)
#   provision.sh --check           only check that everything is installed; exit 1 if not
#   provision.sh --deps            (make deps) install the Debian packages only if a tool the tests need is missing
#   provision.sh --with-vagrant    also install Debian's vagrant (for make vagrant-validate on a host)
#   provision.sh --with-vm         also what make vagrant-box and vagrant-e2e need on the host:
#                                  vagrant-libvirt, libvirt, QEMU, debootstrap, dnsmasq
#   provision.sh --role collector|sender   (Vagrant) also prepare the VM for its role
#   provision.sh --prebuilt DIR    (Vagrant, local box) install the static tierlimit and
#                                  tierlimit-bench built on the host in DIR; no apt, no Go
#
# Pinned to what the repository uses (keep in step):
#   CLANG_VERSION  the Makefile's CLANG_VERSION (bpf2go's compiler)
#   GO_VERSION     go.mod's go line; a Go of the same minor and at least this patch is "suitable"
set -euo pipefail

CLANG_VERSION=${CLANG_VERSION:-19}
GO_VERSION=${GO_VERSION:-1.26.8}
GO_ROOT=${GO_ROOT:-/usr/local/go}

# What the build, the tests, the demo and the benchmarks need:
#   clang/llvm        compile bpf/limiter.c (make generate) and llvm-strip it
#   iproute2, ethtool network namespaces, veths, XDP and NAPI settings
#   nftables          the nftables comparison of the benchmarks
#   netsniff-ng       trafgen, the benchmarks' flood generator
#   rsyslog, bsdutils a real syslog collector and logger(1) for the tests
#   redis-server, redis-tools  the fleet store of the fleet tests, and redis-cli
#                     (--cluster create); the tests start their own servers, so
#                     the package's own service is stopped and disabled
#   iputils-ping      reachability checks in the VMs
#   util-linux        nsenter, setpriv and taskset
#   prometheus        promtool (alert rule tests) and the server of the monitoring end-to-end test
#   systemd           systemd-analyze (the packaged unit's checks)
#   debootstrap       CI's fresh-machine check (.ci/fresh-machine)
PACKAGES=(
	"clang-${CLANG_VERSION}" "llvm-${CLANG_VERSION}"
	iproute2 ethtool nftables netsniff-ng
	rsyslog bsdutils iputils-ping util-linux
	redis-server redis-tools
	make git ca-certificates curl python3 bpftool
	prometheus systemd debootstrap
	tcpdump tshark
)

# The commands the tests, the demo and the benchmarks run, by the package
# above that ships each (--deps and --check look for these).
TOOLS=(
	"clang-${CLANG_VERSION}" "llvm-strip-${CLANG_VERSION}" ip ethtool nft trafgen
	logger rsyslogd ping nsenter setpriv taskset unshare make git
	redis-server redis-cli
	promtool prometheus systemd-analyze
	tcpdump tshark
)

mode=full
role=
prebuilt=
while [ $# -gt 0 ]; do
	case "$1" in
	--packages-only) mode=packages ;;
	--check) mode=check ;;
	--deps) mode=deps ;;
	--with-vagrant) PACKAGES+=(vagrant) ;;
	--with-vm)
		PACKAGES+=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
			qemu-system-x86 qemu-utils debootstrap dnsmasq-base iptables rsync openssh-client e2fsprogs)
		;;
	--role) role=${2:?--role needs collector or sender}; shift ;;
	--prebuilt) mode=prebuilt; prebuilt=${2:?--prebuilt needs a directory}; shift ;;
	-h | --help) sed -n '2,19p' "$0"; exit 0 ;;
	*) echo "provision.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

log() { echo "provision: $*"; }

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		echo "provision.sh: run as root (sudo)" >&2
		exit 1
	fi
}

. /etc/os-release 2>/dev/null || true
if [ "${ID:-}" != debian ] || [ "${VERSION_ID:-}" != 12 ]; then
	log "warning: written for Debian 12, this is ${PRETTY_NAME:-unknown}"
fi

missing_packages() {
	local p
	for p in "${PACKAGES[@]}"; do
		if ! dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			echo "$p"
		fi
	done
}

install_packages() {
	local missing
	missing=$(missing_packages)
	if [ -z "$missing" ]; then
		log "Debian packages: all ${#PACKAGES[@]} installed"
		quiet_services
		return
	fi
	need_root
	log "installing:" $missing
	export DEBIAN_FRONTEND=noninteractive
	# Refresh the lists only when a package cannot be found in them.
	# shellcheck disable=SC2086
	if ! apt-get install -y --no-install-recommends $missing; then
		apt-get update
		# shellcheck disable=SC2086
		apt-get install -y --no-install-recommends $missing
	fi
	quiet_services
}

# quiet_services stops and disables the services that Debian starts when it
# installs a package the tests only run as their own processes: the tests
# need no redis-server listening on 6379, and none must be left running.
quiet_services() {
	local s
	for s in redis-server; do
		if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet "$s" 2>/dev/null; then
			log "disabling the $s service (the tests start their own)"
			systemctl disable --now "$s" || true
		fi
	done
}

# go_ok GO: true when GO reports the pinned minor version at least at the
# pinned patch (go1.26.8 or a later go1.26.x for GO_VERSION=1.26.8).
go_ok() {
	local v want_minor want_patch minor patch
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	v=${v%%[!0-9.]*}
	want_minor=${GO_VERSION%.*}
	want_patch=${GO_VERSION##*.}
	minor=${v%.*}
	patch=${v##*.}
	[ "$minor" = "$want_minor" ] && [ "${patch:-0}" -ge "$want_patch" ]
}

find_go() {
	local g
	for g in "$(command -v go 2>/dev/null || true)" "$GO_ROOT/bin/go"; do
		if [ -n "$g" ] && [ -x "$g" ] && go_ok "$g"; then
			echo "$g"
			return 0
		fi
	done
	return 1
}

install_go() {
	local g arch url sum tmp
	if g=$(find_go); then
		log "Go: $("$g" version) at $g, suitable; not downloading"
		return
	fi
	need_root
	case "$(uname -m)" in
	x86_64) arch=amd64 ;;
	aarch64) arch=arm64 ;;
	*) echo "provision.sh: no Go tarball for $(uname -m)" >&2; exit 1 ;;
	esac
	url="https://go.dev/dl/go${GO_VERSION}.linux-${arch}.tar.gz"
	# The checksum comes from go.dev's release list unless GO_SHA256 is given.
	sum=${GO_SHA256:-$(curl -fsSL 'https://go.dev/dl/?mode=json&include=all' | python3 -c '
import json, sys
name = sys.argv[1]
for rel in json.load(sys.stdin):
    for f in rel["files"]:
        if f["filename"] == name:
            print(f["sha256"]); sys.exit(0)
sys.exit("no checksum for " + name)' "go${GO_VERSION}.linux-${arch}.tar.gz")}
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	log "downloading $url"
	curl -fsSL -o "$tmp/go.tgz" "$url"
	echo "$sum  $tmp/go.tgz" | sha256sum -c -
	rm -rf "$GO_ROOT"
	tar -C "$(dirname "$GO_ROOT")" -xzf "$tmp/go.tgz"
	ln -sf "$GO_ROOT/bin/go" /usr/local/bin/go
	ln -sf "$GO_ROOT/bin/gofmt" /usr/local/bin/gofmt
	log "Go: $("$GO_ROOT/bin/go" version)"
}

# have_tool T: true when T is on PATH or in /usr/sbin or /sbin (which a
# user's PATH may lack; sudo's has them).
have_tool() {
	command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}

missing_tools() {
	local t
	for t in "${TOOLS[@]}"; do
		have_tool "$t" || echo "$t"
	done
}

# deps installs the Debian packages when a tool of TOOLS is missing, and
# says which tools it found missing and which packages it installs. As a
# user other than root it only warns: the tests that need a missing tool
# skip (or fail under TIERLIMIT_REQUIRE_BPF=1).
deps() {
	local missing
	missing=$(missing_tools)
	if [ -z "$missing" ]; then
		log "test tools: all ${#TOOLS[@]} found"
		return
	fi
	log "test tools missing:" $missing
	if [ "$(id -u)" -ne 0 ]; then
		log "warning: not root, not installing; run: sudo make deps"
		return
	fi
	install_packages
	missing=$(missing_tools)
	if [ -n "$missing" ]; then
		echo "provision.sh: still missing after installing the packages:" $missing "(PATH=$PATH)" >&2
		exit 1
	fi
	log "test tools: all ${#TOOLS[@]} found"
}

check() {
	local bad=0 t g
	for t in "${TOOLS[@]}"; do
		if have_tool "$t"; then
			printf 'provision: ok      %s\n' "$t"
		else
			printf 'provision: MISSING %s\n' "$t"
			bad=1
		fi
	done
	if g=$(find_go); then
		printf 'provision: ok      %s\n' "$("$g" version)"
	else
		printf 'provision: MISSING go%s (or a later go%s.x)\n' "$GO_VERSION" "${GO_VERSION%.*}"
		bad=1
	fi
	if [ ! -d /sys/fs/bpf ]; then
		printf 'provision: MISSING /sys/fs/bpf (bpffs)\n'
		bad=1
	fi
	return $bad
}

# prepare_role sets up what a VM's role needs beyond packages.
prepare_role() {
	need_root
	# The project's tools on PATH for vagrant ssh -c.
	echo 'export PATH=$PATH:/usr/local/go/bin:/root/go/bin' >/etc/profile.d/tierlimit.sh
	case "$role" in
	collector)
		# The synced folder is built here, as root, by e2e.sh; nothing else
		# to do: rsyslog listens on the default unix socket only, leaving
		# UDP 514 to the benchmark's collector process.
		;;
	sender) ;;
	"") ;;
	*) echo "provision.sh: unknown role $role" >&2; exit 2 ;;
	esac
}

# install_prebuilt copies the host-built binaries into /usr/local/bin and
# checks that the box has the tools the e2e uses (build-box.sh installs them).
install_prebuilt() {
	local b t bad=0
	need_root
	for b in tierlimit tierlimit-bench; do
		if [ ! -x "$prebuilt/$b" ]; then
			echo "provision.sh: $prebuilt/$b missing: make vagrant-e2e builds it (CGO_ENABLED=0 go build -o .vagrant-bin/ ./cmd/...)" >&2
			exit 1
		fi
		install -m 0755 "$prebuilt/$b" "/usr/local/bin/$b"
	done
	log "installed $(/usr/local/bin/tierlimit version 2>/dev/null | head -1)"
	for t in ip ethtool trafgen rsyslogd ping; do
		if ! command -v "$t" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$t" ] && [ ! -x "/sbin/$t" ]; then
			printf 'provision: MISSING %s (the local box has it: make vagrant-box)\n' "$t"
			bad=1
		fi
	done
	return $bad
}

case "$mode" in
prebuilt)
	install_prebuilt
	prepare_role
	;;
packages)
	install_packages
	;;
check)
	check
	;;
deps)
	deps
	;;
full)
	install_packages
	install_go
	[ -n "$role" ] && prepare_role
	check
	;;
esac
