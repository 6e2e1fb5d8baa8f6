use super::*;
use crate::driver::Datagrams;
use std::time::Duration;

/// The port is free the moment the driver is dropped, receives in flight or not: a
/// restarted endpoint binds it again at once. (The ring's own teardown is deferred by the
/// kernel and held the registered socket - and its port - for a while: binding right
/// after the drop failed with EADDRINUSE.)
#[test]
fn the_port_is_free_as_soon_as_the_driver_is_dropped() {
    for sleeping in [false, true] {
        for round in 0..20 {
            let mut u = match UringUdp::bind("127.0.0.1:0".parse().unwrap()) {
                Ok(u) => u,
                Err(e) => {
                    eprintln!("skipping: io_uring unavailable here ({e})");
                    return;
                }
            };
            let addr = u.local_addr().unwrap();
            // Receives in flight: single-shot polls while spinning, the multishot
            // receive after a wait that slept.
            u.spin();
            u.recv(&mut |_, _| {}).unwrap();
            if sleeping {
                u.wait(Some(Duration::from_millis(1))).unwrap();
                u.recv(&mut |_, _| {}).unwrap();
            }
            drop(u);
            if let Err(e) = UdpSocket::bind(addr) {
                panic!("round {round} (sleeping {sleeping}): {addr} still taken after the drop: {e}");
            }
        }
    }
}

#[test]
fn batches_round_trip_on_loopback() {
    let mut a = match UringUdp::bind("127.0.0.1:0".parse().unwrap()) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("skipping: io_uring unavailable here ({e})");
            return;
        }
    };
    let mut b = UringUdp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = b.local_addr().unwrap();
    let mut got = Vec::new();
    for i in 0..200u8 {
        a.send_to(to, &[i; 300]).unwrap();
        if i % 50 == 49 {
            a.flush().unwrap();
            // Drain between bursts, as a runner does.
            b.wait(Some(Duration::from_millis(10))).unwrap();
            b.recv(&mut |_, d| got.push(d[0])).unwrap();
        }
    }
    a.flush().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while got.len() < 200 && std::time::Instant::now() < deadline {
        b.wait(Some(Duration::from_millis(10))).unwrap();
        b.recv(&mut |from, d| {
            assert_eq!(from, a.local_addr().unwrap());
            assert_eq!(d.len(), 300);
            got.push(d[0]);
        })
        .unwrap();
        let mut ignore = |_: SocketAddr, _: &[u8]| {};
        a.recv(&mut ignore).unwrap();
    }
    assert_eq!(got, (0..200).collect::<Vec<u8>>());
}

/// Completions of receives that a send's wait reads (for its own completions) are kept
/// for `recv`: nothing received is lost to a send.
#[test]
fn datagrams_completed_while_a_send_waits_are_kept_for_recv() {
    let Ok(mut a) = UringUdp::bind("127.0.0.1:0".parse().unwrap()) else {
        eprintln!("skipping: io_uring unavailable here");
        return;
    };
    let mut b = UringUdp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    // The receiver sleeps: its multishot receive is armed.
    b.wait(Some(Duration::from_millis(1))).unwrap();
    for i in 0..5u8 {
        a.send_to(ba, &[i; 8]).unwrap();
    }
    a.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // The enter of its borrowed sends runs the receive's completions: they wait for
    // `recv`.
    b.send_borrowed(aa, &[b"one", b"two"]).unwrap();
    for i in 5..10u8 {
        a.send_to(ba, &[i; 8]).unwrap();
    }
    a.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // So do those that the wait of a send finding every slot in flight runs.
    for _ in 0..TX_SLOTS + 1 {
        b.send_to(aa, b"slot").unwrap();
    }
    b.flush().unwrap();
    let mut got = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(1);
    while got.len() < 10 && std::time::Instant::now() < end {
        b.recv(&mut |_, d| got.push(d.to_vec())).unwrap();
    }
    assert_eq!(got, (0..10u8).map(|i| vec![i; 8]).collect::<Vec<_>>());
}

/// Datagrams sent while the receiver goes from spinning (single-shot receives) to
/// sleeping (the multishot receive) and back arrive once each and in order.
#[test]
fn switching_between_spinning_and_sleeping_loses_and_reorders_nothing() {
    let Ok(mut a) = UringUdp::bind("127.0.0.1:0".parse().unwrap()) else {
        eprintln!("skipping: io_uring unavailable here");
        return;
    };
    let mut b = UringUdp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = b.local_addr().unwrap();
    let mut got = Vec::new();
    let mut next = 0u16;
    for round in 0..40 {
        // A burst, then the receiver changes mode with part of it still in the socket.
        for _ in 0..10 {
            a.send_to(to, &next.to_le_bytes()).unwrap();
            next += 1;
        }
        a.flush().unwrap();
        b.recv(&mut |_, d| got.push(u16::from_le_bytes([d[0], d[1]]))).unwrap();
        if round % 2 == 0 {
            b.wait(Some(Duration::from_millis(1))).unwrap();
            assert!(b.sleeping);
            assert_eq!(b.poll_fd(), None, "the multishot receive takes datagrams unseen");
        } else {
            b.spin();
        }
        b.recv(&mut |_, d| got.push(u16::from_le_bytes([d[0], d[1]]))).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while got.len() < next as usize && std::time::Instant::now() < deadline {
        b.recv(&mut |_, d| got.push(u16::from_le_bytes([d[0], d[1]]))).unwrap();
    }
    assert_eq!(got, (0..next).collect::<Vec<u16>>());
    // Spinning again with the multishot receive gone: the socket is the descriptor.
    b.spin();
    let end = std::time::Instant::now() + Duration::from_secs(1);
    while b.poll_fd().is_none() && std::time::Instant::now() < end {
        b.recv(&mut |_, _| {}).unwrap();
    }
    assert_eq!(b.poll_fd(), Some(b.socket.as_raw_fd()));
}
