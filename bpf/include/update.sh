#!/usr/bin/env bash
# Refresh the vendored libbpf headers from Debian's libbpf-dev package.
# The kernel types the program needs live in tl_kernel.h, written by hand
# from the UAPI headers (XDP needs no vmlinux.h).
#
# Usage: bpf/include/update.sh   (needs: apt-get install libbpf-dev)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=/usr/include/bpf
for f in bpf_helpers.h bpf_helper_defs.h bpf_endian.h; do
	install -m 0644 "$src/$f" "$here/$f"
done
dpkg-query -W -f='libbpf-dev ${Version}\n' libbpf-dev >"$here/VERSION"
echo "vendored $(cat "$here/VERSION")"
