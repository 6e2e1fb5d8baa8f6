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

/// The server serves one client at a time: a client asked for while another is served is
/// refused, and `Served::client` tries again until the first is gone (as a bench's next
/// client, made before the server's thread saw the last one close) — or says the refusal
/// once the wait is over.
#[test]
fn a_client_asked_for_while_another_is_served_gets_the_device_once_it_is_gone() {
    let (driver, poll) = (DriverKind::Portable, PollMode::Blocking);
    let gpu = LocalBox::start(driver, poll, Impairment::default()).unwrap();
    let served = Served::start(&gpu, driver, poll).unwrap();
    let first = served.client(true, 1 << 20).unwrap();
    let t = std::time::Instant::now();
    let ((second, got_at), dropped_at) = std::thread::scope(|s| {
        let second = s.spawn(|| (served.client(true, 1 << 20), std::time::Instant::now()));
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(first);
        let dropped_at = std::time::Instant::now();
        (second.join().unwrap(), dropped_at)
    });
    let mut second = second.expect("the second client once the first was gone");
    assert!(got_at >= dropped_at, "the second client was served beside the first");
    mmio_rtt(&mut second, 10);
    // Never free within the wait: the refusal, said.
    let e = match served.client(true, 1 << 20) {
        Ok(_) => panic!("a second client while one is served"),
        Err(e) => e.to_string(),
    };
    assert!(t.elapsed() >= lab::served::SERVER_FREE_WITHIN, "{:?}", t.elapsed());
    assert!(e.contains("connecting a client"), "{e}");
}
