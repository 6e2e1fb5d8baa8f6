//! What both bridges share above the link.
#![forbid(unsafe_code)]

pub mod attach;
