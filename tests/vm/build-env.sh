#!/usr/bin/env bash
# Builds (once) the environment the VM test needs, from Debian packages only:
# a trixie chroot with QEMU 11.x from trixie-backports (it has the vfio-user-pci
# client that bookworm's QEMU lacks), and a guest kernel, busybox and pciutils.
# The chroot is cached in $DXPU_VM_CACHE (default ~/.cache/dxpu-vm); a finished
# build leaves $DXPU_VM_CACHE/chroot/.dxpu-ready and is not redone.
set -euo pipefail

cache="${DXPU_VM_CACHE:-$HOME/.cache/dxpu-vm}"
root="$cache/chroot"
# The Debian mirror this machine's own apt uses (deb822 .sources or a sources.list line
# for the main archive, not -security), unless DXPU_DEBIAN_MIRROR names one.
apt_mirror() {
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v -- '-security' | head -1)
    [[ -n "$uri" ]] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
        awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break }}' | grep -v -- '-security' | head -1)
    echo "$uri"
}
mirror="${DXPU_DEBIAN_MIRROR:-$(apt_mirror)}"
if [[ -z "$mirror" ]]; then
    echo "vm env: no Debian mirror in /etc/apt (sources.list or *.sources); set DXPU_DEBIAN_MIRROR" >&2
    exit 1
fi

if [[ -f "$root/.dxpu-ready" ]]; then
    echo "vm env: cached in $root"
    exit 0
fi
if ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

rm -rf "$root"
mkdir -p "$cache"
echo "vm env: debootstrap trixie into $root"
debootstrap --variant=minbase trixie "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    tail -20 "$cache/debootstrap.log"
    exit 1
}
echo "deb $mirror trixie-backports main" >"$root/etc/apt/sources.list.d/backports.list"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

# Keep the kernel's initramfs hooks quiet and cheap: the test builds its own initramfs.
mkdir -p "$root/etc/initramfs-tools"
chroot "$root" /bin/sh -c '
    set -e
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends -t trixie-backports qemu-system-x86 >/dev/null
    apt-get install -y -qq --no-install-recommends linux-image-amd64 busybox-static pciutils kmod >/dev/null
    apt-get clean
' >"$cache/apt.log" 2>&1 || {
    tail -30 "$cache/apt.log"
    exit 1
}
chroot "$root" qemu-system-x86_64 --version | head -1
chroot "$root" qemu-system-x86_64 -device help 2>/dev/null | grep -q vfio-user-pci || {
    echo "vm env: QEMU in $root has no vfio-user-pci device" >&2
    exit 1
}
touch "$root/.dxpu-ready"
echo "vm env: ready in $root"
