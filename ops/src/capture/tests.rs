//! The capture writer and reader, tested: what is written reads back, both ways, bounded;
//! classic pcap and malformed files.

use super::*;

#[test]
fn a_capture_reads_back_what_was_written_both_ways_and_stops_at_its_limit() {
    let dir = std::env::temp_dir().join(format!("dxpu-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.pcapng");
    let c = Capture::create(&path, 1 << 20).unwrap();
    let tap = c.tap().unwrap();
    let a: SocketAddr = "127.0.0.1:7440".parse().unwrap();
    let b: SocketAddr = "[::1]:5000".parse().unwrap();
    let h: SocketAddr = "127.0.0.2:5001".parse().unwrap();
    (tap.0)(Direction::Sent, a, h, b"to the host");
    (tap.0)(Direction::Received, a, h, b"from the host");
    (tap.0)(Direction::Sent, b, b, &[7u8; 1001]);
    drop(tap);
    let s = c.finish().unwrap();
    assert_eq!((s.packets, s.dropped), (3, 0));
    // Cut inside the last packet (a writer killed): the packets before it still read.
    let whole = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.pcapng");
    std::fs::write(&cut, &whole[..whole.len() - 100]).unwrap();
    let (d, skipped) = read_datagrams(&cut).unwrap();
    assert!(skipped.cut_short);
    assert_eq!(d.len(), 2);
    let (d, skipped) = read_datagrams(&path).unwrap();
    assert_eq!(skipped, Skipped::default());
    assert_eq!(d.len(), 3);
    assert_eq!((d[0].src, d[0].dst, d[0].payload.as_slice()), (a, h, &b"to the host"[..]));
    assert_eq!(d[0].direction, Some(Direction::Sent));
    assert_eq!((d[1].src, d[1].dst, d[1].direction), (h, a, Some(Direction::Received)));
    assert_eq!((d[2].src, d[2].payload.len()), (b, 1001));
    assert!((d[0].time - SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()).abs() < 60.0);
    // A file that is there is refused, not truncated.
    let e = Capture::create(&path, 200).err().unwrap();
    assert!(
        matches!(&e, CaptureError::Exists { .. }) && e.to_string().contains("exists; refusing to overwrite"),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), whole);
    // A limit of one packet's worth: the rest are dropped and counted.
    let path = dir.join("limited.pcapng");
    let c = Capture::create(&path, 200).unwrap();
    let tap = c.tap().unwrap();
    for _ in 0..5 {
        (tap.0)(Direction::Sent, a, h, &[1u8; 64]);
    }
    drop(tap);
    let s = c.finish().unwrap();
    assert_eq!((s.packets, s.dropped), (1, 4));
    assert_eq!(read_datagrams(&path).unwrap().0.len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// A pcapng whose packet names an interface the file never described, and one whose
/// block is malformed (not cut short): each an error naming the file and the packet.
#[test]
fn a_packet_of_an_undescribed_interface_or_a_malformed_block_is_an_error_naming_where() {
    let dir = std::env::temp_dir().join(format!("dxpu-pcapng-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let le = |v: u32| v.to_le_bytes();
    // Section header: type, length 28, byte-order magic, version 1.0, section length -1.
    let mut shb = Vec::new();
    for w in [0x0a0d_0d0a, 28, 0x1a2b_3c4d, 1] {
        shb.extend_from_slice(&le(w));
    }
    shb.extend_from_slice(&[0xff; 8]);
    shb.extend_from_slice(&le(28));
    // An enhanced packet of no bytes on interface 3.
    let mut file = shb.clone();
    for w in [6, 32, 3, 0, 0, 0, 0, 32] {
        file.extend_from_slice(&le(w));
    }
    let path = dir.join("no-interface.pcapng");
    std::fs::write(&path, &file).unwrap();
    match read_datagrams(&path) {
        Err(e @ ReadError::NoInterface { packet: 1, interface: 3, .. }) => {
            assert!(e.to_string().contains("no-interface.pcapng"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A block whose two length fields disagree.
    let mut file = shb;
    for w in [6, 32, 0, 0, 0, 0, 0, 36] {
        file.extend_from_slice(&le(w));
    }
    let path = dir.join("malformed.pcapng");
    std::fs::write(&path, &file).unwrap();
    match read_datagrams(&path) {
        Err(e @ ReadError::Malformed { .. }) => {
            assert!(e.to_string().contains("block after packet 0"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A classic pcap of Linux cooked frames (what `tcpdump -i any -w` writes) reads too.
#[test]
fn a_classic_pcap_of_cooked_frames_reads() {
    let dir = std::env::temp_dir().join(format!("dxpu-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.pcap");
    let header = pcap_file::pcap::PcapHeader { datalink: DataLink::LINUX_SLL, ..Default::default() };
    let mut w = pcap_file::pcap::PcapWriter::with_header(File::create(&path).unwrap(), header).unwrap();
    let eth = encapsulate_udp("10.1.0.1:7440".parse().unwrap(), "10.1.0.2:40000".parse().unwrap(), b"dxpu");
    // SLL: packet type, ARPHRD, address length, address [8], then the EtherType.
    let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0, 0, 0];
    sll.extend_from_slice(&eth[12..]);
    let p = pcap_file::pcap::PcapPacket::new(Duration::from_secs(1_700_000_000), sll.len() as u32, &sll);
    w.write_packet(&p).unwrap();
    // A packet that is no UDP (ARP) is counted, not decoded.
    let mut arp = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x06];
    arp.extend_from_slice(&[0; 28]);
    w.write_packet(&pcap_file::pcap::PcapPacket::new(Duration::ZERO, arp.len() as u32, &arp)).unwrap();
    drop(w);
    let (d, skipped) = read_datagrams(&path).unwrap();
    assert_eq!(skipped.not_udp, 1);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].src.port(), d[0].dst.port(), d[0].payload.as_slice()), (7440, 40000, &b"dxpu"[..]));
    assert_eq!((d[0].time, d[0].direction), (1_700_000_000.0, None));
    // A function that stops the reading: its own error, untouched.
    match each_datagram(&path, &mut |_| Err("enough")) {
        Err(ReadError::Stopped(e)) => assert_eq!(e, "enough"),
        other => panic!("{other:?}"),
    }
    // Not a capture at all.
    std::fs::write(&path, b"hello, world").unwrap();
    let e = read_datagrams(&path).unwrap_err();
    assert!(matches!(e, ReadError::NotCapture { .. }), "{e:?}");
    assert!(e.to_string().contains("not a pcapng or pcap file"), "{e}");
    std::fs::write(&path, b"he").unwrap();
    assert!(matches!(read_datagrams(&path), Err(ReadError::Short { .. })));
    // No file.
    let _ = std::fs::remove_file(&path);
    assert!(matches!(read_datagrams(&path), Err(ReadError::Io { .. })));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn checksums_are_the_internet_checksum() {
    // RFC 1071's example bytes.
    assert_eq!(checksum(&[&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]), !0xddf2);
    let f = encapsulate_udp("10.0.0.1:1".parse().unwrap(), "10.0.0.2:2".parse().unwrap(), b"x");
    // The IPv4 header checks to zero with its checksum in place.
    assert_eq!(checksum(&[&f[14..34]]), 0);
    let (s, d, p) = udp_of(DataLink::ETHERNET, &f).unwrap();
    assert_eq!((s.port(), d.port(), p), (1, 2, &b"x"[..]));
    assert_eq!(udp_of(DataLink::ETHERNET, &f[..20]), None, "cut short");
}
