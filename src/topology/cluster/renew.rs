//! A batch of renewals on a cluster: the calls (one slot each) pipelined per master, sent as
//! one [`Round`](crate::topology::send::Round) (written to every master first, then read),
//! and what failed or was redirected retried alone through the routing ([`Cluster::run`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;

use super::slots::call_slot;
use super::{Cluster, ClusterNode, Tried, classify};
use crate::protocol::scripts::{Call, parse_renews, parse_time};
use crate::topology::quorum::{Refusal, Renewed};
use crate::topology::send::{Flavor, Part, is_noscript};
use crate::transport::conn::Deadline;

impl Cluster {
    /// Renews: each call (one slot each) with the number of leases it covers. Calls are
    /// pipelined per master (reading for at most half the budget), and a call that failed or
    /// was redirected is retried alone within what is left. One outcome per lease, as
    /// [`Backend::renew`](crate::topology::backend::Backend::renew) gives them.
    pub(crate) fn renew(&self, calls: &[(Call, usize)], budget: Duration) -> Renewed {
        let by = Deadline::after(budget);
        let functions = self.functions.load(Ordering::Relaxed);
        let mut out: Vec<Option<Value>> = vec![None; calls.len()];
        let mut clocks = Vec::new();
        let slots: Vec<u16> = calls.iter().map(|(c, _)| call_slot(&c.cmd)).collect();
        let mut groups: Vec<(Arc<ClusterNode>, Vec<usize>)> = Vec::new();
        // A slot without a known master is left to the one-by-one pass below.
        for (i, &s) in slots.iter().enumerate() {
            if let Some(n) = self.owner(s) {
                match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, &n)) {
                    Some((_, v)) => v.push(i),
                    None => groups.push((n, vec![i])),
                }
            }
        }
        // Every master's pipeline written first, then read: about one round trip in all.
        let packed: Vec<Vec<u8>> = groups
            .iter()
            .map(|(_, idx)| Flavor::Sharded.renewals(idx.iter().map(|&i| &calls[i].0), functions))
            .collect();
        let parts = groups
            .iter()
            .zip(&packed)
            .enumerate()
            .map(|(to, ((node, idx), packed))| Part::new(to, &node.pool, packed, idx.len() + 1))
            .collect();
        for (g, r) in self.sender(Some(budget / 2), by).run(parts) {
            let (node, idx) = &groups[g];
            match r {
                Ok(mut values) => {
                    if let Some(us) = values.pop().as_ref().and_then(parse_time) {
                        clocks.push((node.name.clone(), us));
                    }
                    for (&i, v) in idx.iter().zip(values) {
                        match classify(v) {
                            Tried::Done(v) if !is_noscript(&v) => out[i] = Some(v),
                            _ => {}
                        }
                    }
                }
                Err(e) => log::debug!("renewal pipeline on {} failed: {e}", node.name),
            }
        }
        // What is left: one call at a time, through the routing (redirections, NOSCRIPT, a
        // new connection), within the rest of the budget.
        for i in 0..calls.len() {
            if out[i].is_some() || by.passed() {
                continue;
            }
            match self.run(slots[i], &self.packed(&calls[i].0), by) {
                Ok(v) => out[i] = Some(v),
                // At `debug`: a lease that is lost is reported once, by the renewal thread.
                Err(e) => log::debug!("renewal of {} lease(s) failed: {e}", calls[i].1),
            }
        }
        let mut outcomes = Vec::new();
        let mut refused = None;
        for ((_, count), v) in calls.iter().zip(out) {
            match v {
                Some(v) => {
                    if refused.is_none() {
                        refused = Refusal::of(&v, "a cluster master");
                    }
                    outcomes.extend(parse_renews(&v, *count));
                }
                None => outcomes.extend(std::iter::repeat_n(None, *count)),
            }
        }
        Renewed {
            outcomes,
            refused,
            clocks,
        }
    }
}
