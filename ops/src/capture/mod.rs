//! Packet capture of the link: `--capture FILE.pcapng` writes every datagram an endpoint
//! sends and receives, wrapped in Ethernet, IP and UDP headers so that any tool reads it
//! (Wireshark, tshark, tcpdump), with nanosecond timestamps and the direction in each
//! packet's flags. Reading (`dxpu tlp decode --pcap`) takes this or a classic pcap, as
//! `tcpdump -w` writes it, of Ethernet, raw IP, Linux cooked or BSD loopback frames.
//!
//! The endpoint's thread only copies the datagram into a bounded queue (a full queue drops
//! the packet and counts it); a thread of its own writes the file, up to `--capture-limit`
//! bytes, after which packets are counted as dropped.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use link::driver::{Direction, Tap};
use pcap_file::DataLink;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};

/// The default bound on a capture file: 1 GiB.
pub const DEFAULT_LIMIT: u64 = 1 << 30;
/// Packets waiting for the writer at most.
const QUEUE: usize = 16 * 1024;

/// EPB flags: inbound and outbound (pcapng, `epb_flags` bits 0–1).
const INBOUND: u32 = 1;
const OUTBOUND: u32 = 2;

struct Packet {
    dir: Direction,
    local: SocketAddr,
    peer: SocketAddr,
    at: Duration,
    bytes: Vec<u8>,
}

/// What a capture wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Packets written.
    pub packets: u64,
    /// Bytes of frames written (the datagrams, without the headers around them).
    pub bytes: u64,
    /// Packets not written: the queue was full, or the file reached its limit.
    pub dropped: u64,
}

/// A capture being written.
pub struct Capture {
    path: PathBuf,
    queue: Option<mpsc::SyncSender<Packet>>,
    dropped: Arc<AtomicU64>,
    writer: Option<JoinHandle<Result<CaptureStats, CaptureError>>>,
}

/// Why a capture could not be made or finished.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file is there already: never overwritten.
    #[error("--capture {path}: exists; refusing to overwrite it (remove it, or name another file)")]
    Exists {
        /// The file.
        path: String,
    },
    /// The file could not be created or begun.
    #[error("--capture {path}: {why}")]
    Create {
        /// The file.
        path: String,
        /// What failed.
        why: String,
    },
    /// The writer's thread could not start.
    #[error("--capture: starting its thread: {0}")]
    Thread(#[source] std::io::Error),
    /// Writing the file while the endpoint runs.
    #[error("capture {path}: {why}")]
    Write {
        /// The file.
        path: String,
        /// What failed.
        why: String,
    },
    /// `finish` called twice.
    #[error("capture already finished")]
    Finished,
    /// The writer's thread panicked.
    #[error("the capture thread panicked")]
    Panicked,
}

/// For the run times' errors, which are text.
impl From<CaptureError> for String {
    fn from(e: CaptureError) -> String {
        e.to_string()
    }
}

impl Capture {
    /// Creates `path` (replacing it) and starts its writer; `limit` bounds its size.
    pub fn create(path: &Path, limit: u64) -> Result<Capture, CaptureError> {
        let at = path.display().to_string();
        // A file that is there already is someone's: never truncated (docs/reliability.md).
        let f = File::options().write(true).create_new(true).open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => CaptureError::Exists { path: at.clone() },
            _ => CaptureError::Create { path: at.clone(), why: e.to_string() },
        })?;
        let create = |e: pcap_file::PcapError| CaptureError::Create { path: at.clone(), why: e.to_string() };
        let mut w = PcapNgWriter::new(BufWriter::new(f)).map_err(create)?;
        let idb = InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Borrowed("dxpu")),
                InterfaceDescriptionOption::IfDescription(Cow::Borrowed(
                    "the dxpu link, as the endpoint sent and received it",
                )),
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        };
        w.write_pcapng_block(idb).map_err(create)?;
        let (tx, rx) = mpsc::sync_channel::<Packet>(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let d2 = dropped.clone();
        let writer = std::thread::Builder::new()
            .name("dxpu-capture".into())
            .spawn(move || write_loop(w, rx, limit, &d2, &at))
            .map_err(CaptureError::Thread)?;
        log::info!("capturing the link to {} (at most {limit} bytes)", path.display());
        Ok(Capture { path: path.to_path_buf(), queue: Some(tx), dropped, writer: Some(writer) })
    }

    /// The tap to give the endpoints.
    pub fn tap(&self) -> Option<Tap> {
        let q = self.queue.clone()?;
        let dropped = self.dropped.clone();
        Some(Tap(Arc::new(move |dir, local, peer, bytes: &[u8]| {
            let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            let p = Packet { dir, local, peer, at, bytes: bytes.to_vec() };
            if q.try_send(p).is_err() {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
        })))
    }

    /// Writes what is queued and closes the file. The endpoints holding its tap must be
    /// gone first: the writer ends once every tap is.
    pub fn finish(mut self) -> Result<CaptureStats, CaptureError> {
        self.queue = None;
        let w = self.writer.take().ok_or(CaptureError::Finished)?;
        let s = w.join().map_err(|_| CaptureError::Panicked)??;
        log::info!(
            "capture {}: {} packets, {} bytes, {} dropped",
            self.path.display(),
            s.packets,
            s.bytes,
            s.dropped
        );
        Ok(s)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn write_loop(
    mut w: PcapNgWriter<BufWriter<File>>,
    rx: mpsc::Receiver<Packet>,
    limit: u64,
    dropped: &AtomicU64,
    at: &str,
) -> Result<CaptureStats, CaptureError> {
    let mut s = CaptureStats::default();
    let write = |why: String| CaptureError::Write { path: at.to_string(), why };
    let mut written: u64 = 0;
    let mut full_logged = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(p) => {
                let frame = encapsulate(&p);
                // EPB: 28 bytes of block, the data padded to 4, the flags option (8) and the
                // end of options (4), the trailing length (4).
                let cost = 44 + frame.len().div_ceil(4) as u64 * 4;
                if written + cost > limit {
                    s.dropped += 1;
                    if !full_logged {
                        log::warn!(
                            "capture {at}: {limit} bytes reached; further packets are counted, not written"
                        );
                        full_logged = true;
                    }
                    continue;
                }
                let flags = match p.dir {
                    Direction::Sent => OUTBOUND,
                    Direction::Received => INBOUND,
                };
                let epb = EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: p.at,
                    original_len: frame.len() as u32,
                    data: Cow::Owned(frame),
                    options: vec![EnhancedPacketOption::Flags(flags)],
                };
                w.write_pcapng_block(epb).map_err(|e| write(e.to_string()))?;
                written += cost;
                s.packets += 1;
                s.bytes += p.bytes.len() as u64;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Quiet for a moment: what was written reaches the file (a capture read while
                // the endpoint runs, or one killed).
                w.get_mut().flush().map_err(|e| write(e.to_string()))?;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    w.get_mut().flush().map_err(|e| write(e.to_string()))?;
    s.dropped += dropped.load(Ordering::Relaxed);
    Ok(s)
}

/// Ethernet, IPv4 or IPv6, UDP around a datagram, source and destination as it went.
pub fn encapsulate_udp(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(62 + payload.len());
    // Locally administered MACs: 02:00:00:00:00:01 for this side's traffic direction.
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01]);
    let udp_len = (8 + payload.len()) as u16;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let total = 20 + udp_len;
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let sum = checksum(&[&ip]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&ip);
            // UDP over IPv4 may leave its checksum zero (none).
            f.extend_from_slice(&src.port().to_be_bytes());
            f.extend_from_slice(&dst.port().to_be_bytes());
            f.extend_from_slice(&udp_len.to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        (s, d) => {
            let (s, d) = (v6(s), v6(d));
            f.extend_from_slice(&0x86ddu16.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            f.extend_from_slice(&ip);
            let mut udp = [0u8; 8];
            udp[0..2].copy_from_slice(&src.port().to_be_bytes());
            udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
            udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
            // Mandatory over IPv6: over the pseudo-header, the UDP header and the payload.
            let mut pseudo = [0u8; 40];
            pseudo[..16].copy_from_slice(&s.octets());
            pseudo[16..32].copy_from_slice(&d.octets());
            pseudo[32..36].copy_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo[39] = 17;
            let sum = match checksum(&[&pseudo, &udp, payload]) {
                0 => 0xffff,
                s => s,
            };
            udp[6..8].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&udp);
        }
    }
    f.extend_from_slice(payload);
    f
}

fn v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

fn encapsulate(p: &Packet) -> Vec<u8> {
    match p.dir {
        Direction::Sent => encapsulate_udp(p.local, p.peer, &p.bytes),
        Direction::Received => encapsulate_udp(p.peer, p.local, &p.bytes),
    }
}

/// The Internet checksum (RFC 1071) over `parts` taken as one byte string.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let mut odd: Option<u8> = None;
    for p in parts {
        for &b in *p {
            match odd.take() {
                Some(hi) => sum += u32::from(u16::from_be_bytes([hi, b])),
                None => odd = Some(b),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u32::from(hi) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// One UDP datagram of a capture file.
#[derive(Clone, Debug, PartialEq)]
pub struct Datagram {
    /// Its number in the file, from 1 (as Wireshark counts).
    pub number: u64,
    /// Seconds since the epoch.
    pub time: f64,
    /// Its source address and port.
    pub src: SocketAddr,
    /// Its destination.
    pub dst: SocketAddr,
    /// Inbound or outbound, where the file says (pcapng flags).
    pub direction: Option<Direction>,
    /// The UDP payload: one dxpu frame.
    pub payload: Vec<u8>,
}

/// What a capture holds that is not a UDP datagram, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Packets that are not UDP over IPv4 or IPv6.
    pub not_udp: u64,
    /// Packets captured shorter than they were.
    pub truncated: u64,
    /// The file ended inside a block (a capture whose writer was killed): what came
    /// before is read.
    pub cut_short: bool,
}

/// Why a capture file could not be read to its end ([`each_datagram`]); `E`: the error of
/// the caller's function that takes each datagram.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E> {
    /// The file could not be opened or read.
    #[error("--pcap {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// Shorter than a file header.
    #[error("--pcap {path}: shorter than any capture file")]
    Short {
        /// The file.
        path: String,
    },
    /// Neither pcapng nor pcap.
    #[error("--pcap {path}: not a pcapng or pcap file ({why})")]
    NotCapture {
        /// The file.
        path: String,
        /// What the reader found.
        why: pcap_file::PcapError,
    },
    /// A block or packet the reader cannot take (`at`: which, as "block after packet N" or
    /// "packet N").
    #[error("--pcap {path}: {at}: {why}")]
    Malformed {
        /// The file.
        path: String,
        /// Where in it.
        at: String,
        /// What the reader found.
        why: pcap_file::PcapError,
    },
    /// A packet on an interface the file never described.
    #[error("--pcap {path}: packet {packet} names interface {interface} the file never described")]
    NoInterface {
        /// The file.
        path: String,
        /// The packet's number (from 1).
        packet: u64,
        /// The interface it names.
        interface: u32,
    },
    /// The caller's function stopped the reading with its error.
    #[error("{0}")]
    Stopped(E),
}

/// For callers whose errors are text (`dxpu pcap decode`).
impl<E: std::fmt::Display> From<ReadError<E>> for String {
    fn from(e: ReadError<E>) -> String {
        e.to_string()
    }
}

/// Every UDP datagram in the pcapng or pcap file at `path`, in memory (for small files:
/// [`each_datagram`] reads a capture of any size in constant memory).
pub fn read_datagrams(path: &Path) -> Result<(Vec<Datagram>, Skipped), ReadError<std::convert::Infallible>> {
    let mut out = Vec::new();
    let skipped = each_datagram(path, &mut |d| {
        out.push(d);
        Ok(())
    })?;
    Ok((out, skipped))
}

/// Hands `f` each UDP datagram of the pcapng or pcap file at `path` as it is read, one
/// packet in memory at a time (a 1 GiB capture as well as a small one); stops at `f`'s first
/// error. What is not a UDP datagram is counted.
pub fn each_datagram<E>(
    path: &Path,
    f: &mut dyn FnMut(Datagram) -> Result<(), E>,
) -> Result<Skipped, ReadError<E>> {
    let at = || path.display().to_string();
    let io = |source| ReadError::Io { path: at(), source };
    let file = File::open(path).map_err(io)?;
    let mut input = std::io::BufReader::with_capacity(1 << 20, file);
    let magic = std::io::BufRead::fill_buf(&mut input).map_err(io)?;
    if magic.len() < 4 {
        return Err(ReadError::Short { path: at() });
    }
    let pcapng = magic[..4] == [0x0a, 0x0d, 0x0d, 0x0a];
    let mut skipped = Skipped::default();
    let mut number = 0u64;
    // Each packet as it comes: (link type, timestamp, bytes, original length, direction).
    let mut packet = |link: DataLink,
                      time: Duration,
                      data: &[u8],
                      orig: u32,
                      direction: Option<Direction>,
                      skipped: &mut Skipped|
     -> Result<(), ReadError<E>> {
        number += 1;
        if (data.len() as u64) < u64::from(orig) {
            skipped.truncated += 1;
            return Ok(());
        }
        match udp_of(link, data) {
            Some((src, dst, payload)) => f(Datagram {
                number,
                time: time.as_secs_f64(),
                src,
                dst,
                direction,
                payload: payload.to_vec(),
            })
            .map_err(ReadError::Stopped),
            None => {
                skipped.not_udp += 1;
                Ok(())
            }
        }
    };
    let path = at();
    if pcapng {
        pcapng_packets(input, &path, &mut skipped, &mut packet)?;
    } else {
        pcap_packets(input, &path, &mut skipped, &mut packet)?;
    }
    Ok(skipped)
}

/// One packet as it comes to [`each_datagram`]: link type, timestamp, bytes, original length,
/// direction, and the counts of what was skipped.
type PacketSink<'a, E> = dyn FnMut(DataLink, Duration, &[u8], u32, Option<Direction>, &mut Skipped) -> Result<(), ReadError<E>>
    + 'a;

/// The packets of a pcapng file (`path` names it in errors), each handed to `packet`.
fn pcapng_packets<E>(
    input: impl std::io::Read,
    path: &str,
    skipped: &mut Skipped,
    packet: &mut PacketSink<'_, E>,
) -> Result<(), ReadError<E>> {
    let mut r =
        PcapNgReader::new(input).map_err(|why| ReadError::NotCapture { path: path.to_string(), why })?;
    // Each interface's link type and timestamp resolution (10^-r s; default 6).
    let mut interfaces: Vec<(DataLink, u8)> = Vec::new();
    let mut packets = 0u64;
    while let Some(block) = r.next_block() {
        let Some(block) = taken(block, path, skipped, || format!("block after packet {packets}"))? else {
            break;
        };
        match block {
            Block::SectionHeader(_) => interfaces.clear(),
            Block::InterfaceDescription(idb) => {
                let resol = idb.options.iter().find_map(|o| match o {
                    InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                    _ => None,
                });
                interfaces.push((idb.linktype, resol.unwrap_or(6)));
            }
            Block::EnhancedPacket(p) => {
                packets += 1;
                let Some(&(link, resol)) = interfaces.get(p.interface_id as usize) else {
                    return Err(ReadError::NoInterface {
                        path: path.to_string(),
                        packet: packets,
                        interface: p.interface_id,
                    });
                };
                // The reader takes the stored count as nanoseconds; the interface says
                // what it counts.
                let time = match resol {
                    r if r <= 9 => Duration::from_nanos(
                        (p.timestamp.as_nanos() as u64).saturating_mul(10u64.pow(9 - r as u32)),
                    ),
                    _ => p.timestamp,
                };
                let dir = p.options.iter().find_map(|o| match o {
                    EnhancedPacketOption::Flags(f) if f & 3 == INBOUND => Some(Direction::Received),
                    EnhancedPacketOption::Flags(f) if f & 3 == OUTBOUND => Some(Direction::Sent),
                    _ => None,
                });
                packet(link, time, &p.data, p.original_len, dir, skipped)?;
            }
            Block::SimplePacket(p) => {
                packets += 1;
                let link = interfaces.first().map_or(DataLink::ETHERNET, |i| i.0);
                packet(link, Duration::ZERO, &p.data, p.original_len, None, skipped)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The packets of a classic pcap file (`path` names it in errors), each handed to `packet`.
fn pcap_packets<E>(
    input: impl std::io::Read,
    path: &str,
    skipped: &mut Skipped,
    packet: &mut PacketSink<'_, E>,
) -> Result<(), ReadError<E>> {
    let mut r = pcap_file::pcap::PcapReader::new(input)
        .map_err(|why| ReadError::NotCapture { path: path.to_string(), why })?;
    let link = r.header().datalink;
    let mut packets = 0u64;
    while let Some(p) = r.next_packet() {
        let Some(p) = taken(p, path, skipped, || format!("packet {}", packets + 1))? else { break };
        packets += 1;
        packet(link, p.timestamp, &p.data, p.orig_len, None, skipped)?;
    }
    Ok(())
}

/// What the reader read: the block or packet; `None` where the file ends inside one (counted:
/// what came before is read); an error naming where (`at`) otherwise.
fn taken<T, E>(
    read: Result<T, pcap_file::PcapError>,
    path: &str,
    skipped: &mut Skipped,
    at: impl FnOnce() -> String,
) -> Result<Option<T>, ReadError<E>> {
    match read {
        Ok(t) => Ok(Some(t)),
        Err(e) if is_cut(&e) => {
            skipped.cut_short = true;
            Ok(None)
        }
        Err(why) => Err(ReadError::Malformed { path: path.to_string(), at: at(), why }),
    }
}

/// Whether a reader's error says the file ends inside a block.
fn is_cut(e: &pcap_file::PcapError) -> bool {
    match e {
        pcap_file::PcapError::IncompleteBuffer => true,
        pcap_file::PcapError::IoError(io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        _ => false,
    }
}

/// The UDP datagram in one captured frame of link type `link`, if it holds one (IPv4
/// fragments and IPv6 extension headers are not followed).
fn udp_of(link: DataLink, f: &[u8]) -> Option<(SocketAddr, SocketAddr, &[u8])> {
    let be16 = |b: &[u8], i: usize| Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]));
    let (ethertype, ip) = match link {
        DataLink::ETHERNET => {
            let mut at = 12;
            let mut ty = be16(f, at)?;
            while ty == 0x8100 || ty == 0x88a8 {
                at += 4;
                ty = be16(f, at)?;
            }
            (ty, f.get(at + 2..)?)
        }
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => match f.first()? >> 4 {
            4 => (0x0800, f),
            6 => (0x86dd, f),
            _ => return None,
        },
        DataLink::LINUX_SLL => (be16(f, 14)?, f.get(16..)?),
        DataLink::LINUX_SLL2 => (be16(f, 0)?, f.get(20..)?),
        DataLink::NULL | DataLink::LOOP => {
            let fam = f.get(..4)?;
            let v = u32::from_le_bytes([fam[0], fam[1], fam[2], fam[3]])
                .min(u32::from_be_bytes([fam[0], fam[1], fam[2], fam[3]]));
            (if v == 2 { 0x0800 } else { 0x86dd }, f.get(4..)?)
        }
        _ => return None,
    };
    let (src_ip, dst_ip, udp): (IpAddr, IpAddr, &[u8]) = match ethertype {
        0x0800 => {
            let ihl = (*ip.first()? & 0xf) as usize * 4;
            let frag = be16(ip, 6)? & 0x3fff;
            if *ip.get(9)? != 17 || ihl < 20 || frag != 0 {
                return None;
            }
            let total = (be16(ip, 2)? as usize).min(ip.len());
            let s: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let d: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), ip.get(ihl..total)?)
        }
        0x86dd => {
            if *ip.get(6)? != 17 {
                return None;
            }
            let s: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let d: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            let len = be16(ip, 4)? as usize;
            (IpAddr::from(s), IpAddr::from(d), ip.get(40..40 + len)?)
        }
        _ => return None,
    };
    let ulen = be16(udp, 4)? as usize;
    let payload = udp.get(8..ulen.max(8))?;
    Some((SocketAddr::new(src_ip, be16(udp, 0)?), SocketAddr::new(dst_ip, be16(udp, 2)?), payload))
}

pub mod decode;
pub mod lines;

#[cfg(test)]
mod tests;
