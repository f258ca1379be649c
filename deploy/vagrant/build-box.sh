#!/usr/bin/env bash
# make vagrant-box: build a Debian 12 (bookworm) Vagrant box for the libvirt
# provider from Debian packages only, and add it as $BOX_NAME. For machines
# that cannot reach Vagrant Cloud (CI) and for TCG (no KVM): see
# deploy/README.md, "The local box".
#
#   build-box.sh           build (unless the cached box is current) and vagrant box add
#   build-box.sh --force   rebuild and re-add
#
# The box, as Vagrant's box format and vagrant-libvirt describe it:
#   box.img        qcow2 disk: one ext4 file system on the whole disk (no
#                  partition table, no boot loader) made by debootstrap
#   vmlinuz, initrd.img
#                  the Debian kernel and its initramfs, booted directly by
#                  libvirt (the box's Vagrantfile sets kernel/initrd/cmd_line)
#   metadata.json  {"provider": "libvirt", "format": "qcow2", ...}
#   Vagrantfile    the box's defaults
# The guest: systemd, openssh-server, ifupdown + DHCP on eth0 (net.ifnames=0),
# rsyslog, iproute2, ethtool, trafgen (netsniff-ng), rsync, sudo and a
# "vagrant" user (password-less sudo) with Vagrant's well-known insecure
# public key, as every public box has. The box's SSH host keys are made at
# build time; it is a test box, not for a network you do not control.
#
# Cached: the box is rebuilt only when what goes into it changes (the
# stamp hashes BOX_FORMAT, the suite, mirror, disk size and packages), or
# with --force. Needs root, debootstrap, qemu-utils,
# e2fsprogs and Debian's apt mirror.
#
# Environment: BOX_NAME (tierlimit/bookworm-local), BOX_CACHE
# (/var/cache/tierlimit/vagrant-box), MIRROR (the first URIs of
# /etc/apt/sources.list.d/debian.sources, else http://deb.debian.org/debian),
# DISK_GB (virtual disk size, 8).
set -euo pipefail

BOX_NAME=${BOX_NAME:-tierlimit/bookworm-local}
BOX_CACHE=${BOX_CACHE:-/var/cache/tierlimit/vagrant-box}
DISK_GB=${DISK_GB:-8}
VAGRANT=${VAGRANT:-vagrant}
SUITE=bookworm
# The kernel comes second (KERNEL), once the initramfs is configured.
KERNEL=linux-image-amd64
PACKAGES=(
	initramfs-tools zstd udev kmod systemd systemd-sysv dbus
	openssh-server sudo ifupdown isc-dhcp-client iproute2 iputils-ping
	ethtool netsniff-ng rsyslog rsync procps ca-certificates less
)

log() { echo "vagrant-box: $(date -u +%H:%M:%S) $*"; }
die() { echo "vagrant-box: $*" >&2; exit 1; }

force=
case "${1:-}" in
--force) force=1 ;;
"") ;;
*) sed -n '2,30p' "$0"; exit 2 ;;
esac

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and chroot need it)"
for t in debootstrap qemu-img mkfs.ext4 "$VAGRANT" sha256sum; do
	command -v "$t" >/dev/null || die "$t not found: apt-get install debootstrap qemu-utils e2fsprogs vagrant vagrant-libvirt"
done

if [ -z "${MIRROR:-}" ]; then
	MIRROR=$(awk '/^URIs:/ && $2 ~ /debian$/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

# The cache key: what goes into the box. Bump BOX_FORMAT when the guest's
# configuration below changes.
BOX_FORMAT=1
stamp=$(echo "$BOX_FORMAT $SUITE $MIRROR $DISK_GB $KERNEL ${PACKAGES[*]}" | sha256sum | cut -c1-16)
out="$BOX_CACHE/$stamp"

box_listed() {
	"$VAGRANT" box list --machine-readable 2>/dev/null |
		awk -F, -v n="$BOX_NAME" '$3 == "box-name" && $4 == n { found = 1 } END { exit !found }'
}

if [ -z "$force" ] && [ -f "$out/tierlimit.box" ] && box_listed &&
	[ "$(cat "$BOX_CACHE/added" 2>/dev/null)" = "$stamp" ]; then
	log "$BOX_NAME is current (stamp $stamp, $out); nothing to do"
	exit 0
fi

if [ -n "$force" ] || [ ! -f "$out/tierlimit.box" ]; then
	build=$(mktemp -d "${TMPDIR:-/var/tmp}/tierlimit-box.XXXXXX")
	root="$build/root"
	cleanup() {
		for m in dev/pts dev proc sys; do
			mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"
		done
		rm -rf "$build"
	}
	trap cleanup EXIT

	log "debootstrap $SUITE from $MIRROR into $root"
	include=$(IFS=,; echo "${PACKAGES[*]}")
	# No kernel hooks run in the chroot until the tree is set up below.
	debootstrap --variant=minbase --include="$include" "$SUITE" "$root" "$MIRROR" >"$build/debootstrap.log" 2>&1 ||
		{ tail -30 "$build/debootstrap.log"; die "debootstrap failed"; }

	log "configuring the guest"
	echo tierlimit-box >"$root/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\ttierlimit-box\n' >"$root/etc/hosts"
	echo '/dev/vda / ext4 defaults,noatime 0 1' >"$root/etc/fstab"
	cat >"$root/etc/network/interfaces" <<-'EOF'
		# The box: DHCP on the first NIC (Vagrant's management network);
		# vagrant adds the private network's NIC below.
		source /etc/network/interfaces.d/*
		auto lo
		iface lo inet loopback
		auto eth0
		iface eth0 inet dhcp
	EOF
	cat >"$root/etc/apt/sources.list" <<-EOF
		deb $MIRROR $SUITE main
	EOF
	# Boot fast under TCG: no timers that start apt or man-db, no waiting
	# for a network that the e2e does not need.
	chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer \
		systemd-timesyncd.service 2>/dev/null || true
	mkdir -p "$root/etc/ssh/sshd_config.d"
	printf 'UseDNS no\nPasswordAuthentication no\n' >"$root/etc/ssh/sshd_config.d/vagrant.conf"
	mkdir -p "$root/etc/systemd/journald.conf.d"
	printf '[Journal]\nStorage=volatile\n' >"$root/etc/systemd/journald.conf.d/box.conf"

	chroot "$root" useradd --create-home --shell /bin/bash --user-group vagrant
	echo 'vagrant ALL=(ALL) NOPASSWD: ALL' >"$root/etc/sudoers.d/vagrant"
	chmod 0440 "$root/etc/sudoers.d/vagrant"
	install -d -m 0700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
	key=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub /opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1 || true)
	[ -n "$key" ] || die "Vagrant's insecure public key (keys/vagrant.pub) not found in the vagrant package"
	install -m 0600 -o 1000 -g 1000 "$key" "$root/home/vagrant/.ssh/authorized_keys"
	chroot "$root" chown -R vagrant:vagrant /home/vagrant

	# The kernel, with a small initramfs: only what mounts the virtio disk
	# (MODULES=most takes minutes to pack on a busy host, and boots slower).
	cat >"$root/etc/initramfs-tools/conf.d/tierlimit-box" <<-'EOF'
		MODULES=list
		COMPRESS=zstd
	EOF
	printf '%s\n' virtio_pci virtio_blk virtio_net virtio_console ext4 >>"$root/etc/initramfs-tools/modules"
	mount --bind /dev "$root/dev"
	mount -t proc proc "$root/proc"
	mount -t sysfs sys "$root/sys"
	log "installing $KERNEL"
	chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -q update >"$build/kernel.log" 2>&1 &&
		chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$KERNEL" >>"$build/kernel.log" 2>&1 ||
		{ tail -30 "$build/kernel.log"; die "installing $KERNEL failed"; }
	umount -l "$root/dev" "$root/proc" "$root/sys"
	ls "$root"/boot/initrd.img-* >/dev/null 2>&1 || die "no initramfs in the box"
	chroot "$root" apt-get clean
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old

	mkdir -p "$build/box"
	cp -L "$root/vmlinuz" "$build/box/vmlinuz"
	cp -L "$root/initrd.img" "$build/box/initrd.img"
	log "making box.img (${DISK_GB} GB qcow2, ext4 on the whole disk)"
	truncate -s "${DISK_GB}G" "$build/disk.raw"
	mkfs.ext4 -q -F -L root -d "$root" "$build/disk.raw"
	qemu-img convert -f raw -O qcow2 "$build/disk.raw" "$build/box/box.img"
	rm -f "$build/disk.raw"
	cat >"$build/box/metadata.json" <<-EOF
		{"provider": "libvirt", "format": "qcow2", "virtual_size": $DISK_GB}
	EOF
	cat >"$build/box/Vagrantfile" <<-'EOF'
		# tierlimit's local bookworm box (deploy/vagrant/build-box.sh): the
		# kernel and initramfs ship in the box and are booted directly.
		Vagrant.configure("2") do |config|
		  config.vm.provider "libvirt" do |lv|
		    dir = File.dirname(__FILE__)
		    lv.kernel = File.join(dir, "vmlinuz")
		    lv.initrd = File.join(dir, "initrd.img")
		    lv.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0 biosdevname=0 quiet"
		    lv.disk_bus = "virtio"
		  end
		end
	EOF
	log "packing $out/tierlimit.box"
	mkdir -p "$out.tmp"
	tar -C "$build/box" -cf "$out.tmp/tierlimit.box" metadata.json Vagrantfile box.img vmlinuz initrd.img
	rm -rf "$out"
	mv "$out.tmp" "$out"
	# Older builds are of no use any more.
	find "$BOX_CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$stamp" -exec rm -rf {} +
fi

log "vagrant box add $BOX_NAME"
"$VAGRANT" box add --force --name "$BOX_NAME" "$out/tierlimit.box"
echo "$stamp" >"$BOX_CACHE/added"
log "done: $BOX_NAME ($(du -h "$out/tierlimit.box" | cut -f1))"
