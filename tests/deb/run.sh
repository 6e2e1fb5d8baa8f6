#!/usr/bin/env bash
# The Debian package: built with cargo-deb (packaging/build-deb.sh), then installed with
# dpkg -i into a clean Debian root (debootstrap minbase of this machine's release, cached as
# a tarball in $DXPU_DEB_CACHE, default ~/.cache/dxpu-deb, and unpacked fresh each run),
# where `dxpu --version`, `dxpu keygen` and the installed files are checked, and its unit
# files pass `systemd-analyze verify`.
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
grep -qx 'User=dxpu' "$root/usr/lib/systemd/system/dxpu-host.service" ||
    { echo "deb test: dxpu-host.service does not run as dxpu" >&2; exit 1; }
for f in usr/lib/sysusers.d/dxpu.conf usr/bin/dxpu usr/lib/systemd/system/dxpu-gpu.service usr/lib/systemd/system/dxpu-host.service \
    etc/dxpu/gpu.toml.example etc/dxpu/host.toml.example usr/lib/$(uname -m)-linux-gnu/wireshark/plugins/dxpu.lua \
    usr/share/bash-completion/completions/dxpu usr/share/man/man1/dxpu.1.gz usr/share/man/man1/dxpu-gpu.1.gz \
    usr/share/man/man5/gpu.toml.5.gz usr/share/man/man5/host.toml.5.gz \
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
if command -v systemd-analyze >/dev/null; then
    for u in dxpu-gpu dxpu-host; do
        sed "s#/usr/bin/dxpu#$root/usr/bin/dxpu#" "$root/usr/lib/systemd/system/$u.service" >"$root/tmp/$u.service"
        err=$(systemd-analyze verify --man=no "$root/tmp/$u.service" 2>&1) || { echo "$err" >&2; exit 1; }
        [[ -z "$err" ]] || { echo "deb test: systemd-analyze verify $u.service: $err" >&2; exit 1; }
    done
    echo "deb test: unit files verified"
fi
dpkg -c "$deb" | wc -l | xargs echo "deb test: files in the package:"
echo "deb test: PASS"
