#!/usr/bin/env bash
# The VM test: a QEMU guest sees the remote simgpu as a local PCI device.
#
#   dxpu loopback --vfio-user DIR  (GPU box + simgpu + host endpoint over UDP loopback,
#                                   the host endpoint serving vfio-user on DIR/gpu0.sock)
#   qemu-system-x86_64 (11.x, trixie-backports, in a chroot; TCG) with vfio-user-pci and an
#   emulated IOMMU; the guest kernel binds the simgpu to vfio-pci and runs dxpu-guest (the
#   simgpu driver, static) on it: the demo workload through guest memory, every result
#   checked in the guest.
#
# Passes when the guest's lspci shows the simgpu with its BARs, PCI Express and MSI-X
# capabilities, dxpu-guest prints PASS (workload verified; its interrupt steps need MSI-X),
# and the server stops cleanly on SIGTERM. Figures: the guest's report, in $DXPU_VM_OUT
# (default target/vm) with the full logs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache="${DXPU_VM_CACHE:-$HOME/.cache/dxpu-vm}"
root="$cache/chroot"
out="${DXPU_VM_OUT:-$repo/target/vm}"
timeout_s="${DXPU_VM_TIMEOUT:-600}"

"$here/build-env.sh"

cd "$repo"
echo "vm test: building dxpu and the static guest driver"
cargo build --release --quiet
RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --quiet -p dxpu-guest --target x86_64-unknown-linux-gnu
guest_bin="$repo/target/x86_64-unknown-linux-gnu/release/dxpu-guest"

mkdir -p "$out"
work=$(mktemp -d "$root/tmp/dxpu-vm.XXXXXX")
inner="/tmp/$(basename "$work")" # the same folder, as QEMU in the chroot sees it
server_pid=""
cleanup() {
    [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
    umount "$root/proc" 2>/dev/null || true
    umount "$root/dev" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# --- the guest's initramfs: busybox, lspci, the VFIO modules, dxpu-guest, /init
kver=$(ls "$root/lib/modules" | head -1)
ird="$work/initramfs"
mkdir -p "$ird"/{bin,lib/modules,proc,sys,dev,usr/share/misc,lib64,lib/x86_64-linux-gnu}
cp "$root/bin/busybox" "$ird/bin/busybox"
cp "$guest_bin" "$ird/bin/dxpu-guest"
cp "$root/usr/bin/lspci" "$ird/bin/lspci"
cp "$root/usr/share/misc/pci.ids" "$ird/usr/share/misc/pci.ids"
for lib in $(chroot "$root" ldd /usr/bin/lspci | grep -o '/[^ ]*'); do
    mkdir -p "$ird$(dirname "$lib")"
    cp -L "$root$lib" "$ird$lib"
done
for m in virt/lib/irqbypass drivers/vfio/vfio drivers/vfio/vfio_iommu_type1 \
    drivers/vfio/pci/vfio-pci-core drivers/vfio/pci/vfio-pci; do
    xz -dc "$root/lib/modules/$kver/kernel/$m.ko.xz" >"$ird/lib/modules/$(basename "$m").ko"
done
cat >"$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in irqbypass vfio vfio_iommu_type1 vfio-pci-core vfio-pci; do
    insmod /lib/modules/$m.ko || echo "dxpu-vm: insmod $m failed"
done
dev=""
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat $d/vendor)" = 0x1234 ] && [ "$(cat $d/device)" = 0xd9a0 ]; then dev=$d; fi
done
if [ -z "$dev" ]; then
    echo "dxpu-vm: no simgpu in the guest"; lspci -nn
else
    bdf=${dev##*/}
    echo "dxpu-vm: lspci begin"
    lspci -vvv -s "$bdf"
    echo "dxpu-vm: lspci end"
    echo vfio-pci >"$dev/driver_override"
    echo "$bdf" >/sys/bus/pci/drivers_probe
    echo "dxpu-vm: driver $(basename "$(readlink "$dev/driver")"), iommu group $(basename "$(readlink "$dev/iommu_group")")"
    /bin/dxpu-guest --device "$dev" --scale 1
    echo "dxpu-vm: dxpu-guest exit $?"
    grep -i -E "vfio|dmar" /proc/interrupts | head -12
fi
poweroff -f
INIT
chmod +x "$ird/init"
chroot "$root" /bin/sh -c "cd $inner/initramfs && find . | busybox cpio -o -H newc 2>/dev/null" | gzip -1 >"$work/initramfs.gz"

# --- the host side: box + simgpu + host endpoint serving vfio-user
mount --bind /dev "$root/dev"
mount -t proc proc "$root/proc"
"$repo/target/release/dxpu" loopback --vfio-user "$work" --poll "${DXPU_VM_POLL:-blocking}" --log-level "${DXPU_VM_LOG_LEVEL:-info}" \
    >"$out/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
    [[ -S "$work/gpu0.sock" ]] && break
    sleep 0.1
done
[[ -S "$work/gpu0.sock" ]] || { cat "$out/server.log"; echo "vm test: no vfio-user socket"; exit 1; }

# --- the guest
echo "vm test: booting the guest (TCG)"
start=$(date +%s)
set +e
timeout "$timeout_s" chroot "$root" qemu-system-x86_64 \
    -accel tcg -cpu max -m 512M -smp 1 -nographic -no-reboot -serial stdio -monitor none \
    -display none -nodefaults \
    -object memory-backend-memfd,id=mem,size=512M,share=on -machine q35,memory-backend=mem \
    -device intel-iommu,caching-mode=on \
    -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$inner/gpu0.sock\",\"type\":\"unix\"}}" \
    -kernel "/boot/vmlinuz-$kver" -initrd "$inner/initramfs.gz" \
    -append "console=ttyS0 intel_iommu=on panic=-1 quiet" >"$out/guest.log" 2>&1
qemu_rc=$?
set -e
echo "vm test: guest ran $(($(date +%s) - start)) s (qemu exit $qemu_rc)"
kill -TERM "$server_pid"
wait "$server_pid"
server_rc=$?
server_pid=""

# --- verdict
grep "dxpu-guest:" "$out/guest.log" | tee "$out/report.txt" || true
fail=0
check() { # description, pattern
    if grep -q -E "$2" "$out/guest.log"; then echo "ok:   $1"; else echo "FAIL: $1"; fail=1; fi
}
check "lspci shows the simgpu" "Unclassified device|1234:d9a0|Device d9a0"
check "lspci shows a memory BAR" "Region 0: Memory at"
check "lspci shows PCI Express" "Capabilities: \[[0-9a-f]+\] Express"
check "lspci shows MSI-X" "MSI-X: Enable"
check "the guest's vfio-pci has the device" "dxpu-vm: driver vfio-pci"
check "the workload ran verified in the guest" "dxpu-guest: workload verified"
check "MSI-X interrupts reached the guest driver" "dxpu-guest: [1-9][0-9]* MSI-X interrupts received"
check "dxpu-guest passed" "dxpu-guest: PASS"
if [[ $server_rc -ne 0 ]]; then echo "FAIL: the server exited $server_rc"; fail=1; else echo "ok:   the server stopped cleanly"; fi
if [[ $fail -ne 0 ]]; then
    echo "--- guest log (tail)"; tail -60 "$out/guest.log"
    echo "--- server log (tail)"; tail -30 "$out/server.log"
    exit 1
fi
echo "vm test: PASS (logs in $out)"
