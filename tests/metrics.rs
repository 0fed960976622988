//! The `metrics` feature on a real server: a recorder that captures (`metrics-util`'s
//! debugging recorder, installed for the whole test binary) sees the counters, histograms and
//! gauge of a known workload, labelled by lock type, and by name only when asked.
//! Runs with `cargo test --features metrics --test metrics`.

#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::with_deadline;
use locksmith::Client;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// A metric: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// What the recorder saw so far, summed over snapshots (each snapshot of the debugging
/// recorder takes the values since the last one: counters and gauges as changes).
#[derive(Default)]
struct Seen {
    counters: BTreeMap<Series, u64>,
    gauges: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
}

impl Seen {
    fn update(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(series).or_default() += n,
                DebugValue::Gauge(g) => *self.gauges.entry(series).or_default() += g.0,
                DebugValue::Histogram(v) => self
                    .histograms
                    .entry(series)
                    .or_default()
                    .extend(v.iter().map(|x| x.0)),
            }
        }
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0)
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.gauges
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.histograms
            .get(&series(name, labels))
            .map_or(&[], Vec::as_slice)
    }
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut l: Vec<_> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    l.sort();
    (name.to_owned(), l)
}

/// One test function: the recorder is global to the process.
#[test]
fn reports_the_workload_by_lock_type() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let (_server, url) = common::server_url();
    with_deadline(Duration::from_secs(60), move || {
        let mut seen = Seen::default();
        let [client, other] = common::clients(&url);
        let name = common::unique_name("metrics");
        let mutex = [("type", "mutex")];

        // Two mutex acquisitions; while the second is held the gauge says 1.
        drop(client.mutex(&name).unwrap().lock().unwrap());
        let g = client.mutex(&name).unwrap().lock().unwrap();
        seen.update(&snapshotter);
        assert_eq!(seen.counter("locksmith_acquired_total", &mutex), 2);
        assert_eq!(seen.gauge("locksmith_held", &mutex), 1.0);
        drop(g);
        seen.update(&snapshotter);
        assert_eq!(seen.gauge("locksmith_held", &mutex), 0.0);
        assert_eq!(seen.counter("locksmith_released_total", &mutex), 2);
        assert_eq!(seen.histogram("locksmith_wait_seconds", &mutex).len(), 2);
        assert_eq!(seen.histogram("locksmith_hold_seconds", &mutex).len(), 2);
        assert!(
            seen.histogram("locksmith_hold_seconds", &mutex)
                .iter()
                .all(|s| (0.0..10.0).contains(s))
        );

        // One of each other type, each under its own label.
        drop(client.fair_mutex(&name).unwrap().lock().unwrap());
        drop(client.rw_lock(&name).unwrap().read().unwrap());
        drop(client.semaphore(&name, 2).unwrap().acquire().unwrap());
        let pair = [format!("{name}-a"), format!("{name}-b")];
        drop(client.multi_lock(&pair).unwrap().lock().unwrap());
        seen.update(&snapshotter);
        for ty in ["fair_mutex", "rw_lock", "semaphore", "multi_mutex"] {
            let l = [("type", ty)];
            assert_eq!(seen.counter("locksmith_acquired_total", &l), 1, "{ty}");
            assert_eq!(seen.counter("locksmith_released_total", &l), 1, "{ty}");
            assert_eq!(seen.gauge("locksmith_held", &l), 0.0, "{ty}");
            assert_eq!(
                seen.histogram("locksmith_hold_seconds", &l).len(),
                1,
                "{ty}"
            );
        }

        // Held by another client: one call times out, one finds it busy.
        let held = other.mutex(&name).unwrap().lock().unwrap();
        let mine = client.mutex(&name).unwrap();
        assert!(
            mine.try_lock_for(Duration::from_millis(20))
                .unwrap()
                .is_none()
        );
        assert!(mine.try_lock().unwrap().is_none());
        drop(held);
        seen.update(&snapshotter);
        assert_eq!(seen.counter("locksmith_timed_out_total", &mutex), 1);
        assert_eq!(seen.counter("locksmith_busy_total", &mutex), 1);
        // Both clients count into the one recorder.
        assert_eq!(seen.counter("locksmith_acquired_total", &mutex), 3);

        // No series carries a name label by default.
        assert!(
            seen.counters
                .keys()
                .chain(seen.gauges.keys())
                .chain(seen.histograms.keys())
                .all(|(_, l)| l.iter().all(|(k, _)| k == "type"))
        );

        // With the option, the lock's name is a label too.
        let named = Client::builder(url.as_str())
            .metrics_lock_names(true)
            .build()
            .unwrap();
        drop(named.mutex(&name).unwrap().lock().unwrap());
        seen.update(&snapshotter);
        let l = [("type", "mutex"), ("name", name.as_str())];
        assert_eq!(seen.counter("locksmith_acquired_total", &l), 1);
        assert_eq!(seen.gauge("locksmith_held", &l), 0.0);
        assert_eq!(seen.histogram("locksmith_hold_seconds", &l).len(), 1);
        assert_eq!(seen.counter("locksmith_acquired_total", &mutex), 3);
    });
}
