//! A batch of renewals on a cluster: the calls (one slot each) pipelined per master, written
//! to every master first and then read, and what failed or was redirected retried alone
//! through the routing ([`Cluster::run`]).

use std::sync::Arc;
use std::time::Duration;

use redis::{ServerErrorKind, Value};

use super::slots::call_slot;
use super::{Cluster, ClusterNode, Tried, classify};
use crate::protocol::scripts::{Call, parse_renews, parse_time};
use crate::topology::quorum::{Refusal, Renewed};
use crate::transport::conn::Deadline;

impl Cluster {
    /// Renews: each call (one slot each) with the number of leases it covers. Calls are
    /// pipelined per master (reading for at most half the budget), and a call that failed or
    /// was redirected is retried alone within what is left. One outcome per lease, as
    /// [`Backend::renew`](crate::topology::backend::Backend::renew) gives them.
    pub(crate) fn renew(&self, calls: &[(Call, usize)], budget: Duration) -> Renewed {
        let by = Deadline::after(budget);
        let first = by.min(Deadline::after(budget / 2));
        let t = self.timeouts.command;
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
        // Write every master's pipeline first, then read: about one round trip in all.
        let mut sent = Vec::new();
        for (node, idx) in groups {
            let mut packed_all = Vec::new();
            for &i in &idx {
                packed_all.extend_from_slice(&self.packed(&calls[i].0));
            }
            // The master's clock, read in the same round: see `renewal::clock_watch`.
            packed_all.extend_from_slice(&redis::cmd("TIME").get_packed_command());
            let con = match node.pool.idle() {
                Some(c) => Ok(c),
                None => node.pool.connect(first),
            };
            match con.and_then(|mut c| c.send(&packed_all, t, first).map(|()| c)) {
                Ok(c) => sent.push((node, idx, c)),
                Err(e) => {
                    log::debug!("renewal pipeline to {} not sent: {e}", node.name);
                    node.pool.clear();
                }
            }
        }
        for (node, idx, mut con) in sent {
            let mut ok = true;
            for &i in &idx {
                match con.recv(t, first) {
                    Ok(v) => match classify(v) {
                        Tried::Done(Value::ServerError(e))
                            if e.kind() == Some(ServerErrorKind::NoScript) => {}
                        Tried::Done(v) => out[i] = Some(v),
                        _ => {}
                    },
                    Err(e) => {
                        log::debug!("renewal pipeline on {} failed: {e}", node.name);
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                match con.recv(t, first) {
                    Ok(v) => {
                        if let Some(us) = parse_time(&v) {
                            clocks.push((node.name.clone(), us));
                        }
                    }
                    Err(e) => {
                        log::debug!("renewal pipeline on {} failed: {e}", node.name);
                        ok = false;
                    }
                }
            }
            if ok && con.is_open() {
                node.pool.put(con);
            } else {
                node.pool.clear();
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
