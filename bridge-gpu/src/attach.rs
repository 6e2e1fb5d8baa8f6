//! An ATTACH, as the box answers it: refused where the device is not the host's to take,
//! confirmed by the pool's claims where the box serves one, then ATTACHED with the BDF, the
//! Max_Payload_Size a frame carries and the BARs.

use bridge::attach::Control;
use link::Session;

use crate::claims::{AttachCtx, ClaimVerdict, Owner, PendingAttach};
use crate::export::Export;
use crate::session::{SessionInfo, reply};

/// An ATTACH: refused at once where the device is not this host's to take; in a pool,
/// accepted only once the pool confirms the claim (at once, or from the poll loop).
pub(crate) fn attach(
    sid: u32,
    s: &mut Session,
    info: &mut SessionInfo,
    device: &str,
    token: Option<u64>,
    exports: &mut [Export],
    ctx: &mut AttachCtx<'_>,
) {
    let verdict = match (ctx.claims.as_mut(), token) {
        (None, _) => ClaimVerdict::Valid,
        (Some(_), None) => ClaimVerdict::Refused(
            "this box serves a pool: an attach needs a claim's token (dxpu host with a [pool] section)"
                .into(),
        ),
        (Some(c), Some(t)) => match c.check.verdict(device, &info.host, t, None) {
            ClaimVerdict::Unknown if exports.iter().any(|e| e.name == device) => {
                let ticket = c.check.look_up(device);
                c.pending.push(PendingAttach {
                    sid,
                    device: device.to_string(),
                    token: t,
                    ticket,
                    since: std::time::Instant::now(),
                });
                return;
            }
            v => v,
        },
    };
    finish_attach(sid, s, info, device, token, verdict, exports, ctx);
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_attach(
    sid: u32,
    s: &mut Session,
    info: &mut SessionInfo,
    device: &str,
    token: Option<u64>,
    verdict: ClaimVerdict,
    exports: &mut [Export],
    ctx: &mut AttachCtx<'_>,
) {
    let refuse = |s: &mut Session, reason: String| {
        log::warn!(device = device, host = info.host.as_str(); "attach of {device} by {} refused: {reason}", info.host);
        reply(s, Control::Refused { device: device.to_string(), reason });
    };
    let Some(d) = exports.iter().position(|e| e.name == device) else {
        let names: Vec<&str> = exports.iter().map(|e| e.name.as_str()).collect();
        return refuse(s, format!("no device named '{device}' here (exported: {})", names.join(", ")));
    };
    let e = &mut exports[d];
    if !e.allow.contains(&info.host) {
        e.stats.refusals += 1;
        return refuse(s, format!("host '{}' may not attach '{device}'", info.host));
    }
    if let Some(h) = &e.health {
        e.stats.refusals += 1;
        return refuse(s, format!("'{device}' is unhealthy: it {h}"));
    }
    if let ClaimVerdict::Refused(why) = verdict {
        e.stats.refusals += 1;
        e.stats.stale_tokens += 1;
        let t = token.map_or_else(|| "none".to_string(), |t| t.to_string());
        return refuse(s, format!("claim token {t} refused: {why}"));
    }
    match &e.owner {
        Some(o) if o.sid != sid => {
            e.stats.refusals += 1;
            let reason = format!("'{device}' is attached to host '{}'", o.host);
            return refuse(s, reason);
        }
        _ => {}
    }
    if let Some(other) = info.device
        && other != d
    {
        return refuse(
            s,
            format!(
                "this session already has '{}'; attach each device on its own session",
                exports[other].name
            ),
        );
    }
    let e = &mut exports[d];
    let owner = Owner { sid, host: info.host.clone(), token };
    ctx.journal.record(&e.name, &owner, true, "attached");
    e.owner = Some(owner);
    info.device = Some(d);
    e.stats.attaches += 1;
    match token {
        Some(t) => log::info!(
            device = device, host = info.host.as_str(), session = format!("{sid:#010x}").as_str(), token = t;
            "{device} attached by {} (session {sid:#010x}, claim {t})", info.host
        ),
        None => log::info!(
            device = device, host = info.host.as_str(), session = format!("{sid:#010x}").as_str();
            "{device} attached by {} (session {sid:#010x})", info.host
        ),
    }
    // The largest payload a TLP may carry and still fit one frame of this session.
    let room = s
        .mtu()
        .saturating_sub(link::wire::HEADER_LEN + link::wire::FC_LEN + link::wire::TRAILER_LEN + 2 + 20);
    let max_payload =
        [4096u16, 2048, 1024, 512, 256, 128].into_iter().find(|m| *m as usize <= room).unwrap_or(128);
    let c = Control::Attached {
        device: device.to_string(),
        box_id: e.dev.id(),
        max_payload,
        bars: e.bars,
        origin: Some(e.origin.clone()),
    };
    reply(s, c);
}
