//! A real device through VFIO. Runs only where a device is bound to vfio-pci and named by
//! `DXPU_VFIO_DEVICE` (its sysfs path, e.g. /sys/bus/pci/devices/0000:41:00.0); elsewhere it
//! prints why it skipped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use hw::Device;
use hw::vfio::VfioDevice;
use tlp::{Bdf, Body, ConfigTarget, CplStatus, ParseConfig, Request, Tag, TlpRepr};

#[test]
fn config_reads_and_reset_on_a_real_device() {
    if !hw::vfio::available() {
        eprintln!("skipping: no /dev/vfio on this machine (real-device tests need VFIO)");
        return;
    }
    let Some(path) = std::env::var_os("DXPU_VFIO_DEVICE").map(PathBuf::from) else {
        eprintln!("skipping: set DXPU_VFIO_DEVICE to the sysfs path of a device bound to vfio-pci");
        return;
    };
    let mut lines = Vec::new();
    let mut dev = VfioDevice::open(&path, Bdf::new(1, 0, 0), &mut |l| lines.push(l.to_owned())).unwrap();
    assert!(lines.iter().any(|l| l.contains("hardware proxy")), "the limits are stated: {lines:?}");
    let read = TlpRepr::new(Body::CfgRead {
        req: Request { requester: Bdf::new(0, 0, 0), tag: Tag::new(1).unwrap(), first_be: 0xf, last_be: 0 },
        cfg: ConfigTarget { type1: false, target: Bdf::new(1, 0, 0), register: 0 },
    });
    dev.request(&read);
    let sent = hw::take_all(&mut dev);
    let c = TlpRepr::parse_bytes(&sent[0], &ParseConfig::default()).unwrap();
    let Body::Completion { cpl, data, .. } = c.body else { panic!("{c}") };
    assert_eq!(cpl.status, CplStatus::Success);
    let id = u32::from_le_bytes(data.unwrap().try_into().unwrap());
    let sysfs_vendor = std::fs::read_to_string(path.join("vendor")).unwrap();
    assert_eq!(format!("{:#06x}", id & 0xffff), sysfs_vendor.trim());
    dev.reset();
}
