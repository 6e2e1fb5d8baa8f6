//! The hosts a running box accepts, changed by a reload without touching anyone else: a host
//! removed (its sessions end, the devices it holds are released and reset, its key
//! forgotten) and a host re-keyed with an overlap (the new key accepted at once, the old one
//! for a stated time more, then the sessions made with it end), as operators rotate
//! credentials one client at a time.

use std::time::{Duration, Instant};

use link::PresharedKey;

use crate::endpoint::GpuEndpoint;
use crate::error::GpuError;
use crate::export::release;
use crate::spec::RetiringKey;

impl GpuEndpoint {
    /// Stops accepting host `name`: its sessions end (closed: the host sees the link go
    /// down), each device it holds is released and reset, its keys — current and retiring —
    /// are forgotten.
    pub fn remove_host(&mut self, name: &str) -> Result<(), GpuError> {
        let Some(i) = self.keys.iter().position(|k| k.name == name) else {
            return Err(GpuError::Config(format!("host {name}: not known here")));
        };
        let mut ids = vec![self.keys.remove(i).key.key_id()];
        ids.extend(self.retiring.iter().filter(|r| r.host == name).map(|r| r.key_id));
        self.retiring.retain(|r| r.host != name);
        for id in ids {
            self.hosts.remove(&id);
            self.runner.endpoint.remove_key(id);
            self.end_sessions_of_key(id, "its host was removed from the configuration");
        }
        log::info!(host = name; "host {name} removed: its sessions ended, its devices released");
        Ok(())
    }

    /// Host `name`'s new key: accepted from now on; the key it had is accepted for `overlap`
    /// more (new sessions too), after which the sessions made with it end and their devices
    /// are released. Sessions made with the new key, and every other host's, are untouched.
    pub fn rekey_host(&mut self, name: &str, key: PresharedKey, overlap: Duration) -> Result<(), GpuError> {
        let new_id = key.key_id();
        if let Some(other) = self.hosts.get(&new_id).filter(|h| h.as_str() != name) {
            return Err(GpuError::Config(format!("host {name}: its new key is host '{other}''s")));
        }
        let Some(entry) = self.keys.iter_mut().find(|k| k.name == name) else {
            return Err(GpuError::Config(format!("host {name}: not known here")));
        };
        let old_id = entry.key.key_id();
        if old_id == new_id {
            return Ok(());
        }
        entry.key = key.clone();
        self.hosts.insert(new_id, name.to_string());
        self.runner.endpoint.add_key(key);
        // A key retiring already and given back now is current again.
        self.retiring.retain(|r| r.key_id != new_id);
        let until = Instant::now() + overlap;
        self.retiring.push(RetiringKey { host: name.to_string(), key_id: old_id, until });
        log::info!(
            host = name;
            "host {name} re-keyed: its new key is accepted now, its old one for {overlap:?} more; the \
             sessions made with the old key then end"
        );
        Ok(())
    }

    /// Forgets the retiring keys whose time is up and ends their sessions. True if any.
    pub(crate) fn retire_expired_keys(&mut self) -> bool {
        let now = Instant::now();
        let (expired, kept): (Vec<RetiringKey>, Vec<RetiringKey>) =
            std::mem::take(&mut self.retiring).into_iter().partition(|r| r.until <= now);
        self.retiring = kept;
        for r in &expired {
            self.hosts.remove(&r.key_id);
            self.runner.endpoint.remove_key(r.key_id);
            let ended = self.end_sessions_of_key(r.key_id, "the key it was made with was retired");
            log::info!(
                host = r.host.as_str();
                "host {}'s old key retired: {ended} session(s) made with it ended", r.host
            );
        }
        !expired.is_empty()
    }

    /// Ends every session made with key `key_id`, releasing the device it holds; how many.
    fn end_sessions_of_key(&mut self, key_id: [u8; 8], why: &str) -> usize {
        self.end_sessions_where(|_, s| (s.key_id() == key_id).then(|| why.to_string()))
    }

    /// Ends each live session for which `why` gives a reason (from its host's address and
    /// the session): the device it holds released and reset, the session closed (its host
    /// sees the link go down), the reason logged. How many.
    pub(crate) fn end_sessions_where(
        &mut self,
        mut why: impl FnMut(std::net::SocketAddr, &link::Session) -> Option<String>,
    ) -> usize {
        let GpuEndpoint { runner, exports, sessions, journal, .. } = self;
        let now = runner.clock.now();
        let mut ended = 0;
        for (sid, peer, s) in runner.endpoint.sessions() {
            if s.is_down() {
                continue;
            }
            let Some(why) = why(peer, s) else { continue };
            if let Some(info) = sessions.get_mut(&sid)
                && let Some(d) = info.device.take()
            {
                release(&mut exports[d], &why, journal);
            }
            log::warn!(session = format!("{sid:#010x}").as_str(); "session {sid:#010x} ended: {why}");
            s.close(now);
            ended += 1;
        }
        let _ = runner.transmit();
        ended
    }
}
