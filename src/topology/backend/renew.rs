//! The renewal of a batch of leases, the same for every topology: each master gets the calls
//! it holds (every call on each independent master, each call on its slot's master on a
//! cluster) pipelined with `TIME` (and `WAIT` when asked for), all sent as one
//! [`Round`](crate::topology::send::Round) (written to every master first, then read: about
//! one round trip in all). What failed is
//! retried within the batch's budget: a master whose connection failed gets its calls again
//! on a new connection; on a cluster, a call that failed or was redirected goes again alone
//! through the routing. Each lease's outcome is then decided by the quorum
//! ([`decided`]: 1 of 1 on one server or a cluster).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::{Backend, Route, TARGET, acked};
use crate::protocol::scripts::{Call, parse_renews, parse_time};
use crate::topology::cluster::{call_slot, redirected};
use crate::topology::quorum::{Refusal, Renewed, decided, replace_replies, worth_retrying};
use crate::topology::send::{Node, Part, Replies, is_noscript};
use crate::transport::conn::Deadline;

impl Backend {
    /// Renews a batch of leases on every master in one pipelined round trip per master (on a
    /// cluster, per slot's master), all within `budget`. Each call covers the number of
    /// leases paired with it (a batch call several, a per-lock call one). One outcome per
    /// lease, in the order of the calls: `Some(true)` kept, `Some(false)` lost, `None`
    /// unknown. A master that stays silent for half the budget (a connection that a NAT
    /// dropped) counts as failed.
    pub(crate) fn renew(&self, calls: &[(Call, usize)], budget: Duration) -> Renewed {
        let by = Deadline::after(budget);
        let n: usize = calls.iter().map(|c| c.1).sum();
        // Each master with the calls it holds; on a cluster, a slot without a known master
        // is left to the retry.
        let mut groups: Vec<(Arc<Node>, Vec<usize>)> = Vec::new();
        match &self.route {
            Route::Nodes(nodes) => {
                let every: Vec<usize> = (0..calls.len()).collect();
                groups.extend(nodes.iter().map(|n| (Arc::clone(n), every.clone())));
            }
            Route::Cluster(c) => {
                for (i, (call, _)) in calls.iter().enumerate() {
                    let Some(node) = c.owner(call_slot(&call.cmd)) else {
                        continue;
                    };
                    match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, &node)) {
                        Some((_, v)) => v.push(i),
                        None => groups.push((node, vec![i])),
                    }
                }
            }
        }
        let functions = self.functions.load(std::sync::atomic::Ordering::Relaxed);
        let packed: Vec<Vec<u8>> = (groups.iter())
            .map(|(_, idx)| {
                let mut p = self
                    .flavor
                    .renewals(idx.iter().map(|&i| &calls[i].0), functions);
                self.push_wait(&mut p);
                p
            })
            .collect();
        let waits = usize::from(self.wait.is_some());
        let parts = |which: &[usize]| -> Vec<Part<'_>> {
            (which.iter())
                .map(|&g| Part::new(g, &groups[g].0, &packed[g], groups[g].1.len() + 1 + waits))
                .collect()
        };
        let all: Vec<usize> = (0..groups.len()).collect();
        let first = (budget / 2).min(self.reply_timeout());
        let mut replies = self.round(Some(first), by, false).run(parts(&all));
        let mut answers = self.answers(calls, &groups, &replies);
        match &self.route {
            Route::Nodes(_) => {
                let retry = worth_retrying(&replies);
                if !retry.is_empty()
                    && !by.passed()
                    && self.outcomes(calls, &answers).0.contains(&None)
                {
                    log::debug!(
                        "renewal of {n} leases failed on {} master(s); retrying on a new connection",
                        retry.len()
                    );
                    // Renewing again is harmless: a renewal only sets the lease from now on.
                    let again = self.round(Some(budget), by, true).run(parts(&retry));
                    replace_replies(&mut replies, again);
                    answers = self.answers(calls, &groups, &replies);
                }
            }
            Route::Cluster(c) => {
                // One call at a time through the routing (redirections, NOSCRIPT, a new
                // connection), within the rest of the budget.
                for (i, (call, count)) in calls.iter().enumerate() {
                    if !answers[i].is_empty() || by.passed() {
                        continue;
                    }
                    let round = self.round(None, by, false);
                    match c.run(call_slot(&call.cmd), &self.pack(call), &round) {
                        Ok(v) => answers[i].push(("a cluster master".into(), v)),
                        // At `debug`: a lost lease is reported once, by the renewal thread.
                        Err(e) => log::debug!("renewal of {count} lease(s) failed: {e}"),
                    }
                }
            }
        }
        let clocks = (replies.iter())
            .filter_map(|(g, r)| {
                let (node, idx) = &groups[*g];
                let v = r.as_ref().ok()?.get(idx.len())?;
                Some((node.name.clone(), parse_time(v)?))
            })
            .collect();
        let needed = self.wait.map_or(0, |(n, _)| n);
        for (g, r) in &replies {
            let name = &groups[*g].0.name;
            let acked = r.as_ref().map_or(0, |values| acked(values.last()));
            match r {
                // At `debug`: a renewal is retried until the lease runs out, and a lease
                // that is lost is reported once, at `warn`, by the renewal thread.
                Err(e) => log::debug!("renewal of {n} leases on {name} failed: {e}"),
                Ok(_) if acked < needed => log::warn!(
                    target: TARGET,
                    "renewal of {n} leases on {name} confirmed by {acked} of {needed} \
                     replicas in time; the leases are kept",
                ),
                Ok(_) => {}
            }
        }
        let (outcomes, refused) = self.outcomes(calls, &answers);
        Renewed {
            outcomes,
            refused,
            clocks,
        }
    }

    /// Each call's answers in `replies`, by the name of the master that gave them: a master's
    /// reply `k` answers for the `k`-th call of its group. A redirection, a cluster's
    /// transient error or `NOSCRIPT` is no answer.
    fn answers(
        &self,
        calls: &[(Call, usize)],
        groups: &[(Arc<Node>, Vec<usize>)],
        replies: &Replies<Vec<Value>>,
    ) -> Vec<Vec<(String, Value)>> {
        let mut answers = vec![Vec::new(); calls.len()];
        for (g, r) in replies {
            let (node, idx) = &groups[*g];
            let Ok(values) = r else { continue };
            for (&i, v) in idx.iter().zip(values) {
                if !redirected(v) && !is_noscript(v) {
                    answers[i].push((node.name.clone(), v.clone()));
                }
            }
        }
        answers
    }

    /// The outcome of each lease from each call's answers (the quorum decides), and the
    /// first refusal for a missing permission.
    fn outcomes(
        &self,
        calls: &[(Call, usize)],
        answers: &[Vec<(String, Value)>],
    ) -> (Vec<Option<bool>>, Option<Refusal>) {
        let (masters, q) = (self.masters(), self.quorum());
        let mut refused = None;
        let mut outcomes = Vec::new();
        for ((_, count), answers) in calls.iter().zip(answers) {
            // Each lease's yes and no.
            let mut votes = vec![(0, 0); *count];
            for (name, v) in answers {
                if refused.is_none() {
                    refused = Refusal::of(v, name);
                }
                let renewed = parse_renews(v, *count);
                if renewed.contains(&None) {
                    log::debug!("renewal error on {name}: {v:?}");
                }
                for (k, r) in renewed.into_iter().enumerate() {
                    match r {
                        Some(true) => votes[k].0 += 1,
                        Some(false) => votes[k].1 += 1,
                        None => {}
                    }
                }
            }
            outcomes.extend(votes.iter().map(|&(y, f)| decided(y, f, masters, q)));
        }
        (outcomes, refused)
    }
}
