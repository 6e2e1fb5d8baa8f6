//! What the vfio-user server accepts and announces, and how long it waits for a client.

use std::time::Duration;

use super::proto;

/// Largest `count` of a region or DMA transfer this server accepts (and announces).
pub const MAX_DATA_XFER: u32 = 1 << 20;
/// File descriptors accepted in one message (and announced; QEMU refuses a server that
/// announces more than 16).
pub const MAX_MSG_FDS: u32 = 16;
/// DMA windows a client may have mapped at once (and announced).
pub const MAX_DMA_MAPS: u32 = 65535;
/// Largest message accepted: a REGION_WRITE of [`MAX_DATA_XFER`] bytes.
pub const MAX_MESSAGE: u32 = proto::HEADER_LEN as u32 + 16 + MAX_DATA_XFER;
/// Size of the config region (PCI Express extended config space).
pub const CONFIG_SIZE: u64 = 4096;
/// How long a client may leave its replies untaken before it is treated as gone.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a message may take to arrive whole once its first bytes have: a client stalled
/// mid-message is dropped after it (the link is driven all the while).
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the client may take to answer a DMA_READ / DMA_WRITE of this side's. The device
/// DMA that asked for it waits, and the link is not driven meanwhile, so this stays well
/// inside the box's idle timeout (1 s by default); a client that does not answer in time is
/// dropped and the device's access fails (Unsupported Request).
pub const DMA_REPLY_TIMEOUT: Duration = Duration::from_millis(200);
/// Bytes of replies a client may leave untaken before it is treated as gone.
pub const MAX_UNSENT: usize = 4 * MAX_MESSAGE as usize;
