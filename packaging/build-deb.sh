#!/usr/bin/env bash
# Builds the Debian package: the release binary, then the completions and man pages it
# generates from its own command line (clap_complete, clap_mangen), then `cargo deb`.
# Prints the .deb's path on its last line. Installs cargo-deb if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null 2>&1 || cargo install --locked cargo-deb --version '^2' >&2
cargo build --release -p dxpu >&2
gen=packaging/gen
rm -rf "$gen"
mkdir -p "$gen/man"
bin=target/release/dxpu
"$bin" completions bash >"$gen/dxpu.bash"
"$bin" completions zsh >"$gen/_dxpu"
"$bin" completions fish >"$gen/dxpu.fish"
"$bin" man "$gen/man"
gzip -9n "$gen"/man/*.1 "$gen"/man/*.5
# --multiarch foreign: assets under usr/lib/ go to usr/lib/<tuple>/ of the architecture built
# (the Wireshark plugin, where that architecture's Wireshark looks for Lua plugins).
cargo deb -p dxpu --no-build --multiarch foreign --output target/debian/ 2>&1 | tail -1
