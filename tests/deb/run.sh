#!/usr/bin/env bash
# The Debian package: built with cargo-deb (packaging/build-deb.sh), then installed with
# dpkg -i into a clean Debian root (debootstrap minbase of this machine's release, cached as
# a tarball in $DXPU_DEB_CACHE, default ~/.cache/dxpu-deb, and unpacked fresh each run),
# where `dxpu --version`, `dxpu keygen` and the installed files are checked, both endpoints
# are checked and started as the package's user dxpu, and the package is purged; lintian
# passes it without an error or a warning, and its unit files pass `systemd-analyze verify`
# and score below 4.3 in `systemd-analyze security`.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${DXPU_DEB_CACHE:-$HOME/.cache/dxpu-deb}"
mkdir -p "$cache"

deb=$(bash packaging/build-deb.sh | tail -1)
[[ -f "$deb" ]] || { echo "deb test: no package built ($deb)" >&2; exit 1; }
echo "deb test: built $deb"
dpkg-deb --info "$deb" | grep -E '^ (Package|Version|Depends):'
# Built for one architecture, its Wireshark plugin where that architecture's Wireshark looks.
[[ $(dpkg-deb -f "$deb" Multi-Arch) == foreign ]] || { echo "deb test: Multi-Arch is not foreign" >&2; exit 1; }
# What the package needs and works with.
[[ $(dpkg-deb -f "$deb" Depends) == *passwd* ]] || { echo "deb test: Depends lacks passwd (the postinst's useradd)" >&2; exit 1; }
[[ $(dpkg-deb -f "$deb" Suggests) == *etcd-server*tshark*qemu-system-x86* ]] ||
    { echo "deb test: Suggests: $(dpkg-deb -f "$deb" Suggests)" >&2; exit 1; }
# lintian: no error and no warning (.ci/run installs it; a developer without it is told).
if command -v lintian >/dev/null; then
    tags=$(lintian --fail-on none "$deb" 2>&1 | grep -E '^[EW]: ' || true)
    [[ -z "$tags" ]] || { echo "deb test: lintian:" >&2; echo "$tags" >&2; exit 1; }
    echo "deb test: lintian: no errors, no warnings"
else
    echo "deb test: lintian not found (apt-get install lintian): not checked" >&2
fi

# The same mirror and release as this machine's apt.
mirror=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v -- '-security' | head -1)
[[ -n "$mirror" ]] || mirror=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break }}' | grep -v -- '-security' | head -1)
mirror="${DXPU_DEBIAN_MIRROR:-$mirror}"
release=$(. /etc/os-release && echo "$VERSION_CODENAME")
tarball="$cache/$release-minbase.tar"
if [[ ! -f "$tarball" ]]; then
    command -v debootstrap >/dev/null || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    echo "deb test: debootstrap $release (minbase) from $mirror"
    tmp=$(mktemp -d)
    debootstrap --variant=minbase "$release" "$tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
        tail -20 "$cache/debootstrap.log"
        exit 1
    }
    tar -C "$tmp" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$tmp"
fi
root=$(mktemp -d /tmp/dxpu-deb-root.XXXXXX)
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xf "$tarball"
# mktemp made the root 0700: as a machine's /, it is every user's to enter.
chmod 0755 "$root"
cp "$deb" "$root/tmp/dxpu.deb"
chroot "$root" dpkg -i /tmp/dxpu.deb
version=$(chroot "$root" dxpu --version)
echo "deb test: in the clean root: $version"
# The package's version and the commit it was built from (`unknown` outside a git checkout).
[[ "$version" == "dxpu $(grep -m1 '^version' Cargo.toml | cut -d'"' -f2) (commit "*")" ]] || { echo "deb test: unexpected version '$version'" >&2; exit 1; }
chroot "$root" dxpu keygen /tmp/k >/dev/null 2>&1
[[ $(stat -c %a "$root/tmp/k") == 600 ]] || { echo "deb test: keygen's file is not mode 0600" >&2; exit 1; }
# The host endpoint's user, made by the postinst, and the host unit running as it.
chroot "$root" getent passwd dxpu >/dev/null || { echo "deb test: no user dxpu after install" >&2; exit 1; }
for u in dxpu-gpu dxpu-host; do
    grep -qx 'User=dxpu' "$root/usr/lib/systemd/system/$u.service" ||
        { echo "deb test: $u.service does not run as dxpu" >&2; exit 1; }
done
for f in usr/lib/sysusers.d/dxpu.conf usr/bin/dxpu usr/lib/systemd/system/dxpu-gpu.service usr/lib/systemd/system/dxpu-host.service \
    etc/dxpu/gpu.toml.example etc/dxpu/host.toml.example usr/lib/$(uname -m)-linux-gnu/wireshark/plugins/dxpu.lua \
    usr/share/bash-completion/completions/dxpu usr/share/man/man1/dxpu.1.gz usr/share/man/man1/dxpu-gpu.1.gz \
    usr/share/man/man5/gpu.toml.5.gz usr/share/man/man5/host.toml.5.gz usr/lib/udev/rules.d/60-dxpu-vfio.rules \
    usr/share/doc/dxpu/changelog.Debian.gz usr/share/doc/dxpu/copyright \
    usr/share/doc/dxpu/README.md usr/share/doc/dxpu/docs/operations.md usr/share/doc/dxpu/docs/model/training.svg; do
    [[ -e "$root/$f" ]] || { echo "deb test: $f not installed" >&2; exit 1; }
done
# Every relative link in the installed README and docs names a file that is installed.
broken=$(cd "$root/usr/share/doc/dxpu" && for f in README.md docs/*.md; do
    { grep -o '](\([^)#:]*\)' "$f" || true; } | sed 's/^](//' | while read -r l; do
        [[ -z "$l" || -e "$(dirname "$f")/$l" ]] || echo "$f -> $l"
    done
done)
[[ -z "$broken" ]] || { echo "deb test: links to files not installed:" >&2; echo "$broken" >&2; exit 1; }
# The maintainer scripts reload systemd and restart or stop the units.
dpkg-deb -e "$deb" "$root/tmp/ctl"
grep -q daemon-reload "$root/tmp/ctl/postinst" && grep -q 'deb-systemd-invoke stop' "$root/tmp/ctl/prerm" ||
    { echo "deb test: the maintainer scripts do not handle the units" >&2; exit 1; }
# The example configurations parse: only what an operator must fill in is refused.
cp "$root/etc/dxpu/gpu.toml.example" "$root/tmp/gpu.toml"
out=$(chroot "$root" dxpu gpu --config /tmp/gpu.toml 2>&1 || true)
grep -q "key_file" <<<"$out" || { echo "deb test: the example gpu.toml fails otherwise: $out" >&2; exit 1; }
# Both endpoints as the units run them: as user dxpu, in directories of their own made for it
# (as systemd's RuntimeDirectory= and LogsDirectory= make them), their key given to it. Each
# is checked (--check), then started and asked for its status over its control socket.
ids="$(chroot "$root" id -u dxpu):$(chroot "$root" id -g dxpu)"
as_dxpu() { chroot --userspec="$ids" "$root" env HOME=/var/lib/dxpu "$@"; }
for d in run/dxpu/gpu run/dxpu/host var/log/dxpu/gpu etc/dxpu/keys; do
    install -d -m 0750 "$root/$d"
done
chroot "$root" chown dxpu:dxpu /run/dxpu/gpu /run/dxpu/host /var/log/dxpu/gpu
chroot "$root" chgrp dxpu /etc/dxpu/keys
chroot "$root" dxpu keygen /etc/dxpu/keys/host-a.key >/dev/null 2>&1
chroot "$root" chown dxpu:dxpu /etc/dxpu/keys/host-a.key
port=$((20000 + RANDOM % 20000))
cat >"$root/etc/dxpu/gpu.toml" <<EOF
listen = "127.0.0.1:$port"
[control]
socket = "/run/dxpu/gpu/control.sock"
[[host]]
name = "host-a"
key_file = "/etc/dxpu/keys/host-a.key"
[[device]]
name = "gpu0"
sim = { vram_mib = 256 }
allow = ["host-a"]
EOF
cat >"$root/etc/dxpu/host.toml" <<EOF
[control]
socket = "/run/dxpu/host/control.sock"
[[attach]]
server = "127.0.0.1:$port"
device = "gpu0"
key_file = "/etc/dxpu/keys/host-a.key"
EOF
as_dxpu dxpu gpu --check --config /etc/dxpu/gpu.toml
as_dxpu dxpu host --check --config /etc/dxpu/host.toml
as_dxpu timeout 60 dxpu gpu --config /etc/dxpu/gpu.toml >"$root/tmp/gpu.log" 2>&1 &
gpu_pid=$!
for _ in $(seq 50); do [[ -S "$root/run/dxpu/gpu/control.sock" ]] && break; sleep 0.1; done
# The host attaches, runs the verified workload on gpu0 as user dxpu, detaches and exits.
as_dxpu timeout 60 dxpu host --config /etc/dxpu/host.toml --workload >"$root/tmp/host.log" 2>&1 ||
    { cat "$root/tmp/host.log" "$root/tmp/gpu.log" >&2; echo "deb test: the host's workload failed as user dxpu" >&2; exit 1; }
status=$(as_dxpu dxpu ctl --socket /run/dxpu/gpu/control.sock status) ||
    { cat "$root/tmp/gpu.log" >&2; echo "deb test: the box's control socket did not answer its user" >&2; exit 1; }
kill "$gpu_pid"; wait "$gpu_pid" || true
echo "deb test: both endpoints checked and run as user dxpu (box status: ${status:0:60}…)"
if command -v systemd-analyze >/dev/null; then
    for u in dxpu-gpu dxpu-host; do
        sed "s#/usr/bin/dxpu#$root/usr/bin/dxpu#" "$root/usr/lib/systemd/system/$u.service" >"$root/tmp/$u.service"
        err=$(systemd-analyze verify --man=no "$root/tmp/$u.service" 2>&1) || { echo "$err" >&2; exit 1; }
        [[ -z "$err" ]] || { echo "deb test: systemd-analyze verify $u.service: $err" >&2; exit 1; }
    done
    echo "deb test: unit files verified"
    for u in dxpu-gpu dxpu-host; do
        score=$(systemd-analyze security --offline=yes "$root/tmp/$u.service" 2>&1 | grep -o 'exposure level for [^:]*: [0-9.]*' | awk '{print $NF}')
        awk -v s="$score" 'BEGIN { exit !(s != "" && s < 4.3) }' ||
            { echo "deb test: systemd-analyze security $u: '$score', not below 4.3" >&2; exit 1; }
        echo "deb test: $u exposure $score"
    done
fi
# Purged, the package leaves nothing of its own: the services' directories go with it (the
# files made here in /etc/dxpu taken away first, as an operator's own are not the package's).
rm -rf "$root/etc/dxpu/gpu.toml" "$root/etc/dxpu/host.toml" "$root/etc/dxpu/keys"
chroot "$root" dpkg --purge dxpu >/dev/null
for d in var/lib/dxpu var/log/dxpu run/dxpu etc/dxpu usr/bin/dxpu; do
    [[ ! -e "$root/$d" ]] || { echo "deb test: $d left after purge" >&2; ls -la "$root/$d" >&2; exit 1; }
done
echo "deb test: purge left nothing"
dpkg -c "$deb" | wc -l | xargs echo "deb test: files in the package:"
echo "deb test: PASS"
