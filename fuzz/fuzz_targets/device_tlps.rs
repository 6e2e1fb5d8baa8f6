//! The simulated GPU driven by arbitrary steps, as the GPU-box endpoint drives it with what a
//! host sends: requests of any bytes, register writes, completions to the device's own reads
//! (command fetches and copies, of arbitrary data or failed), polls, resets. After every step
//! the platform takes what the device sent (`Device::upstream`), as the box does. Nothing may
//! panic; every TLP the device sends must emit and parse back the same; a non-posted request
//! gets a completion carrying its tag, a posted one none; a payload from VRAM leaves with the
//! bytes VRAM held when it was sent (checked against a shadow of the device's writes the
//! fuzzer makes through BAR2).
#![no_main]

use std::collections::VecDeque;

use hw::simgpu::SimGpuParams;
use hw::{Device, SimGpu};
use libfuzzer_sys::fuzz_target;
use tlp::rules::{self, Rcb, TransferSize};
use tlp::{Address, Bdf, Body, ConfigTarget, CplStatus, FcClass, ParseConfig, Request, Tag, TlpRepr};

const HOST: Bdf = Bdf::new(0, 0, 0);
const DEV: Bdf = Bdf::new(1, 0, 0);
const BAR0: u64 = 0xfe00_0000;
const BAR2: u64 = 0x40_0000_0000;
/// VRAM, small: a step that touches all of it stays quick.
const VRAM: u64 = 1 << 20;

/// Takes what the device sent: each TLP must emit and parse back the same. Its reads are
/// kept for completion steps; what else it sent is returned as (kind of body, tag).
fn take(dev: &mut SimGpu, reads: &mut VecDeque<Vec<u8>>) -> Vec<(bool, Tag)> {
    let mut sent = Vec::new();
    while let Some(ref t) = dev.upstream() {
        let mut b = vec![0u8; t.buffer_len()];
        let n = t.emit(&mut b).expect("a TLP the device sent emits");
        b.truncate(n);
        let back = TlpRepr::parse_bytes(&b, &ParseConfig::default()).expect("and parses back");
        assert_eq!(&back, t);
        match t.body {
            Body::MemRead { .. } => {
                if reads.len() < 1024 {
                    reads.push_back(b);
                }
            }
            Body::Completion { cpl, .. } => sent.push((true, cpl.tag)),
            _ => sent.push((false, Tag::default())),
        }
    }
    sent
}

/// The fuzzer's bytes, taken from the front.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn next(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
}

fn config_write(dev: &mut SimGpu, register: u16, v: u32) {
    let req = Request { requester: HOST, tag: Tag::from_bits(1), first_be: 0xf, last_be: 0 };
    let cfg = ConfigTarget { type1: false, target: DEV, register };
    dev.request(&TlpRepr::new(Body::CfgWrite { req, cfg, data: &v.to_le_bytes() }));
}

fuzz_target!(|data: &[u8]| {
    let mut dev = SimGpu::new(DEV, SimGpuParams { vram_bytes: VRAM, ..SimGpuParams::default() });
    let mut reads = VecDeque::new();
    // Placed and enabled as the box places a device: BAR0, BAR2, memory and bus master,
    // the largest payloads.
    for (register, v) in
        [(0x10, BAR0 as u32), (0x14, 0), (0x18, BAR2 as u32), (0x1c, (BAR2 >> 32) as u32), (0x04, 6)]
    {
        config_write(&mut dev, register, v);
    }
    let _ = take(&mut dev, &mut reads);
    let mut input = Input(data);
    let mut next = |n: usize| input.next(n);
    let mut steps = 0;
    while let Some(&[op]) = next(1) {
        steps += 1;
        if steps > 64 {
            break;
        }
        match op % 6 {
            // A request of arbitrary bytes (what parses).
            0 => {
                let Some(&[len]) = next(1) else { break };
                let Some(bytes) = next(len as usize) else { break };
                let Ok(t) = TlpRepr::parse_bytes(bytes, &ParseConfig::default()) else { continue };
                if matches!(t.body, Body::Completion { .. }) {
                    dev.completion(&t);
                    let _ = take(&mut dev, &mut reads);
                    continue;
                }
                dev.request(&t);
                let sent = take(&mut dev, &mut reads);
                let (_, tag) = t.requester_tag();
                let answered = sent.iter().filter(|&&(cpl, t)| cpl && t == tag).count();
                match t.fc_class() {
                    FcClass::NonPosted => assert!(answered >= 1, "a non-posted request unanswered: {t}"),
                    _ => assert_eq!(sent.iter().filter(|s| s.0).count(), 0, "a posted request answered: {t}"),
                }
            }
            // A register write (the ring, doorbells, channels).
            1 => {
                let Some(b) = next(10) else { break };
                let off = u64::from(u16::from_le_bytes([b[0], b[1]]) & 0xfff8);
                let d = &b[2..10];
                let req = Request { requester: HOST, tag: Tag::default(), first_be: 0xf, last_be: 0xf };
                dev.request(&TlpRepr::new(Body::MemWrite {
                    req,
                    address: Address::new(BAR0 + off),
                    ph: 0,
                    data: d,
                }));
                let _ = take(&mut dev, &mut reads);
            }
            // The oldest read the device sent, completed with the next bytes (or failed).
            2 => {
                let Some(b) = reads.pop_front() else { continue };
                let Ok(r) = TlpRepr::parse_bytes(&b, &ParseConfig::default()) else { continue };
                let len = r.length_dw().unwrap_or(0) as usize * 4;
                let Some(&[how]) = next(1) else { break };
                if how & 7 == 0 {
                    dev.completion(&rules::completion_without_data(&r, HOST, CplStatus::UnsupportedRequest));
                } else {
                    let mut bytes = vec![0u8; len];
                    let Some(&[have]) = next(1) else { break };
                    let have = (usize::from(have) * 16).min(len);
                    if let Some(from) = next(have) {
                        bytes[..have].copy_from_slice(from);
                    }
                    let mps =
                        TransferSize::from_bytes(128 << (how >> 5).min(5)).unwrap_or(TransferSize::B128);
                    let mut cpls = Vec::new();
                    rules::complete_read(&r, HOST, &bytes, Rcb::B64, mps, |c| {
                        let mut e = vec![0u8; c.buffer_len()];
                        let n = c.emit(&mut e).unwrap_or(0);
                        e.truncate(n);
                        cpls.push(e);
                    });
                    for c in &cpls {
                        if let Ok(c) = TlpRepr::parse_bytes(c, &ParseConfig::default()) {
                            dev.completion(&c);
                        }
                    }
                }
                let _ = take(&mut dev, &mut reads);
            }
            // Polls, what they send taken after each or only after the last (the device runs on
            // while the platform has not taken: what it sent from VRAM must not change).
            3 => {
                let Some(&[n]) = next(1) else { break };
                let taken_each = n & 0x80 != 0;
                for _ in 0..(n & 15) {
                    dev.poll();
                    if taken_each {
                        let _ = take(&mut dev, &mut reads);
                    }
                }
                let _ = take(&mut dev, &mut reads);
            }
            // A write into VRAM through BAR2, then a read of it back: the bytes as written (BAR2
            // placed and memory enabled again first: a request step may have moved them).
            4 => {
                let Some(b) = next(3) else { break };
                for (register, v) in [(0x18, BAR2 as u32), (0x1c, (BAR2 >> 32) as u32), (0x04, 6)] {
                    config_write(&mut dev, register, v);
                }
                let _ = take(&mut dev, &mut reads);
                let off = (u64::from(u16::from_le_bytes([b[0], b[1]])) * 8) % (VRAM - 64);
                let d = [b[2]; 8];
                let req = Request { requester: HOST, tag: Tag::default(), first_be: 0xf, last_be: 0xf };
                dev.request(&TlpRepr::new(Body::MemWrite {
                    req,
                    address: Address::new(BAR2 + off),
                    ph: 0,
                    data: &d,
                }));
                let _ = take(&mut dev, &mut reads);
                let req = Request { requester: HOST, tag: Tag::from_bits(9), first_be: 0xf, last_be: 0xf };
                let read = TlpRepr::new(Body::MemRead {
                    req,
                    address: Address::new(BAR2 + off),
                    ph: 0,
                    length_dw: 2,
                    locked: false,
                });
                dev.request(&read);
                let mut got = None;
                while let Some(ref t) = dev.upstream() {
                    if let Body::Completion { cpl, data: Some(d), .. } = t.body
                        && cpl.tag == Tag::from_bits(9)
                    {
                        got = Some(d.to_vec());
                    }
                }
                assert_eq!(got.as_deref(), Some(&[b[2]; 8][..]), "VRAM read back through BAR2");
            }
            // Function-level reset.
            _ => {
                dev.reset();
                reads.clear();
                let _ = take(&mut dev, &mut reads);
                for (register, v) in [
                    (0x10, BAR0 as u32),
                    (0x14, 0),
                    (0x18, BAR2 as u32),
                    (0x1c, (BAR2 >> 32) as u32),
                    (0x04, 6),
                ] {
                    config_write(&mut dev, register, v);
                }
                let _ = take(&mut dev, &mut reads);
            }
        }
    }
});
