//! What one acquisition is made of: the request id that tells a retry from a new call, the
//! lease terms asked for, and the grant the server answered.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::protocol::keys::push_digits;

/// A request id, unique across every client and process: it tells a retry apart from a new
/// call, and a new acquisition is named after it (the lock's `gen`), so that an acquisition id
/// names one acquisition of one owner anywhere. That lets a renewal check owner and
/// acquisition with one field (see `renew_batch.lua`).
///
/// It is a random prefix drawn once per process (22 characters, 128 bits of a v4 UUID), then
/// a counter in hex: unique within the process by the counter, and between processes as
/// owner ids are (a client's id is a v4 UUID too). Short, because the renewal of every held
/// lock sends it: Redis's Lua hashes every byte of an argument.
pub(crate) fn request_id() -> String {
    static PREFIX: LazyLock<String> = LazyLock::new(|| compact(uuid::Uuid::new_v4().as_u128()));
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut id = String::with_capacity(PREFIX.len() + 16);
    id.push_str(&PREFIX);
    push_digits::<16>(&mut id, NEXT.fetch_add(1, Ordering::Relaxed));
    id
}

/// `v` in 22 characters of the URL-safe base64 alphabet (no `/`, `{` or `}`).
fn compact(mut v: u128) -> String {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..22)
        .map(|_| {
            let d = DIGITS[(v & 63) as usize];
            v >>= 6;
            char::from(d)
        })
        .collect()
}

/// The lease terms of one acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    /// Renewed by the renewal thread (false: a fixed lease).
    pub(crate) watchdog: bool,
    /// Renewal stops this long after the acquisition.
    pub(crate) max_hold: Option<Duration>,
}

/// What a successful acquire script returned, and when it was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant<'a> {
    pub(crate) token: u64,
    pub(crate) count: u64,
    pub(crate) sent: Instant,
    /// The acquisition the server says this grant belongs to (the lock's `gen`).
    pub(crate) acquisition: &'a str,
    /// The last fencing token reserved for local hand-offs of a new acquisition (`token`:
    /// none).
    pub(crate) last: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_short_and_distinct() {
        let ids: Vec<String> = (0..1000).map(|_| request_id()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            assert_eq!(id[..22], ids[0][..22], "one prefix per process");
            assert!(id.len() <= 22 + 16, "{id}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{id}"
            );
        }
        assert_eq!(compact(0), "A".repeat(22));
        assert_eq!(compact(u128::MAX).len(), 22);
        assert_ne!(compact(1 << 127), compact(1 << 126));
    }
}
