//! How the leases due in one round are split into script calls: a pure function, no I/O.
//!
//! One renew call covers many leases (`renew_batch.lua`), so Redis runs one script per call
//! instead of one per lease. Two rules bound a call:
//!
//! - at most [`MAX_PER_CALL`] leases, so that Redis is never busy with one call for long
//!   (other clients' commands wait while a script runs);
//! - with `one_slot` (a topology that spreads keys over Redis Cluster slots), never two slots
//!   in one call: a script may only touch keys of one slot there. Without it (one master, or
//!   a quorum of independent masters), leases of any slots share a call.
//!
//! With `one_slot`, leases are ordered by slot first (a stable sort: the caller's order within a
//! slot is kept). Without it, the caller's order is kept: the renewal thread orders leases by
//! lease, so that a call sends each lease once per run (see `renew_batch.lua`).

/// The most leases one renew call covers.
///
/// A lease's own work in `renew_batch.lua` (its two arguments, one `GETRANGE`, one `PEXPIREAT`) is
/// nearly all of a call's cost once a call covers a few dozen leases, so larger calls gain
/// little, while other clients' commands wait for as long as one call runs (a few hundred
/// microseconds for 128 leases; `cargo bench --bench locks -- --only renewal` measures the Redis
/// CPU per renewed lock).
pub(crate) const MAX_PER_CALL: usize = 128;

/// Splits leases (given by their slots, in any order) into calls: each call is a list of
/// indices into `slots`, with at most `max` entries (at least one), and, with `one_slot`, all
/// of one slot (ordered by slot; else in the given order). Every index is in exactly one call.
pub(crate) fn group(slots: &[u16], one_slot: bool, max: usize) -> Vec<Vec<usize>> {
    let max = max.max(1);
    let mut order: Vec<usize> = (0..slots.len()).collect();
    if one_slot {
        order.sort_by_key(|&i| slots[i]);
    }
    let mut calls: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match calls.last_mut() {
            Some(call) if call.len() < max && (!one_slot || slots[call[0]] == slots[i]) => {
                call.push(i);
            }
            _ => calls.push(vec![i]),
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(calls: &[Vec<usize>]) -> Vec<usize> {
        let mut all: Vec<usize> = calls.iter().flatten().copied().collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn nothing_due_is_no_call() {
        assert!(group(&[], false, 128).is_empty());
        assert!(group(&[], true, 128).is_empty());
    }

    #[test]
    fn mixed_slots_share_calls_when_allowed() {
        let slots = [9, 3, 3, 7, 1];
        let calls = group(&slots, false, 128);
        assert_eq!(calls, vec![vec![0, 1, 2, 3, 4]]);
    }

    #[test]
    fn a_call_never_mixes_slots_when_asked() {
        let slots = [9, 3, 3, 7, 1, 9];
        let calls = group(&slots, true, 128);
        assert_eq!(calls, vec![vec![4], vec![1, 2], vec![3], vec![0, 5]]);
        for call in &calls {
            assert!(call.iter().all(|&i| slots[i] == slots[call[0]]));
        }
    }

    #[test]
    fn calls_are_bounded_and_cover_every_lease_once() {
        let slots: Vec<u16> = (0..1000u32).map(|i| (i * 7919 % 16384) as u16).collect();
        for one_slot in [false, true] {
            for max in [1, 2, 128, 999, 1000, 5000] {
                let calls = group(&slots, one_slot, max);
                assert!(calls.iter().all(|c| !c.is_empty() && c.len() <= max));
                assert_eq!(flat(&calls), (0..1000).collect::<Vec<_>>());
                if !one_slot {
                    assert_eq!(calls.len(), 1000usize.div_ceil(max));
                }
            }
        }
        // Many leases of one slot are split by size too.
        let same = vec![42u16; 300];
        let calls = group(&same, true, 128);
        assert_eq!(
            calls.iter().map(Vec::len).collect::<Vec<_>>(),
            [128, 128, 44]
        );
        assert_eq!(flat(&calls), (0..300).collect::<Vec<_>>());
    }

    #[test]
    fn a_zero_bound_still_makes_progress() {
        assert_eq!(group(&[5, 5], false, 0), vec![vec![0], vec![1]]);
    }

    #[test]
    fn calls_follow_slot_order() {
        let slots = [16383, 0, 8000, 0, 16383];
        let calls = group(&slots, true, 128);
        let firsts: Vec<u16> = calls.iter().map(|c| slots[c[0]]).collect();
        assert_eq!(firsts, [0, 8000, 16383]);
    }
}
