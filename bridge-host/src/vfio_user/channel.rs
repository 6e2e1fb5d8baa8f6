//! One client connection as a non-blocking channel: what arrives is framed into whole
//! messages (`proto::Framer`, descriptors kept with the message they came with), what is
//! sent waits in a bounded queue while the client does not read. A client that stalls in
//! the middle of a message, or takes no replies, is found here and dropped; a DMA_READ /
//! DMA_WRITE this server sends waits a bounded time for the client's reply.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

use super::limits::{
    CLIENT_TIMEOUT, DMA_REPLY_TIMEOUT, MAX_MESSAGE, MAX_MSG_FDS, MAX_UNSENT, MESSAGE_TIMEOUT,
};
use super::proto::{self, Header, cmd, errno};

/// One message as received: header, payload, descriptors.
pub(super) struct Message {
    pub(super) header: Header,
    pub(super) payload: Vec<u8>,
    pub(super) fds: Vec<OwnedFd>,
}

/// Why reading a message failed.
pub(super) enum RecvError {
    /// The client closed the connection (between messages).
    Closed,
    /// The message cannot be used; the connection cannot go on (framing lost).
    Fatal(String),
    /// The message was too large: its payload was skipped; it gets an error reply.
    TooLarge(Header),
}

/// Bytes read from the client socket per system call at most.
pub(super) const READ_CHUNK: usize = 64 << 10;

/// The connection to the current client, shared with the DMA windows it did not map.
///
/// Non-blocking both ways, so that no client can hold the thread that also drives the link:
/// bytes are read as they come and messages taken once whole ([`Channel::fill`],
/// [`Channel::next_message`]); replies wait in `tx` until the client takes them
/// ([`Channel::flush`]). A client that leaves a message unfinished for
/// [`MESSAGE_TIMEOUT`], takes none of its replies for [`CLIENT_TIMEOUT`], lets more than
/// [`MAX_UNSENT`] bytes of them pile up, or does not answer a DMA_READ / DMA_WRITE within
/// [`DMA_REPLY_TIMEOUT`] is dropped — the client, never the device.
pub(super) struct Channel {
    pub(super) stream: UnixStream,
    /// Bytes of messages not yet taken (at most one message and a read's worth).
    pub(super) rx: proto::Framer,
    /// Descriptors that came with them (they go with the next whole message).
    pub(super) rx_fds: Vec<OwnedFd>,
    /// Since when a message has been arriving.
    pub(super) partial_since: Option<Instant>,
    pub(super) scratch: Vec<u8>,
    /// Replies and commands of this side the client has not taken yet, from `tx_sent` on.
    pub(super) tx: Vec<u8>,
    pub(super) tx_sent: usize,
    /// Since when the client has taken none of `tx`.
    pub(super) tx_stuck_since: Option<Instant>,
    /// Commands that arrived while this side waited for a reply of the client's.
    pub(super) deferred: VecDeque<Message>,
    pub(super) next_id: u16,
    /// The client's limit for DMA_READ / DMA_WRITE counts.
    pub(super) peer_max_xfer: u32,
    pub(super) gone: bool,
    /// Why a DMA_READ / DMA_WRITE of this side's failed for want of an answer, for the
    /// server loop to drop the client.
    pub(super) lost: Option<String>,
}

impl Channel {
    pub(super) fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            rx: proto::Framer::new(MAX_MESSAGE),
            rx_fds: Vec::new(),
            partial_since: None,
            scratch: vec![0u8; READ_CHUNK],
            tx: Vec::new(),
            tx_sent: 0,
            tx_stuck_since: None,
            deferred: VecDeque::new(),
            next_id: 0,
            peer_max_xfer: 1 << 20,
            gone: false,
            lost: None,
        }
    }

    /// Queues `bytes` for the client and sends what the socket takes now.
    pub(super) fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.tx.len() - self.tx_sent + bytes.len() > MAX_UNSENT {
            self.gone = true;
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("the client left over {MAX_UNSENT} bytes of replies untaken"),
            ));
        }
        self.tx.extend_from_slice(bytes);
        self.flush()
    }

    /// Sends what is queued, as far as the socket takes it without waiting.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        while self.tx_sent < self.tx.len() {
            match (&self.stream).write(&self.tx[self.tx_sent..]) {
                Ok(0) => {
                    self.gone = true;
                    return Err(io::Error::new(io::ErrorKind::WriteZero, "the client's socket took nothing"));
                }
                Ok(n) => {
                    self.tx_sent += n;
                    self.tx_stuck_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.tx_stuck_since.get_or_insert_with(Instant::now);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.gone = true;
                    return Err(e);
                }
            }
        }
        self.tx.clear();
        self.tx_sent = 0;
        self.tx_stuck_since = None;
        Ok(())
    }

    pub(super) fn has_unsent(&self) -> bool {
        self.tx_sent < self.tx.len()
    }

    /// Reads what the socket has now (without waiting), collecting descriptors, until it has
    /// nothing more or a whole message of the largest size is here.
    pub(super) fn fill(&mut self) -> Result<(), RecvError> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_MSG_FDS as usize))];
        while self.rx.wants_more() {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut self.scratch)];
            let r = match rustix::net::recvmsg(
                &self.stream,
                &mut iov,
                &mut control,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            ) {
                Ok(r) => r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::CONNRESET) => return Err(RecvError::Closed),
                Err(e) => return Err(RecvError::Fatal(format!("reading from the client: {e}"))),
            };
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(it) = m {
                    self.rx_fds.extend(it);
                }
            }
            if r.flags.contains(ReturnFlags::CTRUNC) || self.rx_fds.len() > MAX_MSG_FDS as usize {
                return Err(RecvError::Fatal(format!(
                    "more than {MAX_MSG_FDS} file descriptors in one message"
                )));
            }
            if r.bytes == 0 {
                return match self.rx.in_message() {
                    false => Err(RecvError::Closed),
                    true => Err(RecvError::Fatal(format!(
                        "connection closed {} bytes into a message",
                        self.rx.progress()
                    ))),
                };
            }
            self.rx.push(&self.scratch[..r.bytes]);
            self.partial_since.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    /// The next whole message among the bytes read, if there is one.
    pub(super) fn next_message(&mut self) -> Option<Result<Message, RecvError>> {
        let taken = self.rx.next().map(|f| match f {
            proto::Framed::Message(header, payload) => {
                Ok(Message { header, payload, fds: std::mem::take(&mut self.rx_fds) })
            }
            proto::Framed::TooLarge(h) => {
                self.rx_fds.clear();
                Err(RecvError::TooLarge(h))
            }
            proto::Framed::Broken(h) => Err(RecvError::Fatal(format!(
                "message {} ({}) claims {} bytes, less than its header",
                h.id,
                cmd::name(h.command),
                h.size
            ))),
        });
        if !self.rx.in_message() {
            self.partial_since = None;
        } else if taken.is_some() {
            // The next message's bytes have been arriving since now, at the latest.
            self.partial_since = Some(Instant::now());
        }
        taken
    }

    /// Why the client must be dropped for stalling, if it must.
    pub(super) fn stalled(&self, now: Instant) -> Option<String> {
        if let Some(t) = self.partial_since
            && now - t > MESSAGE_TIMEOUT
        {
            return Some(format!(
                "a message begun {:?} ago is still not whole ({} bytes of it here)",
                now - t,
                self.rx.progress()
            ));
        }
        if let Some(t) = self.tx_stuck_since
            && now - t > CLIENT_TIMEOUT
        {
            return Some(format!(
                "it has taken none of {} bytes of replies for {:?}",
                self.tx.len() - self.tx_sent,
                now - t
            ));
        }
        None
    }

    /// Waits up to `timeout` for the client's socket to be readable (or writable, while
    /// something waits to be sent).
    pub(super) fn wait(&self, timeout: Duration) {
        let events = if self.has_unsent() { PollFlags::IN | PollFlags::OUT } else { PollFlags::IN };
        let mut fds = [PollFd::new(&self.stream, events)];
        let ts = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }

    /// Sends a command of this side's and waits, up to [`DMA_REPLY_TIMEOUT`], for its reply;
    /// commands that arrive meanwhile are kept, in order, for the server loop.
    pub(super) fn call(&mut self, command: u16, payload: &[u8]) -> io::Result<Vec<u8>> {
        if self.gone {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "the client is gone"));
        }
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let msg = proto::message(id, command, proto::flags::COMMAND, 0, payload);
        self.send(&msg)?;
        let deadline = Instant::now() + DMA_REPLY_TIMEOUT;
        loop {
            let got = match self.next_message() {
                Some(m) => m,
                None => {
                    let now = Instant::now();
                    if now >= deadline {
                        let why =
                            format!("it did not answer {} within {DMA_REPLY_TIMEOUT:?}", cmd::name(command));
                        self.gone = true;
                        self.lost = Some(why.clone());
                        return Err(io::Error::new(io::ErrorKind::TimedOut, why));
                    }
                    self.wait(deadline - now);
                    self.flush()?;
                    match self.fill() {
                        Ok(()) => continue,
                        Err(e) => Err(e),
                    }
                }
            };
            match got {
                Ok(m) if m.header.is_reply() && m.header.id == id && m.header.command == command => {
                    if m.header.flags & proto::flags::ERROR != 0 {
                        return Err(io::Error::other(format!(
                            "the client answered {} with error {}",
                            cmd::name(command),
                            m.header.error
                        )));
                    }
                    return Ok(m.payload);
                }
                Ok(m) if m.header.is_command() => self.deferred.push_back(m),
                Ok(m) => log::warn!(
                    "vfio-user: unexpected reply {} to {}; dropped",
                    m.header.id,
                    cmd::name(m.header.command)
                ),
                Err(RecvError::TooLarge(h)) => self.send(&proto::error_reply(&h, errno::E2BIG))?,
                Err(RecvError::Closed) => {
                    self.gone = true;
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client closed the connection",
                    ));
                }
                Err(RecvError::Fatal(why)) => {
                    self.gone = true;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, why));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::{AsFd, BorrowedFd};

    use super::*;

    fn pair() -> (Channel, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (Channel::new(a), b)
    }

    fn header(command: u16, size: u32) -> [u8; proto::HEADER_LEN] {
        Header { id: 3, command, size, flags: proto::flags::COMMAND, error: 0 }.emit()
    }

    #[test]
    fn a_message_is_taken_only_once_whole_whatever_pieces_it_comes_in() {
        let (mut c, peer) = pair();
        let m = proto::message(3, cmd::VERSION, proto::flags::COMMAND, 0, b"0123456789");
        for (i, b) in m.iter().enumerate() {
            (&peer).write_all(&[*b]).unwrap();
            c.fill().ok().unwrap();
            let got = c.next_message();
            if i + 1 < m.len() {
                assert!(got.is_none(), "taken after {} of {} bytes", i + 1, m.len());
                assert!(c.partial_since.is_some());
            } else {
                let got = got.unwrap().ok().unwrap();
                assert_eq!((got.header.command, &got.payload[..]), (cmd::VERSION, &b"0123456789"[..]));
            }
        }
        assert!(c.partial_since.is_none() && !c.rx.in_message());
    }

    #[test]
    fn a_message_left_unfinished_is_a_stall_after_the_message_timeout() {
        let (mut c, peer) = pair();
        (&peer).write_all(&header(cmd::VERSION, 40)[..8]).unwrap();
        c.fill().ok().unwrap();
        assert!(c.next_message().is_none());
        let now = Instant::now();
        assert!(c.stalled(now).is_none());
        let why = c.stalled(now + MESSAGE_TIMEOUT + Duration::from_millis(10)).unwrap();
        assert!(why.contains("8 bytes"), "{why}");
    }

    #[test]
    fn an_oversized_message_is_skipped_as_it_arrives_and_the_next_one_read() {
        let (mut c, peer) = pair();
        let size = MAX_MESSAGE + 1000;
        let writer = std::thread::spawn(move || {
            (&peer).write_all(&header(cmd::REGION_WRITE, size)).unwrap();
            (&peer).write_all(&vec![0u8; (size as usize) - proto::HEADER_LEN]).unwrap();
            (&peer).write_all(&proto::message(4, cmd::VERSION, proto::flags::COMMAND, 0, b"x")).unwrap();
            peer
        });
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.len() < 2 && Instant::now() < deadline {
            c.wait(Duration::from_millis(10));
            c.fill().ok().unwrap();
            while let Some(m) = c.next_message() {
                seen.push(match m {
                    Err(RecvError::TooLarge(h)) => ("too large", h.size),
                    Ok(m) => ("message", m.header.size),
                    Err(_) => ("error", 0),
                });
            }
            // Never more than one largest message and a read held.
            assert!(c.rx.held() <= MAX_MESSAGE as usize + READ_CHUNK);
        }
        let _peer = writer.join().unwrap();
        assert_eq!(seen, [("too large", size), ("message", proto::HEADER_LEN as u32 + 1)]);
    }

    #[test]
    fn a_client_that_takes_no_replies_is_dropped_by_time_or_by_volume() {
        let (mut c, _peer) = pair();
        // Replies pile up once the socket's buffer is full; none is lost while they do.
        let reply = vec![0u8; 64 << 10];
        while !c.has_unsent() {
            c.send(&reply).unwrap();
        }
        let now = Instant::now();
        assert!(c.stalled(now).is_none());
        let why = c.stalled(now + CLIENT_TIMEOUT + Duration::from_millis(10)).unwrap();
        assert!(why.contains("taken none"), "{why}");
        // And past MAX_UNSENT bytes at once, whatever the time.
        let mut refused = false;
        for _ in 0..=(MAX_UNSENT / reply.len()) {
            if c.send(&reply).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused && c.gone, "{} bytes queued", c.tx.len() - c.tx_sent);
        assert!(c.tx.len() - c.tx_sent <= MAX_UNSENT);
    }

    #[test]
    fn a_dma_read_the_client_never_answers_fails_within_the_reply_timeout() {
        let (mut c, peer) = pair();
        let t = Instant::now();
        let e = c.call(cmd::DMA_READ, &proto::dma_read(0x1000, 8)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() < DMA_REPLY_TIMEOUT + Duration::from_millis(100), "{:?}", t.elapsed());
        assert!(c.gone && c.lost.is_some());
        drop(peer);
    }

    #[test]
    fn descriptors_beyond_the_limit_end_the_connection() {
        let (mut c, peer) = pair();
        let files: Vec<File> = (0..9).map(|_| File::open("/dev/null").unwrap()).collect();
        for chunk in files.chunks(8).chain(files.chunks(8)) {
            let fds: Vec<BorrowedFd<'_>> = chunk.iter().map(|f| f.as_fd()).collect();
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
            rustix::net::sendmsg(
                &peer,
                &[io::IoSlice::new(&[0u8])],
                &mut control,
                rustix::net::SendFlags::empty(),
            )
            .unwrap();
        }
        // 8 + 1 + 8 + 1 descriptors with 4 bytes of a header: more than one message may carry.
        let r = c.fill();
        assert!(matches!(r, Err(RecvError::Fatal(ref why)) if why.contains("file descriptors")));
    }
}
