//! What a client counts of its locks' activity: [`Counters`] (relaxed atomics, shared by the
//! client's clones, locks, guards and threads), read as a [`Stats`] snapshot, and reported
//! through the `metrics` crate's facade with the `metrics` feature. Counting takes no lock and
//! starts no thread: each counting point is one call here.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::kind::Kind;

thread_local! {
    /// Set when the calling thread joins a lock's wait queue: its acquire call had to wait.
    static WAITED: Cell<bool> = const { Cell::new(false) };
}

/// Notes that the calling thread's acquire call joins a wait queue (it is contended).
pub(crate) fn note_wait() {
    WAITED.with(|w| w.set(true));
}

/// Writes [`Counters`] and its [`snapshot`](Counters::snapshot) from one list of the fields it
/// counts (each a [`Stats`] field of the same name), besides the two histograms.
macro_rules! counters {
    ($($field:ident),+) => {
        /// A client's counters, shared by its clones, locks, guards and threads.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($field: AtomicU64,)+
            wait: Buckets,
            hold: Buckets,
            /// The metrics carry a `name` label (unbounded cardinality).
            #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
            name_label: bool,
        }

        impl Counters {
            /// A snapshot of the counters.
            pub(crate) fn snapshot(&self) -> Stats {
                Stats {
                    $($field: self.$field.load(Ordering::Relaxed),)+
                    wait: self.wait.snapshot(),
                    hold: self.hold.snapshot(),
                }
            }
        }
    };
}

counters! {
    acquired, acquired_locally, contended, timed_out, busy, failed, released, leases_lost,
    renewals, renewal_failures, reconnects, clock_jumps
}

/// Adds one, relaxed: the counters order nothing.
fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// Counts one into `counter` and into the metric `metric`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn count(&self, counter: &AtomicU64, metric: &'static str, kind: Kind, name: &str) {
        bump(counter);
        #[cfg(feature = "metrics")]
        metrics::counter(self, metric, kind, name);
    }

    /// Counters whose metrics carry the lock's name as a label when `name_label` is set.
    pub(crate) fn new(name_label: bool) -> Self {
        Counters {
            name_label,
            ..Counters::default()
        }
    }

    /// Runs one acquire call of a lock of kind `kind` called `name` and counts its outcome: an
    /// acquisition (with its wait, and whether it waited in a queue), a deadline that passed
    /// (`timed_out` for a call that `may_wait`, or `busy` for one whose deadline had passed
    /// when it began), or an error.
    pub(crate) fn acquire<G, E>(
        &self,
        kind: Kind,
        name: &str,
        may_wait: bool,
        call: impl FnOnce() -> Result<Option<G>, E>,
    ) -> Result<Option<G>, E> {
        WAITED.with(|w| w.set(false));
        let start = Instant::now();
        let outcome = call();
        let waited = WAITED.with(|w| w.replace(false));
        match &outcome {
            Ok(Some(_)) => {
                let wait = start.elapsed();
                bump(&self.acquired);
                if waited {
                    bump(&self.contended);
                }
                self.wait.record(wait);
                #[cfg(feature = "metrics")]
                metrics::acquired(self, kind, name, waited, wait);
            }
            Ok(None) if may_wait => {
                self.count(&self.timed_out, "locksmith_timed_out_total", kind, name)
            }
            Ok(None) => self.count(&self.busy, "locksmith_busy_total", kind, name),
            Err(_) => self.count(&self.failed, "locksmith_failed_total", kind, name),
        }
        outcome
    }

    /// Counts an acquisition by local hand-off (made within an acquire call, which counts it
    /// as an acquisition too).
    pub(crate) fn acquired_locally(&self, kind: Kind, name: &str) {
        self.count(
            &self.acquired_locally,
            "locksmith_acquired_locally_total",
            kind,
            name,
        );
    }

    /// Starts the hold of a guard of a lock of kind `kind` called `name`: counted as held until
    /// the returned [`Held`] is dropped, which records the hold time.
    pub(crate) fn held(self: &Arc<Self>, kind: Kind, name: &str) -> Held {
        #[cfg(feature = "metrics")]
        metrics::held(self, kind, name, 1.0);
        Held {
            counters: Arc::clone(self),
            kind,
            name: self.name_label.then(|| name.to_owned()),
            since: Instant::now(),
        }
    }

    /// Counts a lease lost while held.
    pub(crate) fn lease_lost(&self, kind: Kind, name: &str) {
        self.count(&self.leases_lost, "locksmith_leases_lost_total", kind, name);
    }

    /// Counts one renewal of a lease: `extended`, or failed (no answer in time, or the lease
    /// was gone).
    pub(crate) fn renewal(&self, kind: Kind, name: &str, extended: bool) {
        if extended {
            self.count(&self.renewals, "locksmith_renewals_total", kind, name);
        } else {
            self.count(
                &self.renewal_failures,
                "locksmith_renewal_failures_total",
                kind,
                name,
            );
        }
    }

    /// Counts a pub/sub connection opened again after it was lost (or could not be opened).
    pub(crate) fn reconnected(&self) {
        bump(&self.reconnects);
        #[cfg(feature = "metrics")]
        metrics::reconnected();
    }

    /// Counts a step of a master's wall clock seen between two renewals.
    pub(crate) fn clock_jumped(&self) {
        bump(&self.clock_jumps);
        #[cfg(feature = "metrics")]
        metrics::clock_jumped();
    }
}

/// A guard's hold, counted from its acquisition until dropped (released, or given up with
/// its guard): then its hold time is recorded.
pub(crate) struct Held {
    counters: Arc<Counters>,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    kind: Kind,
    /// The lock's name, kept only for a `name` label.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    name: Option<String>,
    since: Instant,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let hold = self.since.elapsed();
        let c = &self.counters;
        bump(&c.released);
        c.hold.record(hold);
        #[cfg(feature = "metrics")]
        metrics::released(c, self.kind, self.name.as_deref(), hold);
    }
}

/// What a [`Client`](crate::Client) counted of its locks' activity since it was built: a
/// snapshot from [`Client::stats`](crate::Client::stats).
///
/// Every clone of a client, and every lock and guard made from it, counts into the same
/// counters; two clients (built separately) count apart. The counters are plain relaxed
/// atomics, read one by one: a snapshot taken while other threads lock may see one counter
/// of an acquisition before another (`acquired` before `contended`, say), never a count
/// that goes down.
///
/// What counts as what:
///
/// - An *acquisition* is a guard handed out: a call of `lock`, `try_lock`, `try_lock_for`,
///   `try_lock_until` ([`Mutex`](crate::Mutex), [`FairMutex`](crate::FairMutex),
///   [`MultiMutex`](crate::MultiMutex)), `read`/`write` and their `try_` forms
///   ([`RwLock`](crate::RwLock)), `acquire`, `acquire_many` and their `try_` forms
///   ([`Semaphore`](crate::Semaphore)) that returned a guard or permit. A re-entry (a thread
///   locking again a lock it holds) is an acquisition too, as it returns a guard of its own;
///   so is a `MultiMutex` lock (one, whatever the number of its locks) and an
///   `acquire_many(n)` (one, whatever `n`).
/// - Every acquire call ends in exactly one of `acquired`, `timed_out`, `busy` or `failed`.
///
/// With the `serde` feature it is `Serialize` and `Deserialize`: its counters by their names,
/// `wait` and `hold` as [`Histogram`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Stats {
    /// Acquisitions of every lock type (see above), including re-entries and local
    /// hand-offs.
    pub acquired: u64,
    /// Of `acquired`, the acquisitions handed over by another thread of this client without
    /// a round trip to Redis (local hand-off; see
    /// [`ClientBuilder::local_handoff`](crate::ClientBuilder::local_handoff)).
    pub acquired_locally: u64,
    /// Of `acquired`, the acquisitions that had to wait: the call did not get the lock at
    /// its first attempt, or found other threads of this client already waiting for it, and
    /// joined the lock's wait queue.
    pub contended: u64,
    /// Acquire calls with a deadline still ahead when they began (`try_lock_for`,
    /// `try_lock_until`, `try_read_for`, ...) that returned `None`: the lock stayed held
    /// until the deadline.
    pub timed_out: u64,
    /// Acquire calls that made one attempt only, their deadline having passed when they
    /// began (`try_lock`, `try_acquire`, a zero timeout), and returned `None`: the lock was
    /// held.
    pub busy: u64,
    /// Acquire calls that returned an error (Redis unreachable within the bounds, a script
    /// error, ...).
    pub failed: u64,
    /// Guards ended: released by `unlock` (or `release`), dropped, or dropped after their
    /// lease was lost. `acquired - released` guards are alive.
    pub released: u64,
    /// Leases lost while held: the key expired, was deleted or taken over, or Redis could not
    /// be reached before the lease ran out (the losses
    /// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) is told of, one per
    /// acquisition, whatever its number of guards).
    pub leases_lost: u64,
    /// Lease renewals that extended a lease (one per held acquisition and renewal, however
    /// many travel in one batch).
    pub renewals: u64,
    /// Lease renewals that did not: no answer in time (retried while the lease lasts), or
    /// the lease was gone.
    pub renewal_failures: u64,
    /// Times a pub/sub connection was opened again after it was lost or could not be opened
    /// (a server restart, a failover, a network fault, `CLIENT KILL`).
    pub reconnects: u64,
    /// Steps of a master's wall clock, seen by the renewal thread: between two renewal rounds
    /// the server's clock (`TIME`, read in each round) moved more than 500 ms + 1 % away from
    /// this host's monotonic clock. One per step and master, however many locks it holds;
    /// each is logged at `warn`. A forward step may end leases there early (Redis expires
    /// keys by its wall clock); a backward one makes them last longer than asked.
    pub clock_jumps: u64,
    /// How long acquire calls that acquired took, from the call to the guard: for an
    /// uncontended lock, one round trip; for a contended one, the wait too.
    pub wait: Histogram,
    /// How long guards were held, from their acquisition until `unlock`, `release` or drop.
    pub hold: Histogram,
}

/// How many buckets a power of two is split into (the relative width of a bucket: 1/4).
const SUB: u32 = 4;
/// The largest power of two of microseconds with buckets of its own (2^40 µs, about 12.7
/// days); longer durations fall in the last bucket.
const MAX_EXP: u32 = 40;
/// The number of buckets: one per microsecond below `SUB`, then `SUB` per power of two.
const BUCKETS: usize = (SUB + (MAX_EXP - 1) * SUB + SUB) as usize;

/// The bucket of `us` microseconds.
fn bucket_of(us: u64) -> usize {
    if us < u64::from(SUB) {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros(); // at least 2
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (us >> (exp - 2)) & u64::from(SUB - 1);
    (SUB + (exp - 2) * SUB) as usize + sub as usize
}

/// The first microsecond past bucket `i`.
fn bucket_end(i: usize) -> u64 {
    let i = i as u64;
    let sub = u64::from(SUB);
    if i < sub {
        return i + 1;
    }
    let exp = (i - sub) / sub + 2;
    let m = (i - sub) % sub;
    (sub + m + 1) << (exp - 2)
}

/// A histogram of durations in fixed buckets, in atomics.
#[derive(Debug)]
struct Buckets {
    counts: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

impl Buckets {
    fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if let Some(c) = self.counts.get(bucket_of(us)) {
            bump(c);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Histogram {
        Histogram {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

/// A distribution of durations (waits or holds), in fixed buckets: one per microsecond below
/// 4 µs, then four per power of two (each bucket at most a quarter of its lower bound
/// wide), up to about 12.7 days. Its quantiles are the upper bounds of their buckets (never
/// above [`max`](Histogram::max)): at most 25% above the true value, never below it.
///
/// With the `serde` feature it is `Serialize` and `Deserialize`, losslessly: `counts` (the
/// count of every bucket, shortest first; reading refuses another number of buckets),
/// `sum_us` and `max_us` (microseconds).
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Histogram {
    #[cfg_attr(feature = "serde", serde(deserialize_with = "bucket_counts"))]
    counts: Vec<u64>,
    sum_us: u64,
    max_us: u64,
}

/// A [`Histogram`]'s `counts` as read, refused unless there is one per bucket.
#[cfg(feature = "serde")]
fn bucket_counts<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    let counts: Vec<u64> = serde::Deserialize::deserialize(d)?;
    let n = counts.len();
    if n != BUCKETS {
        let why = format!("a histogram has {BUCKETS} bucket counts, not {n}");
        return Err(serde::de::Error::custom(why));
    }
    Ok(counts)
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("p50", &self.p50())
            .field("p99", &self.p99())
            .field("max", &self.max())
            .finish_non_exhaustive()
    }
}

impl Histogram {
    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The sum of the recorded durations (to the microsecond).
    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.sum_us)
    }

    /// The longest recorded duration (to the microsecond); zero when none was recorded.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }

    /// The median (see [`quantile`](Histogram::quantile)).
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The 99th percentile (see [`quantile`](Histogram::quantile)).
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }

    /// The duration that a fraction `q` (from 0 to 1; clamped) of the recorded durations do
    /// not exceed, rounded up to the end of its bucket and capped at [`max`](Histogram::max);
    /// zero when none was recorded.
    pub fn quantile(&self, q: f64) -> Duration {
        let total = self.count();
        if total == 0 {
            return Duration::ZERO;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        // The rank of the duration sought, from 1 to `total`.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let end = bucket_end(i).saturating_sub(1);
                return Duration::from_micros(end.min(self.max_us));
            }
        }
        self.max()
    }

    /// The buckets that recorded a duration: the upper bound of each (a duration in it is
    /// below that bound) and how many it recorded, shortest first.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (Duration::from_micros(bucket_end(i)), *c))
    }
}

/// The counters and histograms through the `metrics` crate's facade (whatever recorder the
/// application installed; none: they cost a check of the global recorder). Without the
/// `metrics` feature, the counting points leave these calls out.
#[cfg(feature = "metrics")]
mod metrics {
    use crate::kind::Kind;
    use crate::stats::Counters;
    use std::time::Duration;

    fn labels(c: &Counters, kind: Kind, name: Option<&str>) -> Vec<::metrics::Label> {
        let mut l = vec![::metrics::Label::new("type", kind.label())];
        if c.name_label
            && let Some(n) = name
        {
            l.push(::metrics::Label::new("name", n.to_owned()));
        }
        l
    }

    pub(super) fn counter(c: &Counters, metric: &'static str, kind: Kind, name: &str) {
        ::metrics::counter!(metric, labels(c, kind, Some(name))).increment(1);
    }

    pub(super) fn acquired(c: &Counters, kind: Kind, name: &str, waited: bool, wait: Duration) {
        let l = labels(c, kind, Some(name));
        ::metrics::counter!("locksmith_acquired_total", l.clone()).increment(1);
        if waited {
            ::metrics::counter!("locksmith_contended_total", l.clone()).increment(1);
        }
        ::metrics::histogram!("locksmith_wait_seconds", l).record(wait.as_secs_f64());
    }

    pub(super) fn held(c: &Counters, kind: Kind, name: &str, by: f64) {
        ::metrics::gauge!("locksmith_held", labels(c, kind, Some(name))).increment(by);
    }

    pub(super) fn released(c: &Counters, kind: Kind, name: Option<&str>, hold: Duration) {
        let l = labels(c, kind, name);
        ::metrics::gauge!("locksmith_held", l.clone()).decrement(1.0);
        ::metrics::counter!("locksmith_released_total", l.clone()).increment(1);
        ::metrics::histogram!("locksmith_hold_seconds", l).record(hold.as_secs_f64());
    }

    pub(super) fn reconnected() {
        ::metrics::counter!("locksmith_reconnects_total").increment(1);
    }

    pub(super) fn clock_jumped() {
        ::metrics::counter!("locksmith_clock_jumps_total").increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_duration_in_order() {
        let mut last = 0;
        for us in (0..100_000u64).chain([1 << 39, (1 << 41) - 1, 1 << 41, u64::MAX]) {
            let b = bucket_of(us);
            assert!(b < BUCKETS);
            assert!(b >= last || us > 100_000, "{us}");
            last = b;
            if b < BUCKETS - 1 {
                assert!(us < bucket_end(b), "{us} in {b} ends at {}", bucket_end(b));
                assert!(b == 0 || us >= bucket_end(b - 1), "{us} in {b}");
                // A bucket is at most a quarter of its lower bound wide.
                let start = if b == 0 { 0 } else { bucket_end(b - 1) };
                assert!(bucket_end(b) - start <= start.max(4) / 4 + 1, "{b}");
            }
        }
    }

    #[test]
    fn quantiles_round_up_within_a_quarter() {
        let b = Buckets::default();
        for ms in 1..=100u64 {
            b.record(Duration::from_millis(ms));
        }
        let h = b.snapshot();
        assert_eq!(h.count(), 100);
        assert_eq!(h.max(), Duration::from_millis(100));
        assert_eq!(h.sum(), Duration::from_millis(5050));
        let p50 = h.p50();
        assert!(p50 >= Duration::from_millis(50) && p50 <= Duration::from_micros(62_500));
        let p99 = h.p99();
        assert!(p99 >= Duration::from_millis(99) && p99 <= Duration::from_millis(100));
        assert_eq!(h.quantile(1.0), h.max());
        assert_eq!(Buckets::default().snapshot().p99(), Duration::ZERO);
        assert_eq!(h.buckets().map(|(_, c)| c).sum::<u64>(), 100);
    }

    #[test]
    fn an_acquire_call_counts_once() {
        let c = Counters::new(false);
        let _ = c.acquire(Kind::Mutex, "a", true, || Ok::<_, ()>(Some(())));
        let _ = c.acquire(Kind::Mutex, "a", true, || {
            note_wait();
            Ok::<_, ()>(Some(()))
        });
        let _ = c.acquire(Kind::Mutex, "a", true, || Ok::<Option<()>, ()>(None));
        let _ = c.acquire(Kind::Mutex, "a", false, || Ok::<Option<()>, ()>(None));
        let _ = c.acquire(Kind::Mutex, "a", true, || Err::<Option<()>, ()>(()));
        let s = c.snapshot();
        assert_eq!(
            (s.acquired, s.contended, s.timed_out, s.busy, s.failed),
            (2, 1, 1, 1, 1)
        );
        assert_eq!(s.wait.count(), 2);
    }
}
