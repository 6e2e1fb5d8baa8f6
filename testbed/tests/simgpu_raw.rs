//! The simgpu's device model driven TLP by TLP, without a driver: register writes and the
//! completions of its reads handed in by hand, what it sends looked at — its command
//! fetches ahead of need, copies in overlapping their reads, failed reads, the ring's wrap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::{DriverError, SimGpuDriver, WaitMode};
use hw::simgpu::SimGpuParams;
use hw::{Device, SimGpu};
use simgpu_abi::{err, op, reg};
use testbed::direct::DirectAttach;
use testbed::suite::pattern;
use tlp::Bdf;

/// What a raw device sent, taken after each call and emitted: the tests play the platform.
#[derive(Default)]
struct Sent(Vec<Vec<u8>>);

/// A device's calls with what it sends taken into a [`Sent`].
trait Played {
    fn request_to(&mut self, t: &tlp::TlpRepr<'_>, up: &mut Sent);
    fn completion_to(&mut self, t: &tlp::TlpRepr<'_>, up: &mut Sent);
    fn poll_to(&mut self, up: &mut Sent) -> bool;
}

impl<D: Device> Played for D {
    fn request_to(&mut self, t: &tlp::TlpRepr<'_>, up: &mut Sent) {
        self.request(t);
        up.0.extend(hw::take_all(self));
    }
    fn completion_to(&mut self, t: &tlp::TlpRepr<'_>, up: &mut Sent) {
        self.completion(t);
        up.0.extend(hw::take_all(self));
    }
    fn poll_to(&mut self, up: &mut Sent) -> bool {
        let did = self.poll();
        up.0.extend(hw::take_all(self));
        did
    }
}

/// A directly attached simgpu with its driver, for the tests that need one beside the raw
/// device.
fn open() -> SimGpuDriver<DirectAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(DirectAttach::new(dev, 64 << 20)).unwrap()
}

/// A raw simgpu, bus master, its ring at `RAW_RING` holding `commands` (opcode and arguments
/// a, b, c), published and fetched: the test plays the platform from there.
fn raw_simgpu_running(commands: &[(u32, [u64; 3])]) -> (SimGpu, Sent) {
    use tlp::{ConfigTarget, ParseConfig, Request, Tag, TlpRepr};
    let mut dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let mut up = Sent::default();
    let req = Request { requester: RAW_HOST, tag: Tag::new(1).unwrap(), first_be: 0xf, last_be: 0 };
    for (register, v) in [(0x10u16, RAW_BAR0 as u32), (0x04, 0x6)] {
        let d = v.to_le_bytes();
        let cfg = ConfigTarget { type1: false, target: Bdf::new(1, 0, 0), register };
        dev.request_to(&TlpRepr::new(tlp::Body::CfgWrite { req, cfg, data: &d }), &mut up);
    }
    for (off, v) in [(reg::RING_BASE, RAW_RING), (reg::RING_SIZE, 8), (reg::RING_TAIL, commands.len() as u64)]
    {
        raw_write_reg(&mut dev, &mut up, off, v);
    }
    up.0.clear();
    assert!(dev.poll_to(&mut up));
    let fetch = up.0.pop().unwrap();
    let fetch = TlpRepr::parse_bytes(&fetch, &ParseConfig::default()).unwrap();
    assert_eq!(fetch.address(), Some(RAW_RING));
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(commands));
    (dev, up)
}

/// Ring entries: opcode and arguments a, b, c.
fn raw_ring(commands: &[(u32, [u64; 3])]) -> Vec<u8> {
    use hw::simgpu_device::COMMAND_BYTES;
    let mut ring = vec![0u8; commands.len() * COMMAND_BYTES as usize];
    for (i, (opcode, args)) in commands.iter().enumerate() {
        let at = i * COMMAND_BYTES as usize;
        ring[at..at + 4].copy_from_slice(&opcode.to_le_bytes());
        for (j, v) in args.iter().enumerate() {
            ring[at + 8 + 8 * j..at + 16 + 8 * j].copy_from_slice(&v.to_le_bytes());
        }
    }
    ring
}

/// A posted write of register `off` of BAR0, as the host sends it.
fn raw_write_reg(dev: &mut SimGpu, up: &mut Sent, off: u64, v: u64) {
    use tlp::{Address, Body, Request, Tag, TlpRepr};
    let req = Request { requester: RAW_HOST, tag: Tag::new(1).unwrap(), first_be: 0xf, last_be: 0xf };
    let d = v.to_le_bytes();
    dev.request_to(
        &TlpRepr::new(Body::MemWrite { req, address: Address::new(RAW_BAR0 + off), ph: 0, data: &d }),
        up,
    );
}

/// Completes the read `read` with `data`, all of it.
fn raw_complete_with(dev: &mut SimGpu, up: &mut Sent, read: &tlp::TlpRepr<'_>, data: &[u8]) {
    let n = data.len() as u16;
    let chunk =
        tlp::rules::CompletionChunk { byte_count: n, lower_address: 0, data_offset: 0, length_dw: n / 4 };
    dev.completion_to(&tlp::rules::completion_with_data(read, RAW_HOST, &chunk, data), up);
}

const RAW_HOST: Bdf = Bdf::new(0, 0, 0);
const RAW_BAR0: u64 = 0xfe00_0000;
const RAW_RING: u64 = 0x1_0000_0000;

/// A read the device sent: its address, length and bytes.
type SentRead = (u64, u64, Vec<u8>);

/// Polls the device `polls` times and takes the reads it sent (what else it sent stays).
fn raw_reads(dev: &mut SimGpu, up: &mut Sent, polls: usize) -> Vec<SentRead> {
    use tlp::{Body, ParseConfig, TlpRepr};
    for _ in 0..polls {
        dev.poll_to(up);
    }
    let (reads, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut up.0).into_iter().partition(|b| {
        TlpRepr::parse_bytes(b, &ParseConfig::default()).is_ok_and(|t| matches!(t.body, Body::MemRead { .. }))
    });
    up.0 = rest;
    reads
        .into_iter()
        .map(|b| {
            let t = TlpRepr::parse_bytes(&b, &ParseConfig::default()).unwrap();
            let Body::MemRead { address, length_dw, .. } = t.body else { unreachable!() };
            (address.value(), length_dw as u64 * 4, b.clone())
        })
        .collect()
}

/// Completes `reads` with `fill` bytes, or with Unsupported Request where `fill` is `None`.
fn raw_complete(dev: &mut SimGpu, up: &mut Sent, reads: &[SentRead], fill: Option<u8>) {
    use tlp::{CplStatus, ParseConfig, TlpRepr, rules};
    for (_, len, b) in reads {
        let r = TlpRepr::parse_bytes(b, &ParseConfig::default()).unwrap();
        match fill {
            Some(fill) => raw_complete_with(dev, up, &r, &vec![fill; *len as usize]),
            None => dev.completion_to(
                &rules::completion_without_data(&r, RAW_HOST, CplStatus::UnsupportedRequest),
                up,
            ),
        }
    }
}

/// Bytes `reads` ask for from host addresses `base..base + 8 KiB`.
fn raw_read_from(reads: &[SentRead], base: u64) -> u64 {
    reads.iter().filter(|r| (base..base + 8192).contains(&r.0)).map(|r| r.1).sum()
}

/// Register `off` of BAR0, read as the host would.
fn raw_reg(dev: &mut SimGpu, off: u64) -> u64 {
    use tlp::{Address, Body, ParseConfig, Request, Tag, TlpRepr};
    let mut q = Sent::default();
    let read = TlpRepr::new(Body::MemRead {
        req: Request { requester: RAW_HOST, tag: Tag::new(3).unwrap(), first_be: 0xf, last_be: 0xf },
        address: Address::new(RAW_BAR0 + off),
        ph: 0,
        length_dw: 2,
        locked: false,
    });
    dev.request_to(&read, &mut q);
    let c = TlpRepr::parse_bytes(&q.0[0], &ParseConfig::default()).unwrap();
    let Body::Completion { data: Some(d), .. } = c.body else { panic!("{c:?}") };
    u64::from_le_bytes(d[..8].try_into().unwrap())
}

fn raw_busy(dev: &mut SimGpu) -> bool {
    raw_reg(dev, reg::STATUS) & 1 == 1
}

/// Whether the device wrote the fence word at `at`.
fn raw_fence_written(up: &Sent, at: u64) -> bool {
    use tlp::{Body, ParseConfig, TlpRepr};
    up.0.iter().any(|b| {
        TlpRepr::parse_bytes(b, &ParseConfig::default())
            .is_ok_and(|t| matches!(t.body, Body::MemWrite { address, .. } if address.value() == at))
    })
}

/// Host→VRAM copies queued back to back keep the link full across them: the next copy's
/// reads go out while the one before's are still in flight; a copy into VRAM that one in
/// flight still writes waits for its bytes to land, and so does anything else (a FENCE).
/// STATUS says busy while any read is out. The test plays the platform and holds the
/// completions. The device counts the waits a link would impose (fetch, overlapping copy,
/// fence) and not the back-to-back start.
#[test]
fn copies_in_back_to_back_overlap_their_reads_unless_their_vram_does() {
    // A: 8 KiB into VRAM 0; B: 8 KiB into 64 KiB (beside A); C: 4 KiB into 4 KiB (inside A);
    // then a FENCE.
    let (a, b, c, fence) = (0x2_0000_0000u64, 0x2_0001_0000u64, 0x2_0002_0000u64, 0x3_0000_0000u64);
    let commands = [
        (op::COPY_H2V, [a, 0, 8192]),
        (op::COPY_H2V, [b, 0x1_0000, 8192]),
        (op::COPY_H2V, [c, 0x1000, 4096]),
        (op::FENCE, [fence, 7, 0]),
    ];
    let fresh = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default()).reads_waited_on().unwrap();
    let (mut dev, mut up) = raw_simgpu_running(&commands);
    let first = raw_reads(&mut dev, &mut up, 20);
    assert_eq!(raw_read_from(&first, a), 8192, "A's reads all out");
    assert_eq!(raw_read_from(&first, b), 8192, "B's reads out while A's are in flight");
    assert_eq!(raw_read_from(&first, c), 0, "C writes VRAM A still writes: it waits");
    assert!(raw_busy(&mut dev), "busy while reads are in flight");
    // A's and B's completions: A's bytes land, and C starts.
    raw_complete(&mut dev, &mut up, &first, Some(0xaa));
    let second = raw_reads(&mut dev, &mut up, 20);
    assert_eq!(raw_read_from(&second, c), 4096, "C goes once A's bytes are in");
    // The FENCE waits for C's bytes.
    assert!(!raw_fence_written(&up, fence), "the fence before C's bytes landed");
    raw_complete(&mut dev, &mut up, &second, Some(0xcc));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert!(raw_fence_written(&up, fence), "the fence once every copy landed");
    assert!(!raw_busy(&mut dev));
    // The fetch, C's wait for A, the fence's wait for C: three; B's start is not one.
    assert_eq!(dev.reads_waited_on().unwrap() - fresh, 3);
}

/// A read of one copy failing while the next copy's reads are out: ERROR = 3 and its
/// interrupt, the copies in flight with it end, and the device goes on to the FENCE once the
/// rest of their reads are answered (a later copy then runs as usual).
#[test]
fn a_failed_read_beside_a_back_to_back_copy_ends_both_and_the_device_goes_on() {
    let (a, b, d, fence) = (0x2_0000_0000u64, 0x2_0001_0000u64, 0x2_0002_0000u64, 0x3_0000_0000u64);
    let commands = [
        (op::COPY_H2V, [a, 0, 8192]),
        (op::COPY_H2V, [b, 0x1_0000, 8192]),
        (op::FENCE, [fence, 1, 0]),
        (op::COPY_H2V, [d, 0x2_0000, 8192]),
        (op::FENCE, [fence, 2, 0]),
    ];
    let (mut dev, mut up) = raw_simgpu_running(&commands);
    let out = raw_reads(&mut dev, &mut up, 20);
    assert_eq!((raw_read_from(&out, a), raw_read_from(&out, b)), (8192, 8192));
    // A's first read fails; the rest are answered.
    raw_complete(&mut dev, &mut up, &out[..1], None);
    raw_complete(&mut dev, &mut up, &out[1..], Some(0x55));
    let later = raw_reads(&mut dev, &mut up, 20);
    assert_eq!(raw_read_from(&later, d), 8192, "the copy after the fence runs");
    assert!(raw_fence_written(&up, fence), "the first fence, after the failed copies");
    raw_complete(&mut dev, &mut up, &later, Some(0x66));
    up.0.clear();
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert!(raw_fence_written(&up, fence), "the second fence");
    assert_eq!(raw_reg(&mut dev, reg::ERROR), err::DMA);
    assert!(raw_reg(&mut dev, reg::INT_STATUS) & 2 != 0, "the error interrupt's status bit");
}

/// `memcpy_to_device_async` returns once the bytes are staged: the caller's buffer is
/// reused at once, copies queued past the staging buffer's end wait for it to drain, copies
/// into the same VRAM land in the order queued, and a later read sees every one.
#[test]
fn async_copies_in_are_staged_ordered_and_survive_the_staging_buffer_filling() {
    let mut d = open();
    let piece = 64 << 10;
    let mut buf = vec![0u8; piece];
    let waits = |d: &SimGpuDriver<DirectAttach<SimGpu>>| d.stats().waits_polled;
    let before = waits(&d);
    // 80 pieces, 5 MiB: more than the 4 MiB staging buffer holds at once. The first 64 fit
    // and wait for nothing; a later one finds it full and waits for the device to drain it.
    for i in 0..80u8 {
        if i == 64 {
            assert_eq!(waits(&d), before, "a copy that fitted waited for the device");
        }
        buf.fill(i);
        d.memcpy_to_device_async(i as u64 * piece as u64, &buf).unwrap();
    }
    assert_eq!(waits(&d), before + 1, "the full staging buffer drained once");
    // The same VRAM twice: the later copy wins.
    d.memcpy_to_device_async(0, &pattern(piece, 3)).unwrap();
    d.memcpy_to_device_async(0, &pattern(piece, 4)).unwrap();
    let mut out = vec![0u8; piece];
    d.memcpy_from_device(0, &mut out).unwrap();
    assert!(out == pattern(piece, 4), "the later copy into the same VRAM");
    for i in 1..80u8 {
        d.memcpy_from_device(i as u64 * piece as u64, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == i), "piece {i}");
    }
}

/// A host→VRAM copy whose VRAM lies past the end (at the top of the 64-bit range, where a
/// range's end overflows), queued behind a copy still landing: refused with ERROR = 2 as
/// ever, no panic, and the FENCE after it still waits for the first copy's bytes.
#[test]
fn a_copy_past_vram_beside_a_landing_copy_is_refused_and_the_fence_still_waits() {
    let (a, fence) = (0x2_0000_0000u64, 0x3_0000_0000u64);
    let commands =
        [(op::COPY_H2V, [a, 0, 8192]), (op::COPY_H2V, [a, u64::MAX - 10, 8192]), (op::FENCE, [fence, 1, 0])];
    let (mut dev, mut up) = raw_simgpu_running(&commands);
    let out = raw_reads(&mut dev, &mut up, 20);
    assert_eq!(raw_read_from(&out, a), 8192, "only the first copy reads");
    assert!(!raw_fence_written(&up, fence), "the fence before the first copy landed");
    raw_complete(&mut dev, &mut up, &out, Some(0x11));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert!(raw_fence_written(&up, fence));
    assert_eq!(raw_reg(&mut dev, reg::ERROR), err::BAD_ARGUMENT);
}

/// The values the device wrote to the fence word at `at`, in order.
fn raw_fences(up: &Sent, at: u64) -> Vec<u64> {
    use tlp::{Body, ParseConfig, TlpRepr};
    up.0.iter()
        .filter_map(|b| match TlpRepr::parse_bytes(b, &ParseConfig::default()).ok()?.body {
            Body::MemWrite { address, data, .. } if address.value() == at => {
                Some(u64::from_le_bytes(data.get(..8)?.try_into().ok()?))
            }
            _ => None,
        })
        .collect()
}

/// Ring reads among `reads`: those of the ring at `ring` (its 8 slots).
fn raw_ring_reads(reads: &[SentRead], ring: u64) -> Vec<&SentRead> {
    reads.iter().filter(|r| (ring..ring + 8 * 64).contains(&r.0)).collect()
}

const RAW_FENCE: u64 = 0x3_0000_0000;
const RAW_OUT: u64 = 0x4_0000_0000;

/// A raw simgpu executing a 1 MiB COPY_V2H (16 polls' worth) from ring slot 0, with
/// FENCE 1 and FENCE 2 published into slots 1 and 2 while it runs; the reads it sent then.
fn raw_busy_then_published() -> (SimGpu, Sent, Vec<SentRead>) {
    let (mut dev, mut up) = raw_simgpu_running(&[(op::COPY_V2H, [0, RAW_OUT, 1 << 20])]);
    assert!(raw_reads(&mut dev, &mut up, 2).is_empty(), "a copy out reads nothing");
    assert!(raw_busy(&mut dev));
    raw_write_reg(&mut dev, &mut up, reg::RING_TAIL, 3);
    let reads = raw_reads(&mut dev, &mut up, 1);
    (dev, up, reads)
}

const RAW_FENCES_1_2: [(u32, [u64; 3]); 2] = [(op::FENCE, [RAW_FENCE, 1, 0]), (op::FENCE, [RAW_FENCE, 2, 0])];

/// Entries published while a command executes are fetched ahead, as a GPU's front end
/// reads its pushbuffer: the ring read goes out at once (not when the command ends), and
/// when it lands before the processor gets there, the link costs the processor nothing — the
/// device counts one round trip (the first fetch), not two. The entries run in order, once.
#[test]
fn entries_published_while_the_device_works_are_fetched_ahead() {
    let fresh = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default()).reads_waited_on().unwrap();
    let (mut dev, mut up, reads) = raw_busy_then_published();
    let ring = raw_ring_reads(&reads, RAW_RING);
    assert_eq!(ring.len(), 1, "one ring read while the copy runs: {reads:?}");
    assert_eq!((ring[0].0, ring[0].1), (RAW_RING + 64, 128), "slots 1 and 2");
    let fetch = tlp::TlpRepr::parse_bytes(&ring[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&RAW_FENCES_1_2));
    assert!(raw_fences(&up, RAW_FENCE).is_empty(), "the fences wait for the copy before them");
    assert!(raw_reads(&mut dev, &mut up, 40).is_empty(), "nothing fetched twice");
    assert_eq!(raw_fences(&up, RAW_FENCE), [1, 2]);
    assert!(!raw_busy(&mut dev));
    assert_eq!(raw_reg(&mut dev, reg::RING_HEAD), 3);
    assert_eq!(dev.reads_waited_on().unwrap() - fresh, 1, "the fetch ahead landed in time");
    assert_eq!(dev.command_fetches(), 2);
}

/// The read request `r` sent.
fn raw_parse(r: &SentRead) -> tlp::TlpRepr<'_> {
    tlp::TlpRepr::parse_bytes(&r.2, &tlp::ParseConfig::default()).unwrap()
}

/// Entries published while a fetch ahead is still out are fetched with a read of their own
/// beside it, not after it lands — launches faster than one a round trip each pay one round
/// trip — and run in ring order whichever read lands first.
#[test]
fn entries_published_while_a_fetch_ahead_is_out_get_a_read_of_their_own_beside_it() {
    let (mut dev, mut up, reads) = raw_busy_then_published();
    let first: Vec<SentRead> = raw_ring_reads(&reads, RAW_RING).into_iter().cloned().collect();
    assert_eq!(first.len(), 1);
    raw_write_reg(&mut dev, &mut up, reg::RING_TAIL, 5);
    let second: Vec<SentRead> =
        raw_ring_reads(&raw_reads(&mut dev, &mut up, 1), RAW_RING).into_iter().cloned().collect();
    assert_eq!(
        second.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        [(RAW_RING + 3 * 64, 128)],
        "slots 3 and 4"
    );
    raw_write_reg(&mut dev, &mut up, reg::RING_TAIL, 6);
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty(), "two ring reads in flight at most");
    // The second lands first.
    let fences_3_4 = [(op::FENCE, [RAW_FENCE, 3, 0]), (op::FENCE, [RAW_FENCE, 4, 0])];
    raw_complete_with(&mut dev, &mut up, &raw_parse(&second[0]), &raw_ring(&fences_3_4));
    assert!(raw_fences(&up, RAW_FENCE).is_empty(), "nothing runs before the copy and slots 1 and 2");
    raw_complete_with(&mut dev, &mut up, &raw_parse(&first[0]), &raw_ring(&RAW_FENCES_1_2));
    // Slot 5, published meanwhile, is read once the processor gets near it.
    let third: Vec<SentRead> =
        raw_ring_reads(&raw_reads(&mut dev, &mut up, 40), RAW_RING).into_iter().cloned().collect();
    assert_eq!(third.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(RAW_RING + 5 * 64, 64)], "slot 5");
    raw_complete_with(&mut dev, &mut up, &raw_parse(&third[0]), &raw_ring(&[(op::FENCE, [RAW_FENCE, 5, 0])]));
    assert!(raw_reads(&mut dev, &mut up, 40).is_empty(), "nothing fetched twice");
    assert_eq!(raw_fences(&up, RAW_FENCE), [1, 2, 3, 4, 5]);
    assert_eq!(raw_reg(&mut dev, reg::RING_HEAD), 6);
    assert_eq!(dev.command_fetches(), 4);
}

/// The first of two ring reads in flight fails; the second lands after: the failure is
/// reported, the entry at its start dropped, and what the second brought is not trusted
/// either — the entries after the failed one are read again, once the second has landed (it
/// would otherwise land over the new read).
#[test]
fn a_failed_fetch_beside_a_second_is_reported_and_the_entries_after_it_read_again() {
    let (mut dev, mut up, reads) = raw_busy_then_published();
    let first: Vec<SentRead> = raw_ring_reads(&reads, RAW_RING).into_iter().cloned().collect();
    raw_write_reg(&mut dev, &mut up, reg::RING_TAIL, 5);
    let second: Vec<SentRead> =
        raw_ring_reads(&raw_reads(&mut dev, &mut up, 1), RAW_RING).into_iter().cloned().collect();
    assert_eq!(second.len(), 1, "a second read beside the first");
    raw_complete(&mut dev, &mut up, &first, None);
    // The copy runs out; the processor reaches the failed slot while the second is out: no
    // new read until it lands.
    assert!(raw_ring_reads(&raw_reads(&mut dev, &mut up, 40), RAW_RING).is_empty());
    let fences_3_4 = [(op::FENCE, [RAW_FENCE, 3, 0]), (op::FENCE, [RAW_FENCE, 4, 0])];
    raw_complete_with(&mut dev, &mut up, &raw_parse(&second[0]), &raw_ring(&fences_3_4));
    let again: Vec<SentRead> =
        raw_ring_reads(&raw_reads(&mut dev, &mut up, 40), RAW_RING).into_iter().cloned().collect();
    assert_eq!(
        again.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        [(RAW_RING + 128, 192)],
        "slots 2 to 4 again"
    );
    let fences_2_4 =
        [(op::FENCE, [RAW_FENCE, 2, 0]), (op::FENCE, [RAW_FENCE, 3, 0]), (op::FENCE, [RAW_FENCE, 4, 0])];
    raw_complete_with(&mut dev, &mut up, &raw_parse(&again[0]), &raw_ring(&fences_2_4));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert_eq!(raw_fences(&up, RAW_FENCE), [2, 3, 4], "slot 1 dropped, each after it run once");
    assert_eq!(raw_reg(&mut dev, reg::ERROR), err::DMA);
    assert_eq!(raw_reg(&mut dev, reg::RING_HEAD), 5);
}

/// A fetch ahead that has not landed when the processor gets to it is waited for, and
/// counted as the round trip the link makes the device wait — once.
#[test]
fn a_fetch_ahead_still_in_flight_is_waited_for_and_counted_once() {
    let fresh = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default()).reads_waited_on().unwrap();
    let (mut dev, mut up, reads) = raw_busy_then_published();
    let ring = raw_ring_reads(&reads, RAW_RING);
    assert_eq!(ring.len(), 1);
    assert!(raw_reads(&mut dev, &mut up, 40).is_empty());
    assert!(raw_fences(&up, RAW_FENCE).is_empty(), "no fence before its entry is in");
    assert!(raw_busy(&mut dev), "busy while the ring read is out");
    let fetch = tlp::TlpRepr::parse_bytes(&ring[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&RAW_FENCES_1_2));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert_eq!(raw_fences(&up, RAW_FENCE), [1, 2]);
    assert_eq!(dev.reads_waited_on().unwrap() - fresh, 2, "the first fetch and the one waited for");
}

/// A fetch ahead answered with Unsupported Request: ERROR = 3 and its interrupt, the entry
/// at its start dropped as a failed fetch's is, and the ones after it fetched again and run.
#[test]
fn a_failed_fetch_ahead_is_reported_and_the_entries_after_it_fetched_again() {
    let (mut dev, mut up, reads) = raw_busy_then_published();
    let ring: Vec<SentRead> = raw_ring_reads(&reads, RAW_RING).into_iter().cloned().collect();
    assert_eq!(ring.len(), 1);
    raw_complete(&mut dev, &mut up, &ring, None);
    let again = raw_reads(&mut dev, &mut up, 40);
    let again: Vec<SentRead> = raw_ring_reads(&again, RAW_RING).into_iter().cloned().collect();
    assert_eq!(again.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(RAW_RING + 128, 64)], "slot 2 again");
    let fetch = tlp::TlpRepr::parse_bytes(&again[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&RAW_FENCES_1_2[1..]));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert_eq!(raw_fences(&up, RAW_FENCE), [2], "slot 1 dropped, slot 2 run");
    assert_eq!(raw_reg(&mut dev, reg::ERROR), err::DMA);
    assert!(raw_reg(&mut dev, reg::INT_STATUS) & 2 != 0, "the error interrupt's status bit");
    assert_eq!(raw_reg(&mut dev, reg::RING_HEAD), 3);
}

/// A fetch ahead stops at the ring's end (slots 6 and 7 of 8, published with the tail
/// wrapped to 1); slot 0 is read from the ring's start when the processor gets there.
#[test]
fn a_fetch_ahead_stops_at_the_ring_end_and_the_wrap_is_read_from_the_start() {
    let mut commands = vec![(op::NOP, [0; 3]); 5];
    commands.push((op::COPY_V2H, [0, RAW_OUT, 1 << 20]));
    let (mut dev, mut up) = raw_simgpu_running(&commands);
    for _ in 0..20 {
        if raw_reg(&mut dev, reg::RING_HEAD) == 5 {
            break;
        }
        dev.poll_to(&mut up);
    }
    assert!(raw_reads(&mut dev, &mut up, 1).is_empty());
    assert_eq!(raw_reg(&mut dev, reg::RING_HEAD), 5, "the copy in slot 5 runs");
    raw_write_reg(&mut dev, &mut up, reg::RING_TAIL, 1);
    let reads = raw_reads(&mut dev, &mut up, 1);
    let ahead: Vec<SentRead> = raw_ring_reads(&reads, RAW_RING).into_iter().cloned().collect();
    assert_eq!(ahead.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(RAW_RING + 6 * 64, 128)]);
    let fences =
        [(op::FENCE, [RAW_FENCE, 6, 0]), (op::FENCE, [RAW_FENCE, 7, 0]), (op::FENCE, [RAW_FENCE, 8, 0])];
    let fetch = tlp::TlpRepr::parse_bytes(&ahead[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&fences[..2]));
    let start = raw_reads(&mut dev, &mut up, 40);
    let start: Vec<SentRead> = raw_ring_reads(&start, RAW_RING).into_iter().cloned().collect();
    assert_eq!(start.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(RAW_RING, 64)], "slot 0");
    assert_eq!(raw_fences(&up, RAW_FENCE), [6, 7]);
    let fetch = tlp::TlpRepr::parse_bytes(&start[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&fences[2..]));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert_eq!(raw_fences(&up, RAW_FENCE), [6, 7, 8]);
    assert_eq!(raw_reg(&mut dev, reg::RING_HEAD), 1);
}

/// The ring moved (RING_BASE written) while a fetch ahead of the old one is in flight: what
/// it brings is never executed; the processor waits for it to land, then reads the new ring.
#[test]
fn a_fetch_ahead_of_a_ring_since_moved_is_never_executed() {
    const MOVED: u64 = 0x1_8000_0000;
    let (mut dev, mut up, reads) = raw_busy_then_published();
    let stale: Vec<SentRead> = raw_ring_reads(&reads, RAW_RING).into_iter().cloned().collect();
    assert_eq!(stale.len(), 1);
    raw_write_reg(&mut dev, &mut up, reg::RING_BASE, MOVED);
    // The copy runs to its end; the processor reads nothing while the old read is out.
    assert!(raw_reads(&mut dev, &mut up, 40).is_empty());
    let old = [(op::FENCE, [RAW_FENCE, 99, 0]), (op::FENCE, [RAW_FENCE, 99, 0])];
    let fetch = tlp::TlpRepr::parse_bytes(&stale[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&old));
    let new = raw_reads(&mut dev, &mut up, 5);
    let new: Vec<SentRead> = raw_ring_reads(&new, MOVED).into_iter().cloned().collect();
    assert_eq!(new.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(MOVED + 64, 128)], "slots 1 and 2");
    let fetch = tlp::TlpRepr::parse_bytes(&new[0].2, &tlp::ParseConfig::default()).unwrap();
    raw_complete_with(&mut dev, &mut up, &fetch, &raw_ring(&RAW_FENCES_1_2));
    assert!(raw_reads(&mut dev, &mut up, 5).is_empty());
    assert_eq!(raw_fences(&up, RAW_FENCE), [1, 2], "the new ring's entries, not the old read's");
}

mod channels {
    //! Command channels, timed kernels, semaphores and timestamps (docs/simgpu.md,
    //! *Channels*), on a device running on its own thread as a GPU does.
    use super::*;
    use driver::{Command, PciFunction};
    use hw::device::now_ns;
    use simgpu_abi::{CHANNELS, sem};
    use std::time::{Duration, Instant};
    use testbed::concurrent::ConcurrentAttach;

    fn open_concurrent() -> SimGpuDriver<ConcurrentAttach<SimGpu>> {
        let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
        SimGpuDriver::open(ConcurrentAttach::new(dev, 64 << 20).unwrap()).unwrap()
    }

    fn cmd(opcode: u32, args: [u64; 3]) -> Command {
        Command { opcode, args: [args[0], args[1], args[2], 0, 0] }
    }

    /// The (value, begin, end) a timestamped release wrote at `at` of `buf`.
    fn stamp<P: driver::PciFunction>(
        d: &mut SimGpuDriver<P>,
        buf: &driver::DmaBuf,
        at: usize,
    ) -> (u64, u64, u64) {
        let mut b = [0u8; 24];
        d.pci().dma_read(buf, at, &mut b);
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        (w(0), w(1), w(2))
    }

    fn wait_for<P: driver::PciFunction>(
        d: &mut SimGpuDriver<P>,
        buf: &driver::DmaBuf,
        at: usize,
    ) -> (u64, u64, u64) {
        let t = Instant::now();
        loop {
            let s = stamp(d, buf, at);
            if s.0 != 0 {
                return s;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "release at {at} never came");
        }
    }

    #[test]
    fn timed_kernels_on_two_channels_overlap_and_last_their_time() {
        let mut d = open_concurrent();
        assert_eq!(d.channels(), CHANNELS);
        d.open_channel(1, 64).unwrap();
        d.open_channel(2, 64).unwrap();
        let slots = d.pin(4096).unwrap();
        d.pci().dma_write(&slots, 0, &[0; 4096]);
        let t0 = now_ns();
        for (ch, at) in [(1usize, 0u64), (2, 64)] {
            d.enqueue_on(ch, cmd(op::TIMED, [20_000_000, 0, 0])).unwrap();
            d.enqueue_on(ch, cmd(op::SEM_RELEASE, [slots.bus.get() + at, 7, sem::TIMESTAMPS])).unwrap();
            d.flush_on(ch);
        }
        let a = wait_for(&mut d, &slots, 0);
        let b = wait_for(&mut d, &slots, 64);
        let elapsed = now_ns() - t0;
        for (v, begin, end) in [a, b] {
            assert_eq!(v, 7);
            assert!(begin >= t0 && end - begin >= 20_000_000, "{begin} {end}");
            assert!(end - begin < 30_000_000, "a 20 ms kernel took {} ns", end - begin);
        }
        // Concurrent: both within one kernel's time of each other, not one after the other.
        assert!(a.1.abs_diff(b.1) < 5_000_000, "{a:?} {b:?}");
        assert!(elapsed < 38_000_000, "two 20 ms kernels on two channels took {elapsed} ns");
    }

    #[test]
    fn an_acquire_holds_its_channel_until_the_release_on_another() {
        let mut d = open_concurrent();
        d.open_channel(1, 64).unwrap();
        d.open_channel(3, 64).unwrap();
        let slots = d.pin(4096).unwrap();
        d.pci().dma_write(&slots, 0, &[0; 4096]);
        let semaphore = 0x100_0000u64;
        d.launch(op::FILL, [semaphore, 64, 0, 0, 0], WaitMode::Poll).unwrap();
        // Channel 3 waits for value 5 at `semaphore`, then stamps; channel 1 runs 10 ms,
        // releases 5 into VRAM, stamps.
        d.enqueue_on(3, cmd(op::SEM_ACQUIRE, [semaphore, 5, 0])).unwrap();
        d.enqueue_on(3, cmd(op::TIMED, [1_000, 0, 0])).unwrap();
        d.enqueue_on(3, cmd(op::SEM_RELEASE, [slots.bus.get() + 64, 1, sem::TIMESTAMPS])).unwrap();
        d.flush_on(3);
        d.enqueue_on(1, cmd(op::TIMED, [10_000_000, 0, 0])).unwrap();
        d.enqueue_on(1, cmd(op::SEM_RELEASE, [semaphore, 5, sem::VRAM])).unwrap();
        d.enqueue_on(1, cmd(op::SEM_RELEASE, [slots.bus.get(), 1, sem::TIMESTAMPS])).unwrap();
        d.flush_on(1);
        let first = wait_for(&mut d, &slots, 0);
        let second = wait_for(&mut d, &slots, 64);
        assert!(
            second.1 >= first.2 - 1_000_000,
            "the waiting channel began at {} before the release at {}",
            second.1,
            first.2
        );
        // A value below the target holds; the same value again passes at once.
        d.enqueue_on(3, cmd(op::SEM_ACQUIRE, [semaphore, 5, 0])).unwrap();
        d.enqueue_on(3, cmd(op::SEM_RELEASE, [slots.bus.get() + 128, 2, 0])).unwrap();
        d.flush_on(3);
        assert_eq!(wait_for(&mut d, &slots, 128).0, 2);
    }

    #[test]
    fn a_copy_lasts_at_least_its_least_duration_and_moves_its_bytes() {
        let mut d = open_concurrent();
        d.open_channel(1, 64).unwrap();
        let src = d.pin(64 << 10).unwrap();
        let data = pattern(64 << 10, 9);
        d.pci().dma_write(&src, 0, &data);
        let slots = d.pin(4096).unwrap();
        d.pci().dma_write(&slots, 0, &[0; 4096]);
        let copy = Command { opcode: op::COPY_H2V, args: [src.bus.get(), 0x20_0000, 64 << 10, 5_000_000, 0] };
        d.enqueue_on(1, copy).unwrap();
        d.enqueue_on(1, cmd(op::SEM_RELEASE, [slots.bus.get(), 1, sem::TIMESTAMPS])).unwrap();
        d.flush_on(1);
        let (_, begin, end) = wait_for(&mut d, &slots, 0);
        assert!(end - begin >= 5_000_000, "{}", end - begin);
        let mut back = vec![0u8; 64 << 10];
        d.memcpy_from_device(0x20_0000, &mut back).unwrap();
        assert!(back == data);
    }

    #[test]
    fn bad_channel_commands_and_registers_are_refused() {
        let mut d = open();
        assert!(d.open_channel(0, 64).is_err());
        assert!(d.open_channel(CHANNELS, 64).is_err());
        assert!(d.open_channel(1, 3).is_err());
        assert!(d.enqueue_on(2, Command::default()).is_err(), "not opened");
        // A timed kernel past the limit, a release to an unaligned address or with unknown
        // flags, an acquire outside VRAM: bad arguments, and the device goes on.
        assert_eq!(
            d.launch(op::TIMED, [u64::MAX, 0, 0, 0, 0], WaitMode::Poll),
            Err(DriverError::Device { code: err::BAD_ARGUMENT })
        );
        for c in [[0x1001, 1, 0, 0, 0], [0x1000, 1, 4, 0, 0], [d.vram_size(), 1, sem::VRAM, 0, 0]] {
            assert_eq!(
                d.launch(op::SEM_RELEASE, c, WaitMode::Poll),
                Err(DriverError::Device { code: err::BAD_ARGUMENT })
            );
        }
        assert_eq!(
            d.launch(op::SEM_ACQUIRE, [d.vram_size(), 1, 0, 0, 0], WaitMode::Poll),
            Err(DriverError::Device { code: err::BAD_ARGUMENT })
        );
        d.launch(op::NOP, [0; 5], WaitMode::Poll).unwrap();
        // Channel registers read back; the count is there.
        assert_eq!(d.read_reg(reg::CHANNELS), CHANNELS as u64);
        d.open_channel(5, 128).unwrap();
        assert_eq!(d.read_reg(simgpu_abi::chreg::at(5, simgpu_abi::chreg::RING_SIZE)), 128);
        assert_eq!(d.read_reg(simgpu_abi::chreg::at(5, simgpu_abi::chreg::RING_HEAD)), 0);
    }
}

/// What the device sends from VRAM is read from there when the platform takes it, not when
/// sent; VRAM written before the platform took it does not change what leaves. A platform
/// that lets the device run on without taking (three polls: the copy out, then a FILL over
/// the same VRAM) still gets the bytes VRAM held when the copy sent them.
#[test]
fn a_copy_out_not_yet_taken_leaves_with_the_bytes_it_was_sent_with() {
    use tlp::{Body, ParseConfig, TlpRepr};
    let fill = |v: u8| (op::FILL, [0, 4096, u64::from(u32::from_le_bytes([v; 4]))]);
    let (mut dev, _) = raw_simgpu_running(&[fill(0x11), (op::COPY_V2H, [0, RAW_OUT, 4096]), fill(0x22)]);
    for _ in 0..6 {
        dev.poll();
    }
    let sent = hw::take_all(&mut dev);
    let out: Vec<u8> = sent
        .iter()
        .filter_map(|b| match TlpRepr::parse_bytes(b, &ParseConfig::default()).ok()?.body {
            Body::MemWrite { address, data, .. } if (RAW_OUT..RAW_OUT + 4096).contains(&address.value()) => {
                Some(data.to_vec())
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(out.len(), 4096, "the copy's writes: {} TLPs sent in all", sent.len());
    assert!(out.iter().all(|&b| b == 0x11), "the FILL after the copy leaked into its payload");
    // And VRAM holds the second FILL's bytes: the copy out did not hold the device back.
    let mut again = Sent::default();
    raw_cfg_write(&mut dev, 0x18, RAW_BAR2 as u32);
    raw_cfg_write(&mut dev, 0x1c, (RAW_BAR2 >> 32) as u32);
    let _ = hw::take_all(&mut dev);
    dev.request_to(&raw_vram_read(0), &mut again);
    let c = TlpRepr::parse_bytes(&again.0[0], &ParseConfig::default()).unwrap();
    assert_eq!(c.data().unwrap(), [0x22; 8]);
}

const RAW_BAR2: u64 = 0x40_0000_0000;

/// A configuration write of register `register`, as the host sends it (its completion left
/// in the device's outbox).
fn raw_cfg_write(dev: &mut SimGpu, register: u16, v: u32) {
    use tlp::{ConfigTarget, Request, Tag, TlpRepr};
    let req = Request { requester: RAW_HOST, tag: Tag::new(1).unwrap(), first_be: 0xf, last_be: 0 };
    let cfg = ConfigTarget { type1: false, target: Bdf::new(1, 0, 0), register };
    dev.request(&TlpRepr::new(tlp::Body::CfgWrite { req, cfg, data: &v.to_le_bytes() }));
}

/// A read of the 8 bytes of VRAM at `off` through BAR2.
fn raw_vram_read(off: u64) -> tlp::TlpRepr<'static> {
    use tlp::{Address, Body, Request, Tag, TlpRepr};
    TlpRepr::new(Body::MemRead {
        req: Request { requester: RAW_HOST, tag: Tag::new(4).unwrap(), first_be: 0xf, last_be: 0xf },
        address: Address::new(RAW_BAR2 + off),
        ph: 0,
        length_dw: 2,
        locked: false,
    })
}
