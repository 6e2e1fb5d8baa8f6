//! The simgpu served over vfio-user in process (`lab::served`): clients with guest memory
//! shared as a file and reached by messages both read registers and copy bytes that come
//! back whole; the server stops on drop and a second one starts beside the first's box.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lab::bulk::copy;
use lab::harness::{LocalBox, mmio_rtt};
use lab::served::Served;
use link::driver::{DriverKind, Impairment, PollMode};

#[test]
fn clients_of_the_served_simgpu_read_registers_and_copy_both_ways() {
    let (driver, poll) = (DriverKind::Portable, PollMode::Blocking);
    let gpu = LocalBox::start(driver, poll, Impairment::default()).unwrap();
    let served = Served::start(&gpu, driver, poll).unwrap();
    let mut shared = served.client(true, 3 << 20).unwrap();
    let (p50, p99) = mmio_rtt(&mut shared, 50);
    assert!(p50 > std::time::Duration::ZERO && p50 <= p99);
    let (h2d, d2h) = copy(&mut shared, 2 << 20).unwrap();
    assert!(h2d > 0.0 && d2h > 0.0);
    drop(shared);
    let mut messages = served.client(false, 1 << 20).unwrap();
    let (h2d, d2h) = copy(&mut messages, 256 << 10).unwrap();
    assert!(h2d > 0.0 && d2h > 0.0);
    drop(messages);
    drop(served);
    // The device was given back: it attaches again.
    let again = Served::start(&gpu, driver, poll).unwrap();
    let mut c = again.client(true, 1 << 20).unwrap();
    mmio_rtt(&mut c, 10);
}
