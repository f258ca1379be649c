#!/usr/bin/env bash
# peers.sh builds the XDP objects of the programs that make bench measures
# beside tierlimit (issue 42): XDP-Firewall (gamemann), L3AF's ratelimiting
# and xdp-tools' xdp-filter, each from its public source at the commit
# pinned below, out of tree: no peer code enters this repository (their
# licenses, and "copy no code"). It prints the directory of the objects;
# pass it to make bench as PEERS_DIR (tierlimit-bench suite -peers DIR).
#
#   deploy/bench/peers.sh SRC [OUT]
#
# SRC is a directory holding git snapshots of the three repositories, as
# OWNER+NAME/repo (bare) or OWNER+NAME or NAME (with .git); where a network
# exists, SRC may be "github" to clone them from https://github.com. OUT
# is the scratch directory of the objects (default: a new temporary one).
# Compiler: clang-$CLANG_VERSION (the Makefile's pin, 19), -O2 -g
# -target bpf. Headers: the peers' own, libbpf's (libbpf-dev), and for
# L3AF a vmlinux.h dumped from this kernel's BTF by bpftool; the Debian
# packages are installed with apt-get when missing (as root).
set -euo pipefail

CLANG_VERSION=${CLANG_VERSION:-19}
CLANG=${CLANG:-clang-$CLANG_VERSION}

# The pinned commits: the ones issue 42's figures were measured at.
XDPFW_REPO=gamemann/XDP-Firewall
XDPFW_COMMIT=178d3dfe00e2315793fb41ed1c34b8d264ec0703
L3AF_REPO=l3af-project/eBPF-Package-Repository
L3AF_COMMIT=69fd6d752e49b4598f56a2f02f3d3c24ae6f8d51
XDPTOOLS_REPO=xdp-project/xdp-tools
XDPTOOLS_COMMIT=f0b4ac21d71d84b8b5e78a03d999db09c86d0f25

usage() { echo "usage: $0 SRC|github [OUT]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
SRC=$1
OUT=${2:-$(mktemp -d "${TMPDIR:-/tmp}/tierlimit-peers.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tierlimit-peers-src.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

need_packages() {
	local missing=()
	command -v "$CLANG" >/dev/null || missing+=("clang-$CLANG_VERSION")
	command -v bpftool >/dev/null || missing+=(bpftool)
	[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
	[ -f /usr/include/x86_64-linux-gnu/asm/types.h ] || [ -f /usr/include/asm/types.h ] || missing+=(linux-libc-dev)
	[ ${#missing[@]} -eq 0 ] && return
	if [ "$(id -u)" != 0 ]; then
		echo "peers.sh: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
		exit 1
	fi
	echo "peers.sh: apt-get install ${missing[*]}" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
}

# checkout REPO COMMIT DIR: a work tree of REPO at COMMIT in DIR.
checkout() {
	local repo=$1 commit=$2 dir=$3 name=${1#*/} git=
	if [ "$SRC" = github ]; then
		git clone -q "https://github.com/$repo" "$dir"
		git -C "$dir" checkout -q "$commit"
		return
	fi
	for c in "$SRC/${repo/\//+}/repo" "$SRC/${repo/\//+}" "$SRC/$name"; do
		if [ -d "$c" ] && git --git-dir="$c" rev-parse -q --verify "$commit^{commit}" >/dev/null 2>&1; then
			git=$c; break
		fi
		if [ -d "$c/.git" ] && git -C "$c" rev-parse -q --verify "$commit^{commit}" >/dev/null 2>&1; then
			git=$c/.git; break
		fi
	done
	if [ -z "$git" ]; then
		echo "peers.sh: no snapshot of $repo holding $commit under $SRC" >&2
		return 1
	fi
	mkdir -p "$dir"
	git --git-dir="$git" archive "$commit" | tar -x -C "$dir"
}

ARCH_INC=/usr/include/$(uname -m)-linux-gnu
# glibc's headers (XDP-Firewall includes stdatomic.h) ask a BPF target,
# which is neither 64-bit x86 nor anything else glibc knows, for the
# 32-bit stubs list, which only libc6-dev-i386 ships: an empty one does,
# as it only lists unimplemented functions.
mkdir -p "$WORK/inc/gnu" && : >"$WORK/inc/gnu/stubs-32.h"
BPF_CFLAGS=(-O2 -g -target bpf -Wno-unused-value -Wno-pointer-sign -Wno-compare-distinct-pointer-types -I"$ARCH_INC" -I"$WORK/inc")

need_packages
built=()

# XDP-Firewall: src/xdp/prog.c with its own headers and xdp-tools' headers
# (its submodule modules/xdp-tools; the pinned xdp-tools snapshot here),
# its config.h as committed (filters, flow rate limits, IPv6, bpf_loop).
build_xdpfw() {
	checkout "$XDPFW_REPO" "$XDPFW_COMMIT" "$WORK/xdpfw" || return 1
	[ -d "$WORK/xdptools" ] || checkout "$XDPTOOLS_REPO" "$XDPTOOLS_COMMIT" "$WORK/xdptools" || return 1
	"$CLANG" "${BPF_CFLAGS[@]}" -I"$WORK/xdpfw/src" -I"$WORK/xdptools/headers" \
		-c "$WORK/xdpfw/src/xdp/prog.c" -o "$OUT/xdpfw.o" || return 1
	built+=("xdpfw.o ($XDPFW_REPO@$XDPFW_COMMIT)")
}

# L3AF ratelimiting: ratelimiting/ratelimiting.bpf.c (the Linux build, on
# vmlinux.h) with libbpf's headers.
build_l3af() {
	checkout "$L3AF_REPO" "$L3AF_COMMIT" "$WORK/l3af" || return 1
	bpftool btf dump file /sys/kernel/btf/vmlinux format c >"$WORK/l3af/ratelimiting/vmlinux.h" || return 1
	"$CLANG" -O2 -g -target bpf -D__TARGET_ARCH_x86 -I"$WORK/l3af/ratelimiting" \
		-c "$WORK/l3af/ratelimiting/ratelimiting.bpf.c" -o "$OUT/l3af_ratelimiting.o" || return 1
	built+=("l3af_ratelimiting.o ($L3AF_REPO@$L3AF_COMMIT)")
}

# xdp-filter: two of its ten programs, allow mode (a listed match drops,
# the rest passes): UDP ports only, and all features.
build_xdpfilter() {
	[ -d "$WORK/xdptools" ] || checkout "$XDPTOOLS_REPO" "$XDPTOOLS_COMMIT" "$WORK/xdptools" || return 1
	local d=$WORK/xdptools/xdp-filter p
	for p in xdpfilt_alw_udp xdpfilt_alw_all; do
		"$CLANG" "${BPF_CFLAGS[@]}" -I"$WORK/xdptools/headers" -I"$WORK/xdptools/lib/util" -I"$d" \
			-c "$d/$p.c" -o "$OUT/$p.o" || return 1
		built+=("$p.o ($XDPTOOLS_REPO@$XDPTOOLS_COMMIT)")
	done
}

failed=0
build_xdpfw || { echo "peers.sh: XDP-Firewall not built" >&2; failed=1; }
build_l3af || { echo "peers.sh: L3AF ratelimiting not built" >&2; failed=1; }
build_xdpfilter || { echo "peers.sh: xdp-filter not built" >&2; failed=1; }
# peers.txt names each object's source and commit, for results.md.
printf '%s\n' "${built[@]}" >"$OUT/peers.txt"
for b in "${built[@]}"; do echo "peers.sh: built $b" >&2; done
echo "$OUT"
exit $failed
