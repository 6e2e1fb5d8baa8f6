//! What the in-process run-time tests share: a key, a fresh directory, a free port.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::path::PathBuf;

pub const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A fresh directory for the test named `tag`.
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dxpu-ops-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A UDP port nobody on 127.0.0.1 holds now.
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
