//! Writes one of each attach control message as TLP bytes to a folder: seeds for the
//! `attach_control` fuzz target (`cargo run -p dxpu-bridge --example dump_control DIR`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bridge::attach::{BarInfo, Control, Origin};
use tlp::Bdf;

fn main() {
    let dir = std::env::args().nth(1).expect("usage: dump_control DIR");
    std::fs::create_dir_all(&dir).unwrap();
    let mut bars = [BarInfo::default(); 6];
    bars[0] = BarInfo { address: 1 << 40, size: 1 << 16, memory: true, is_64: true, prefetchable: false };
    let msgs = [
        Control::Attach { device: "gpu0".into(), token: None },
        Control::Attached {
            device: "gpu0".into(),
            box_id: Bdf::new(1, 0, 0),
            max_payload: 1024,
            bars,
            origin: None,
        },
        Control::Attached {
            device: "gpu0".into(),
            box_id: Bdf::new(1, 0, 0),
            max_payload: 1024,
            bars,
            origin: Some(Origin {
                vendor_id: 0x10de,
                device_id: 0x2330,
                box_name: "box-a".into(),
                pci_address: "0000:41:00.0".into(),
            }),
        },
        Control::Refused { device: "gpu0".into(), reason: "'gpu0' is attached to host 'a'".into() },
        Control::Detach { device: "gpu0".into() },
    ];
    for (i, m) in msgs.iter().enumerate() {
        std::fs::write(format!("{dir}/control{i}"), m.to_tlp(Bdf::new(0, 0, 0))).unwrap();
    }
}
