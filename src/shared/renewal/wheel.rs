//! The timer wheel of the lease-renewal thread.
//!
//! Pure data-structure logic: time is an abstract, monotonically increasing number of
//! *ticks* (`u64`, the thread's milliseconds) handed in by the caller. The wheel never reads
//! a clock, never sleeps, never does I/O, and never panics on any input.
//!
//! A hashed wheel of [`SLOTS`] one-tick slots (a turn of about a second): an entry sits in the
//! slot of its deadline modulo [`SLOTS`], whatever the turn, and each slot keeps the earliest
//! deadline among its entries. So [`Wheel::next_deadline`] and [`Wheel::poll`] read the slots'
//! earliest deadlines only, and open just the slots that hold something due: a poll costs the
//! same after a jump of any length, and an entry of a later turn is only looked at when an
//! entry of its slot is due. The renewal thread's entries gather into a few batches per
//! renewal interval, so few slots are ever occupied.
//!
//! There is no cancellation: the caller cancels lazily (its items carry a flag checked when
//! they fire).

use std::fmt;

/// Number of slots, one tick each.
const SLOTS: usize = 1024;

/// A timer wheel mapping tick deadlines to items of type `T`.
///
/// Time starts at tick 0 and only moves forward, through [`Wheel::poll`].
/// Items come out of `poll` once their deadline is `<=` the polled tick; items
/// with equal deadlines come out in an unspecified order, but within one call
/// to `poll` items are emitted in nondecreasing deadline order.
pub(crate) struct Wheel<T> {
    /// The tick of the last poll: the wheel's notion of "now".
    elapsed: u64,
    /// Number of items currently held.
    len: usize,
    /// Each slot's `(deadline, item)` pairs, indexed by the deadline modulo [`SLOTS`].
    slots: Box<[Vec<(u64, T)>]>,
    /// The smallest deadline in each slot (`u64::MAX` when it is empty).
    earliest: Box<[u64]>,
}

/// The slot of a deadline.
fn slot_for(deadline: u64) -> usize {
    (deadline % SLOTS as u64) as usize
}

impl<T> Wheel<T> {
    /// Creates an empty wheel whose current time is tick 0.
    pub(crate) fn new() -> Self {
        Self {
            elapsed: 0,
            len: 0,
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            earliest: vec![u64::MAX; SLOTS].into_boxed_slice(),
        }
    }

    /// The current time: the tick passed to the last [`Wheel::poll`] (or the
    /// largest one, since time never goes back), 0 before the first poll.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn now(&self) -> u64 {
        self.elapsed
    }

    /// Schedules `item` to come out of the first [`Wheel::poll`] whose tick is
    /// `>= deadline`. A deadline `<= now()` makes it come out of the very next
    /// poll, whatever tick that poll is given. Any `u64` deadline is accepted,
    /// including `u64::MAX`.
    pub(crate) fn insert(&mut self, deadline: u64, item: T) {
        let slot = slot_for(deadline);
        self.slots[slot].push((deadline, item));
        self.earliest[slot] = self.earliest[slot].min(deadline);
        self.len = self.len.saturating_add(1);
    }

    /// The earliest deadline among the held items, or `None` when the wheel is
    /// empty. Exact: `poll(d)` with the returned `d` yields at least one item (an
    /// item inserted with a deadline `<= now()` makes it that past deadline, and the
    /// item comes out of the next poll whatever tick it is given).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        (self.len > 0).then(|| self.earliest.iter().copied().min().unwrap_or(u64::MAX))
    }

    /// Advances time to `now` and appends to `out` every item whose deadline is
    /// `<= now` (including all items inserted with a past deadline).
    ///
    /// A `now` smaller than [`Wheel::now`] is treated as `Wheel::now()`: time
    /// never goes back. Items are appended in nondecreasing deadline order.
    pub(crate) fn poll(&mut self, now: u64, out: &mut Vec<T>) {
        let now = now.max(self.elapsed);
        self.elapsed = now;
        let mut due = Vec::new();
        for (slot, earliest) in self.slots.iter_mut().zip(self.earliest.iter_mut()) {
            if *earliest > now {
                continue;
            }
            due.extend(slot.extract_if(.., |(deadline, _)| *deadline <= now));
            *earliest = slot.iter().map(|(d, _)| *d).min().unwrap_or(u64::MAX);
        }
        self.len = self.len.saturating_sub(due.len());
        due.sort_by_key(|(deadline, _)| *deadline);
        out.extend(due.into_iter().map(|(_, item)| item));
    }

    /// The number of items held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the wheel holds no item.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> Default for Wheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("len", &self.len)
            .field("now", &self.elapsed)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiny xorshift64* PRNG so the tests need no extra crates.
    struct XorShift(u64);

    impl XorShift {
        /// A generator seeded with `seed` (0 is remapped).
        fn new(seed: u64) -> Self {
            Self(if seed == 0 {
                0x9E37_79B9_7F4A_7C15
            } else {
                seed
            })
        }

        /// The next pseudo-random `u64`.
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// A pseudo-random value in `0..n` (`n > 0`).
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// A random offset whose magnitude is spread over all levels: a
        /// random bit width in `0..=64`, then a random value of that width.
        fn spread(&mut self) -> u64 {
            let bits = self.below(65) as u32;
            let v = self.next();
            if bits == 64 {
                v
            } else {
                v & ((1u64 << bits) - 1)
            }
        }
    }

    impl<T> Wheel<T> {
        /// Checks every structural invariant of the wheel (test helper).
        fn check_invariants(&self) {
            assert_eq!((self.slots.len(), self.earliest.len()), (SLOTS, SLOTS));
            let mut count = 0;
            for (s, entries) in self.slots.iter().enumerate() {
                let min = entries.iter().map(|e| e.0).min();
                assert_eq!(self.earliest[s], min.unwrap_or(u64::MAX), "slot {s}");
                for &(d, _) in entries {
                    assert_eq!(slot_for(d), s, "entry {d}");
                }
                count += entries.len();
            }
            assert_eq!(count, self.len);
        }
    }

    /// Polls and returns what came out.
    fn poll_vec<T>(w: &mut Wheel<T>, now: u64) -> Vec<T> {
        let mut out = Vec::new();
        w.poll(now, &mut out);
        w.check_invariants();
        out
    }

    /// Ticks around every level boundary plus extreme values.
    fn interesting_deadlines() -> Vec<u64> {
        let mut v = vec![0, 1, 2, 62, 63, 64, 65, 127, 128, 4095, 4096, 4097];
        for k in 1..=10u32 {
            let b = 1u64 << (6 * k);
            v.extend([b - 1, b, b + 1, b.saturating_mul(3) + 7]);
        }
        v.extend([
            1 << 63,
            (1 << 63) - 1,
            u64::MAX / 2,
            u64::MAX / 2 + 1,
            u64::MAX - 64,
            u64::MAX - 1,
            u64::MAX,
        ]);
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn empty_wheel() {
        let mut w: Wheel<u32> = Wheel::new();
        assert!(w.is_empty());
        assert_eq!(w.len(), 0);
        assert_eq!(w.now(), 0);
        assert_eq!(w.next_deadline(), None);
        w.check_invariants();
        assert!(poll_vec(&mut w, 0).is_empty());
        assert!(poll_vec(&mut w, 1_000_000_000).is_empty());
        assert_eq!(w.now(), 1_000_000_000);
        assert!(poll_vec(&mut w, u64::MAX).is_empty());
        assert_eq!(w.now(), u64::MAX);
        assert_eq!(w.next_deadline(), None);

        let d: Wheel<String> = Wheel::default();
        assert!(d.is_empty());
        assert_eq!(d.now(), 0);
    }

    #[test]
    fn debug_shows_len_and_now() {
        struct NotDebug;
        let mut w = Wheel::new();
        w.insert(5, NotDebug);
        w.poll(3, &mut Vec::new());
        let s = format!("{w:?}");
        assert_eq!(s, "Wheel { len: 1, now: 3, .. }");
    }

    #[test]
    fn insert_at_zero_on_fresh_wheel_fires_next_poll() {
        let mut w = Wheel::new();
        w.insert(0, "a");
        assert_eq!(w.len(), 1);
        assert_eq!(w.next_deadline(), Some(0));
        assert_eq!(poll_vec(&mut w, 0), vec!["a"]);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn insert_past_and_now_deadlines() {
        let mut w = Wheel::new();
        assert!(poll_vec(&mut w, 1000).is_empty());
        w.insert(1000, 'n'); // == now
        w.insert(5, 'p'); // in the past
        w.insert(1001, 'f'); // future
        w.check_invariants();
        assert_eq!(w.len(), 3);
        // Never later than the earliest deadline, and <= now for past items.
        assert_eq!(w.next_deadline(), Some(5));
        // A poll at a stale tick is treated as now() and still drains them.
        let mut got = poll_vec(&mut w, 7);
        got.sort_unstable();
        assert_eq!(got, vec!['n', 'p']);
        assert_eq!(w.now(), 1000);
        assert_eq!(w.next_deadline(), Some(1001));
        assert!(poll_vec(&mut w, 1000).is_empty());
        assert_eq!(poll_vec(&mut w, 1001), vec!['f']);
        assert!(w.is_empty());
    }

    #[test]
    fn time_never_goes_back() {
        let mut w = Wheel::new();
        w.poll(100, &mut Vec::new());
        w.poll(50, &mut Vec::new());
        assert_eq!(w.now(), 100);
        w.insert(60, 1);
        w.insert(101, 2);
        assert_eq!(poll_vec(&mut w, 0), vec![1]);
        assert_eq!(w.now(), 100);
        assert_eq!(poll_vec(&mut w, 101), vec![2]);
    }

    #[test]
    fn fires_exactly_at_deadline_for_every_level() {
        for &d in &interesting_deadlines() {
            let mut w = Wheel::new();
            w.insert(d, d);
            w.check_invariants();
            assert_eq!(w.next_deadline(), Some(d));
            if d > 0 {
                assert!(
                    poll_vec(&mut w, d - 1).is_empty(),
                    "deadline {d} fired early"
                );
                assert_eq!(w.next_deadline(), Some(d));
            }
            assert_eq!(poll_vec(&mut w, d), vec![d], "deadline {d}");
            assert!(w.is_empty());
            assert_eq!(w.next_deadline(), None);
        }
    }

    #[test]
    fn fires_exactly_from_nonzero_start_times() {
        let starts = interesting_deadlines();
        for &start in &starts {
            for delta in [1u64, 2, 63, 64, 65, 4096, 1 << 36, 1 << 40, u64::MAX / 3] {
                let Some(d) = start.checked_add(delta) else {
                    continue;
                };
                let mut w = Wheel::new();
                w.poll(start, &mut Vec::new());
                w.insert(d, ());
                w.check_invariants();
                assert_eq!(w.next_deadline(), Some(d));
                assert!(poll_vec(&mut w, d - 1).is_empty(), "start {start} d {d}");
                assert_eq!(poll_vec(&mut w, d).len(), 1, "start {start} d {d}");
            }
        }
    }

    #[test]
    fn u64_max_deadline_and_time() {
        let mut w = Wheel::new();
        w.insert(u64::MAX, 1);
        w.insert(u64::MAX - 1, 2);
        w.insert(u64::MAX / 2, 3);
        assert_eq!(w.next_deadline(), Some(u64::MAX / 2));
        assert_eq!(poll_vec(&mut w, u64::MAX / 2), vec![3]);
        assert_eq!(w.next_deadline(), Some(u64::MAX - 1));
        assert!(poll_vec(&mut w, u64::MAX - 2).is_empty());
        assert_eq!(poll_vec(&mut w, u64::MAX), vec![2, 1]);
        assert_eq!(w.now(), u64::MAX);
        // Once time is at u64::MAX everything inserted is due.
        w.insert(u64::MAX, 4);
        w.insert(0, 5);
        assert_eq!(w.next_deadline(), Some(0));
        assert_eq!(poll_vec(&mut w, u64::MAX), vec![5, 4]); // deadline order
        assert!(w.is_empty());
    }

    #[test]
    fn large_jump_emits_everything_in_order() {
        let mut rng = XorShift::new(42);
        let mut w = Wheel::new();
        let mut expected = Vec::new();
        for i in 0..10_000u64 {
            let d = rng.below(1_000_000_001);
            w.insert(d, (d, i));
            expected.push((d, i));
        }
        // Some items beyond the jump must stay.
        w.insert(1_000_000_001, (1_000_000_001, 99_999));
        w.insert(u64::MAX, (u64::MAX, 100_000));
        w.check_invariants();
        let out = poll_vec(&mut w, 1_000_000_000);
        assert_eq!(out.len(), expected.len());
        assert!(
            out.windows(2).all(|p| p[0].0 <= p[1].0),
            "not in deadline order"
        );
        let mut sorted = out.clone();
        sorted.sort_unstable();
        expected.sort_unstable();
        assert_eq!(sorted, expected);
        assert_eq!(w.len(), 2);
        assert_eq!(w.next_deadline(), Some(1_000_000_001));
        assert_eq!(
            poll_vec(&mut w, 1_000_000_001),
            vec![(1_000_000_001, 99_999)]
        );
        assert_eq!(w.next_deadline(), Some(u64::MAX));
    }

    #[test]
    fn huge_sparse_jumps_are_cheap() {
        // Each poll crosses ~2^60 ticks; a tick-by-tick wheel would never end.
        let mut w = Wheel::new();
        let mut now = 0u64;
        for i in 0..1000u64 {
            let d = now.saturating_add((1 << 50) + i * 12_345);
            w.insert(d, i);
            let out = poll_vec(&mut w, d);
            assert_eq!(out, vec![i]);
            now = d;
        }
        assert!(w.is_empty());
    }

    #[test]
    fn len_and_is_empty_track_contents() {
        let mut w = Wheel::new();
        for i in 0..100u64 {
            w.insert(i * 100, i);
            assert_eq!(w.len(), i as usize + 1);
            assert!(!w.is_empty());
        }
        let mut out = Vec::new();
        w.poll(4950, &mut out);
        assert_eq!(out.len(), 50);
        assert_eq!(w.len(), 50);
        w.poll(9900, &mut out);
        assert_eq!(out.len(), 100);
        assert_eq!(w.len(), 0);
        assert!(w.is_empty());
        // Appends to `out`, never clears it.
        w.insert(9900, 1000);
        w.poll(9900, &mut out);
        assert_eq!(out.len(), 101);
    }

    #[test]
    fn equal_deadlines_all_come_out_together() {
        let mut w = Wheel::new();
        for i in 0..500 {
            w.insert(1 << 20, i);
        }
        assert!(poll_vec(&mut w, (1 << 20) - 1).is_empty());
        let mut out = poll_vec(&mut w, 1 << 20);
        out.sort_unstable();
        assert_eq!(out, (0..500).collect::<Vec<_>>());
    }

    /// Generates a deadline relative to `now` covering past, present, near
    /// and far future (including saturation at `u64::MAX`).
    fn random_deadline(rng: &mut XorShift, now: u64) -> u64 {
        match rng.below(8) {
            0 => now.saturating_sub(rng.below(100)),
            1 => now,
            2 => now.saturating_add(rng.below(64) + 1),
            3 => now.saturating_add(rng.below(1 << 13) + 1),
            4 => now.saturating_add(rng.below(1 << 24) + 1),
            5 => rng.next(), // anywhere, often far beyond any level's span
            6 => u64::MAX - rng.below(3),
            _ => now.saturating_add(rng.spread()),
        }
    }

    /// Generates the next poll tick from `now`: stale, small or huge steps.
    fn random_poll(rng: &mut XorShift, now: u64) -> u64 {
        match rng.below(6) {
            0 => now.saturating_sub(rng.below(10)),
            1 => now.saturating_add(rng.below(3)),
            2 => now.saturating_add(rng.below(200)),
            3 => now.saturating_add(rng.below(1 << 20)),
            4 => now.saturating_add(rng.spread()),
            _ => now.saturating_add(rng.spread() >> 8),
        }
    }

    #[test]
    fn random_against_reference_model() {
        for seed in 1..=40u64 {
            let mut rng = XorShift::new(seed.wrapping_mul(0xA076_1D64_78BD_642F));
            let mut w: Wheel<(u64, u64)> = Wheel::new();
            // Reference model: (deadline, id), sorted.
            let mut model: Vec<(u64, u64)> = Vec::new();
            let mut next_id = 0u64;
            let mut now = 0u64;
            for _round in 0..300 {
                for _ in 0..rng.below(20) {
                    let d = random_deadline(&mut rng, w.now());
                    w.insert(d, (d, next_id));
                    model.push((d, next_id));
                    next_id += 1;
                }
                model.sort_unstable();
                w.check_invariants();
                assert_eq!(w.len(), model.len());
                assert_eq!(w.is_empty(), model.is_empty());
                assert_eq!(w.next_deadline(), model.first().map(|e| e.0));

                let target = random_poll(&mut rng, now);
                now = now.max(target);
                let mut out = Vec::new();
                w.poll(target, &mut out);
                w.check_invariants();
                assert_eq!(w.now(), now);

                let split = model.partition_point(|e| e.0 <= now);
                let due: Vec<_> = model.drain(..split).collect();
                assert!(out.iter().all(|e| e.0 <= now), "item fired early");
                assert!(out.windows(2).all(|p| p[0].0 <= p[1].0), "out of order");
                let mut sorted = out.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, due, "seed {seed}: wrong set of fired items");
            }
            // Drain everything.
            let mut out = Vec::new();
            w.poll(u64::MAX, &mut out);
            out.sort_unstable();
            assert_eq!(out, model);
            assert!(w.is_empty());
        }
    }

    #[test]
    fn poll_output_is_in_deadline_order() {
        let mut rng = XorShift::new(7);
        for _ in 0..50 {
            let mut w = Wheel::new();
            let start = rng.spread() >> 2;
            w.poll(start, &mut Vec::new());
            for i in 0..300u64 {
                let d = start.saturating_add(rng.spread() >> rng.below(40));
                w.insert(d.max(start + 1), (d.max(start + 1), i));
            }
            let target = start.saturating_add(rng.spread());
            let out = poll_vec(&mut w, target);
            assert!(out.windows(2).all(|p| p[0].0 <= p[1].0));
            assert!(out.iter().all(|e| e.0 <= target));
        }
    }

    #[test]
    fn driving_loop_terminates_in_order() {
        for seed in 1..=20u64 {
            let mut rng = XorShift::new(seed);
            let mut w = Wheel::new();
            let start = rng.below(1 << 40);
            w.poll(start, &mut Vec::new());
            let n = 2000usize;
            let mut deadlines = Vec::with_capacity(n);
            for i in 0..n {
                let d = random_deadline(&mut rng, start);
                w.insert(d, (d, i));
                deadlines.push(d);
            }
            deadlines.sort_unstable();
            let mut distinct = deadlines.clone();
            distinct.dedup();

            let mut out: Vec<(u64, usize)> = Vec::new();
            let mut iterations = 0usize;
            let mut last = None;
            while let Some(d) = w.next_deadline() {
                // Never later than the true earliest remaining deadline.
                let earliest = deadlines.get(out.len()).copied();
                assert!(
                    Some(d) <= earliest,
                    "next_deadline {d} > earliest {earliest:?}"
                );
                let before = out.len();
                w.poll(d, &mut out);
                assert!(out.len() > before, "no progress at {d}");
                assert!(last.is_none_or(|l| l <= w.now()));
                last = Some(w.now());
                iterations += 1;
                assert!(iterations <= distinct.len(), "too many iterations");
            }
            w.check_invariants();
            assert!(w.is_empty());
            assert_eq!(out.len(), n);
            let got: Vec<u64> = out.iter().map(|e| e.0).collect();
            // Past-deadline items all come out at the first poll; everything
            // is in nondecreasing deadline order.
            assert_eq!(got, deadlines, "seed {seed}: not in deadline order");
        }
    }

    #[test]
    fn next_deadline_is_exact_for_future_items() {
        let mut rng = XorShift::new(99);
        for _ in 0..2000 {
            let mut w = Wheel::new();
            let start = rng.spread();
            w.poll(start, &mut Vec::new());
            let mut min = u64::MAX;
            for _ in 0..=rng.below(5) {
                let d = start
                    .saturating_add(rng.spread())
                    .max(start.saturating_add(1));
                if d > start {
                    w.insert(d, ());
                    min = min.min(d);
                }
            }
            if w.is_empty() {
                continue;
            }
            assert_eq!(w.next_deadline(), Some(min));
            assert!(poll_vec(&mut w, min - 1).is_empty());
            assert!(!poll_vec(&mut w, min).is_empty());
        }
    }

    #[test]
    fn slot_for_wraps_every_turn() {
        assert_eq!(slot_for(0), 0);
        assert_eq!(slot_for(SLOTS as u64 - 1), SLOTS - 1);
        assert_eq!(slot_for(SLOTS as u64), 0);
        assert_eq!(slot_for(u64::MAX), SLOTS - 1);
    }
}
