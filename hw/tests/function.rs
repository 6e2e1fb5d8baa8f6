//! A function driven with TLPs: config reads and writes answered with completions, Memory
//! Space Enable gating BAR decode, Bus Master Enable gating MSI-X writes, MSI-X masking and
//! pending bits through the BAR, function-level reset.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use hw::NoMemory;
use hw::function::{Function, MemoryTarget, Outbox};
use hw::simgpu::{self, SimGpuParams};
use tlp::{Bdf, Body, ConfigTarget, CplStatus, Kind, ParseConfig, Request, Tag, TlpRepr};

const HOST: Bdf = Bdf::new(0, 0, 0);
const DEV: Bdf = Bdf::new(1, 0, 0);

fn cfg_read(reg: u16) -> TlpRepr<'static> {
    TlpRepr::new(Body::CfgRead {
        req: Request { requester: HOST, tag: Tag::new(7).unwrap(), first_be: 0xf, last_be: 0 },
        cfg: ConfigTarget { type1: false, target: DEV, register: reg },
    })
}

fn cfg_write(reg: u16, be: u8, data: &[u8; 4]) -> TlpRepr<'_> {
    TlpRepr {
        body: Body::CfgWrite {
            req: Request { requester: HOST, tag: Tag::new(8).unwrap(), first_be: be, last_be: 0 },
            cfg: ConfigTarget { type1: false, target: DEV, register: reg },
            data,
        },
        ..cfg_read(0)
    }
}

/// What the function sent, taken from its outbox and emitted.
fn taken(out: &mut Outbox) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    while let Some(t) = out.take(&NoMemory) {
        let mut b = vec![0u8; t.buffer_len()];
        let n = t.emit(&mut b).unwrap();
        b.truncate(n);
        v.push(b);
    }
    v
}

fn parse(b: &[u8]) -> TlpRepr<'_> {
    TlpRepr::parse_bytes(b, &ParseConfig::default()).unwrap()
}

fn read32(f: &mut Function, reg: u16) -> u32 {
    let mut q = Outbox::default();
    f.config_request(&cfg_read(reg), &mut q);
    let sent = taken(&mut q);
    let c = parse(&sent[0]);
    assert_eq!(c.kind(), Kind::CplD);
    u32::from_le_bytes(c.data().unwrap().try_into().unwrap())
}

fn write32(f: &mut Function, reg: u16, v: u32) -> Vec<Vec<u8>> {
    let mut q = Outbox::default();
    let d = v.to_le_bytes();
    f.config_request(&cfg_write(reg, 0xf, &d), &mut q);
    taken(&mut q)
}

fn function() -> Function {
    Function::new(DEV, simgpu::config_space(&SimGpuParams::default()))
}

#[test]
fn config_requests_are_completed() {
    let mut f = function();
    assert_eq!(read32(&mut f, 0), 0xd9a0_1234);
    let q = write32(&mut f, 0x10, 0xfe00_0000);
    let c = parse(&q[0]);
    assert_eq!(c.kind(), Kind::Cpl);
    assert!(
        matches!(c.body, Body::Completion { cpl, .. } if cpl.status == CplStatus::Success && cpl.completer == DEV && cpl.tag.value() == 8)
    );
    // Byte enables: only the enabled byte changes (Interrupt Line at 0x3c).
    let mut q = Outbox::default();
    f.config_request(&cfg_write(0x3c, 0b0001, &[0x0b, 0xff, 0xff, 0xff]), &mut q);
    assert_eq!(read32(&mut f, 0x3c) & 0xffff, 0x000b, "pin (read-only, none) untouched, line 11");
    // Type 1 to an endpoint: UR.
    let mut q = Outbox::default();
    let mut r = cfg_read(0);
    if let Body::CfgRead { cfg, .. } = &mut r.body {
        cfg.type1 = true;
    }
    f.config_request(&r, &mut q);
    assert!(
        matches!(parse(&taken(&mut q)[0]).body, Body::Completion { cpl, .. } if cpl.status == CplStatus::UnsupportedRequest)
    );
}

#[test]
fn memory_space_enable_gates_bar_decode() {
    let mut f = function();
    write32(&mut f, 0x10, 0xfe00_0000);
    write32(&mut f, 0x14, 0);
    write32(&mut f, 0x18, 0x0000_000c);
    write32(&mut f, 0x1c, 0x1);
    assert_eq!(f.memory_target(0xfe00_0010), Err(CplStatus::UnsupportedRequest), "MSE clear: UR");
    write32(&mut f, 0x04, 0x0002);
    assert_eq!(f.memory_target(0xfe00_0010), Ok(MemoryTarget::Bar(0, 0x10)));
    assert_eq!(f.memory_target(0xfe00_8010), Ok(MemoryTarget::MsixTable(0x10)));
    assert_eq!(f.memory_target(0xfe00_9000), Ok(MemoryTarget::MsixPba(0)));
    assert_eq!(f.memory_target(0x1_0000_0040), Ok(MemoryTarget::Bar(2, 0x40)));
    assert_eq!(f.memory_target(0xfd00_0000), Err(CplStatus::UnsupportedRequest), "no BAR claims it");
}

#[test]
fn msix_through_the_bar_with_masking_pending_bits_and_bus_master() {
    let mut f = function();
    write32(&mut f, 0x10, 0xfe00_0000);
    write32(&mut f, 0x04, 0x0002); // memory, no bus master yet
    let mut up = Outbox::default();
    // Program vector 2 (entries start masked) through the table in BAR0.
    let t = |v: u64, o: u64| f.memory_target(0xfe00_8000 + v * 16 + o).unwrap();
    let (addr_lo, data, ctl) = (t(2, 0), t(2, 8), t(2, 12));
    f.msix_write(addr_lo, 8, 0xfee0_0000, &mut up);
    f.msix_write(data, 4, 0x4242, &mut up);
    // Enable MSI-X (Message Control at cap + 2; write its DW with Enable set).
    let m = f.config().msix_offset().unwrap() as u16;
    let dw = read32(&mut f, m);
    write32(&mut f, m, dw | 0x8000 << 16);
    // Masked entry: pending, nothing sent.
    f.signal(2, &mut up);
    assert!(up.is_empty());
    let pba = f.memory_target(0xfe00_9000).unwrap();
    assert_eq!(f.msix_read(pba, 8), 0b100);
    // Unmask without Bus Master Enable: held back, still pending.
    f.msix_write(ctl, 4, 0, &mut up);
    assert!(up.is_empty());
    assert_eq!(f.held_messages(), 1);
    assert_eq!(f.msix_read(pba, 8), 0b100);
    // Bus Master Enable releases it: one MWr of the data to the address.
    let cfg_up = write32(&mut f, 0x04, 0x0006);
    let mwr: Vec<_> = cfg_up.iter().map(|b| parse(b)).filter(|t| t.kind() == Kind::MWr32).collect();
    assert_eq!(mwr.len(), 1);
    assert_eq!(mwr[0].address(), Some(0xfee0_0000));
    assert_eq!(mwr[0].data(), Some(&0x4242u32.to_le_bytes()[..]));
    assert_eq!(mwr[0].requester_tag().0, DEV);
    assert_eq!(f.msix_read(pba, 8), 0);
    // Now signals go straight out.
    f.signal(2, &mut up);
    assert_eq!(up.len(), 1);
    // Function Mask holds them back again.
    let dw = read32(&mut f, m);
    write32(&mut f, m, dw | 0x4000 << 16);
    f.signal(2, &mut up);
    assert_eq!(up.len(), 1);
    assert_eq!(f.msix_read(pba, 8), 0b100);
}

#[test]
fn function_level_reset_restores_power_on_state() {
    let mut f = function();
    write32(&mut f, 0x10, 0xfe00_0000);
    write32(&mut f, 0x04, 0x0006);
    let p = f.config().pcie_offset().unwrap() as u16;
    let devctl = read32(&mut f, p + 8);
    let q = write32(&mut f, p + 8, devctl | 0x8000);
    assert_eq!(parse(&q[0]).kind(), Kind::Cpl, "the FLR write itself completes");
    assert_eq!(f.config().command(), 0);
    assert_eq!(f.config().bar_address(0), Some(0));
    assert!(f.msix().entry(0).unwrap().masked);
}
