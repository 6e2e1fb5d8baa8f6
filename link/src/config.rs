//! Session configuration, with defaults for a datacenter network.
#![forbid(unsafe_code)]

use core::time::Duration;

use crate::auth::PresharedKey;
use crate::error::ConfigError;
use crate::wire::{FC_LEN, HEADER_LEN, TRAILER_LEN};

/// Receive-side capacity a session grants its peer, in PCIe credits: header credits (one
/// per TLP) and data credits (16 bytes each), per class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditGrant {
    /// Posted (memory writes, messages): header, data.
    pub posted: (u32, u32),
    /// Non-posted (reads, config, IO, AtomicOps): header, data.
    pub non_posted: (u32, u32),
    /// Completions: header, data.
    pub completion: (u32, u32),
}

impl Default for CreditGrant {
    fn default() -> Self {
        // 256 TLPs and 64 KiB of payload per class.
        CreditGrant { posted: (256, 4096), non_posted: (256, 4096), completion: (256, 4096) }
    }
}

/// The path [`Config::new`] sizes the window and credits for: 25 Gbit/s (in bytes per
/// second) ...
pub const DEFAULT_PATH_BANDWIDTH: u64 = 25_000_000_000 / 8;
/// ... and a 100 µs round trip (a datacenter's, with the endpoints' own turnaround).
pub const DEFAULT_PATH_RTT: Duration = Duration::from_micros(100);

/// The most [`Config::size_for_path`] lets be in flight, per class: what a receiver may
/// have to buffer for its peer (delivered TLPs wait within the credits granted).
pub const MAX_IN_FLIGHT: u64 = 64 << 20;

/// Everything a session needs to know. Bounds on memory follow from `window`, `mtu`,
/// `max_queued` and `credits`: replay buffer ≤ window × MTU, out-of-order buffer ≤ window ×
/// MTU, send queues ≤ 3 × max_queued TLPs, delivered-but-unread TLPs ≤ the credits granted.
#[derive(Clone, Debug)]
pub struct Config {
    /// The pre-shared key both peers hold.
    pub psk: PresharedKey,
    /// Largest datagram this side sends or accepts; the session uses the smaller of both.
    /// A TLP must fit one frame, so Max_Payload_Size is chosen to fit it (1472 carries
    /// 1 KiB payloads; loopback and jumbo-frame fabrics carry 4 KiB).
    pub mtu: usize,
    /// Most DATA frames in flight (sent, not yet acknowledged); the smaller of both sides.
    pub window: u32,
    /// Credits granted to the peer.
    pub credits: CreditGrant,
    /// Most TLPs queued per flow-control class before `send_tlp` refuses.
    pub max_queued: usize,
    /// The least replay timeout (and the first, before a round trip was measured): the
    /// timeout follows the measured round trips (RFC 6298) above it, and doubles on each
    /// expiry without progress.
    pub replay_timeout: Duration,
    /// Ceiling of the replay timeout back-off.
    pub max_replay_timeout: Duration,
    /// Delay before a standalone ACK when no frame carries it sooner (zero: at once).
    pub ack_delay: Duration,
    /// Send a KEEPALIVE when nothing was sent for this long.
    pub keepalive_interval: Duration,
    /// The link counts as *silent* when nothing authentic arrived for this long: the session
    /// says so ([`crate::Event::Silent`]) and keeps its state, keeps probing and resumes with
    /// nothing lost if the peer is heard again within [`Config::ride_through`].
    pub idle_timeout: Duration,
    /// The session is declared down when nothing authentic arrived for this long (at least
    /// `idle_timeout`): the outage a session rides through — a link flap, a switch reboot,
    /// a peer descheduled for seconds. Equal to `idle_timeout`, a silent link is down at once.
    pub ride_through: Duration,
    /// Resend the handshake frame this often.
    pub handshake_retry: Duration,
    /// Give up the handshake after this long.
    pub handshake_timeout: Duration,
    /// Tag every frame with a MAC under the session key. Off only for trusted fabrics; the
    /// session authenticates if either side asks (docs/wire-protocol.md, *Options*).
    pub authenticate_frames: bool,
    /// Encrypt DATA frame bodies (AES-128-GCM under the session's per-direction keys), for
    /// fabrics others can read. The session encrypts if either side asks; encryption
    /// implies authentication.
    pub encrypt_frames: bool,
    /// Resend a frame after a few measured round trips (a tail-loss probe) instead of the
    /// replay timeout where at most two frames are unacknowledged (request and response).
    pub tail_loss_probe: bool,
    /// Ask for selective acknowledgements: the receiver says which frames beyond a gap it
    /// holds, and the sender resends only what is missing (used where both sides ask).
    pub selective_ack: bool,
    /// Frames sent under one key before the sender updates it (the key update keeps the
    /// session: docs/wire-protocol.md, *Key update*). 16..=2^23.
    pub key_update_frames: u64,
}

/// [`Config::ride_through`]'s default: 10 s of silence before a session is declared down
/// (docs/reliability.md argues it: a switch reboot or a routing change takes seconds, and a
/// dead box's devices are removed this much later than they would be at once).
pub const DEFAULT_RIDE_THROUGH: Duration = Duration::from_secs(10);

/// The most TLPs a send queue of one class holds ([`Config::max_queued`]).
pub const MAX_QUEUED: usize = 65536;
/// The most bytes the replay buffer (and the out-of-order buffer) of one session may hold:
/// window × MTU.
pub const MAX_WINDOW_BYTES: usize = 96 << 20;

impl Config {
    /// Defaults for a datacenter network with the given key: MTU 1472, window and credits
    /// sized for [`DEFAULT_PATH_BANDWIDTH`] and [`DEFAULT_PATH_RTT`]
    /// ([`Config::size_for_path`]).
    pub fn new(psk: PresharedKey) -> Config {
        let mut c = Config {
            psk,
            mtu: 1472,
            window: 128,
            credits: CreditGrant::default(),
            max_queued: 1024,
            replay_timeout: Duration::from_millis(2),
            max_replay_timeout: Duration::from_millis(200),
            ack_delay: Duration::from_micros(50),
            keepalive_interval: Duration::from_millis(100),
            idle_timeout: Duration::from_secs(1),
            ride_through: DEFAULT_RIDE_THROUGH,
            handshake_retry: Duration::from_millis(100),
            handshake_timeout: Duration::from_secs(5),
            authenticate_frames: true,
            encrypt_frames: false,
            selective_ack: true,
            tail_loss_probe: true,
            key_update_frames: crate::keys::DEFAULT_KEY_UPDATE_FRAMES,
        };
        c.size_for_path(DEFAULT_PATH_BANDWIDTH, DEFAULT_PATH_RTT);
        c
    }

    /// Sizes what may be in flight for a path of `bandwidth` bytes per second and round trip
    /// `rtt` at this MTU: twice bandwidth × delay — the pipe full, and as much again for the
    /// receiver's turnaround and a delayed acknowledgement — in unacknowledged frames
    /// (`window`, 128..=4096) and in the credits granted each class (data credits of 16
    /// bytes, at least 64 KiB; header credits one per 256 bytes, at least 256). A bulk
    /// transfer's rate is bounded by in-flight bytes ÷ round trip; with 64 KiB of credits
    /// the bridges carried at most ≈ 1.6 GB/s on loopback (docs/performance.md). At most
    /// [`MAX_IN_FLIGHT`] per class, whatever the path says.
    pub fn size_for_path(&mut self, bandwidth: u64, rtt: Duration) {
        let in_flight = (2u128.saturating_mul(bandwidth as u128).saturating_mul(rtt.as_nanos())
            / 1_000_000_000)
            .clamp(64 << 10, MAX_IN_FLIGHT as u128) as u64;
        let payload =
            self.mtu.saturating_sub(crate::wire::BODY_AT + crate::wire::TRAILER_LEN).max(256) as u64;
        self.window = in_flight.div_ceil(payload).clamp(128, 4096) as u32;
        let data = in_flight.div_ceil(16).max(4096) as u32;
        let header = (in_flight / 256).max(256) as u32;
        self.credits =
            CreditGrant { posted: (header, data), non_posted: (header, data), completion: (header, data) };
    }

    /// Checks every setting, naming the one at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &'static str, value: String, problem: &'static str| {
            Err(ConfigError::Invalid { key, value, problem })
        };
        // Room for one TLP with a 256-byte payload, and within a UDP datagram.
        let min_mtu = HEADER_LEN + FC_LEN + TRAILER_LEN + 2 + 16 + 256 + 4;
        if self.mtu < min_mtu || self.mtu > 65507 {
            return bad(
                "mtu",
                self.mtu.to_string(),
                "must be 354..=65507 bytes (a 256-byte-payload TLP, and a UDP datagram)",
            );
        }
        if self.window == 0 || self.window > 4096 {
            return bad("window", self.window.to_string(), "must be 1..=4096 frames");
        }
        if self.max_queued == 0 || self.max_queued > MAX_QUEUED {
            return bad(
                "max_queued",
                self.max_queued.to_string(),
                "must be 1..=65536 TLPs per class (the send queues are bounded by it)",
            );
        }
        // The replay and out-of-order buffers each hold up to window × MTU bytes: bounded,
        // per session (design invariant: memory per session is bounded by configuration).
        if self.window as usize * self.mtu > MAX_WINDOW_BYTES {
            return bad(
                "window",
                format!("{} (× mtu {} = {} bytes)", self.window, self.mtu, self.window as usize * self.mtu),
                "window × mtu must be at most 96 MiB (each of the replay and out-of-order buffers holds that much)",
            );
        }
        for (key, (h, d)) in [
            ("credits.posted", self.credits.posted),
            ("credits.non_posted", self.credits.non_posted),
            ("credits.completion", self.credits.completion),
        ] {
            if h == 0 || d < 256 {
                return bad(
                    key,
                    format!("({h}, {d})"),
                    "needs at least 1 header and 256 data credits (one 4 KiB TLP)",
                );
            }
        }
        if self.replay_timeout.is_zero() || self.replay_timeout > self.max_replay_timeout {
            return bad(
                "replay_timeout",
                format!("{:?}", self.replay_timeout),
                "must be non-zero and at most max_replay_timeout",
            );
        }
        if self.keepalive_interval.is_zero() || self.keepalive_interval >= self.idle_timeout {
            return bad(
                "keepalive_interval",
                format!("{:?}", self.keepalive_interval),
                "must be non-zero and below idle_timeout",
            );
        }
        if self.ride_through < self.idle_timeout {
            return bad(
                "ride_through",
                format!("{:?} (idle_timeout {:?})", self.ride_through, self.idle_timeout),
                "must be at least idle_timeout (the link is silent first, then down)",
            );
        }
        if !(16..=1 << 23).contains(&self.key_update_frames) {
            return bad(
                "key_update_frames",
                self.key_update_frames.to_string(),
                "must be 16..=8388608 (AES-GCM's limit for one key is 2^23 frames)",
            );
        }
        if self.handshake_retry.is_zero() || self.handshake_retry > self.handshake_timeout {
            return bad(
                "handshake_retry",
                format!("{:?}", self.handshake_retry),
                "must be non-zero and at most handshake_timeout",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mtu: usize) -> Config {
        let mut c = Config::new(
            PresharedKey::new(b"0123456789abcdef0123456789abcdef").unwrap_or_else(|| unreachable!()),
        );
        c.mtu = mtu;
        c
    }

    #[test]
    fn the_path_sizes_window_and_credits_to_twice_bandwidth_times_delay() {
        let mut c = cfg(9000);
        // 25 Gbit/s × 100 µs × 2 = 625,000 bytes: 39,063 data credits, 2,441 headers, 76
        // frames of 8,9xx bytes (the window stays at its floor of 128).
        c.size_for_path(DEFAULT_PATH_BANDWIDTH, DEFAULT_PATH_RTT);
        assert_eq!(c.credits.posted, (2441, 39_063));
        assert_eq!(c.credits.completion, c.credits.posted);
        assert_eq!(c.window, 128);
        let mut c = cfg(1472);
        c.size_for_path(DEFAULT_PATH_BANDWIDTH, DEFAULT_PATH_RTT);
        assert_eq!(
            c.window,
            625_000u64.div_ceil(1472 - (crate::wire::BODY_AT + crate::wire::TRAILER_LEN) as u64) as u32
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_window_times_mtu_past_96_mib_or_a_queue_past_65536_is_refused() {
        let mut c = cfg(65507);
        c.window = 4096;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("window") && e.contains("268316672 bytes"), "{e}");
        c.window = 1024;
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        // What the path sizing gives at the largest MTU stays within the bound.
        c.size_for_path(u64::MAX, Duration::MAX);
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        c.max_queued = 100_000_000;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("max_queued") && e.contains("100000000"), "{e}");
    }

    #[test]
    fn a_path_at_the_edges_sizes_within_the_bounds() {
        for (bw, rtt) in [(0, Duration::ZERO), (u64::MAX, Duration::MAX), (1, Duration::from_nanos(1))] {
            let mut c = cfg(1472);
            c.size_for_path(bw, rtt);
            assert!(c.validate().is_ok(), "{bw} {rtt:?}: {:?}", c.validate());
            assert!((128..=4096).contains(&c.window));
            let (h, d) = c.credits.posted;
            assert!(d as u64 * 16 <= MAX_IN_FLIGHT + 16 && d >= 4096 && h >= 256, "{bw} {rtt:?}: {h} {d}");
        }
    }
}
