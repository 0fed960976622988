//! What an operator reads of the masters, the same on every topology: a command on every
//! master, the lock keys by `SCAN`, and a quorum's yes or no (the tools of `client/inspect.rs`
//! and the start-up checks).

use redis::Value;

use super::Backend;
use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::topology::quorum;
use crate::topology::send::{Node, Round};
use crate::transport::conn::Deadline;
use crate::transport::fault::Fault;

impl Backend {
    /// Runs `cmd` once on every master (a cluster's masters as its map has them now), in one
    /// round bounded like a script call; each master's name (its URL without password) with
    /// its reply.
    pub(crate) fn each_master(&self, cmd: redis::Cmd) -> Vec<(String, Result<Value>)> {
        let nodes = self.nodes();
        let round = self.round(Some(self.call_timeout), Deadline::NONE, false);
        let masters = nodes.iter().map(|n| &**n).enumerate();
        (round.each(masters, &cmd.get_packed_command()).into_iter())
            .map(|(i, r)| (nodes[i].name.clone(), r.map_err(Error::from)))
            .collect()
    }

    /// The keys that match `pattern` on each master, read with `SCAN` (never `KEYS`: each
    /// step returns after about `count` keys, so Redis is never busy with one call for long),
    /// each master with its own cursor, every step within the command timeout and the whole
    /// within `by`. Each master's name with its keys (a key may come twice; callers dedupe).
    pub(crate) fn scan(&self, pattern: &str, by: Deadline) -> Vec<(String, Result<Vec<String>>)> {
        // A master marked down is asked too.
        let round = Round {
            pause: None,
            ..self.round(Some(self.call_timeout), by, false)
        };
        let keys = |node: &Node| -> Result<Vec<String>, Fault> {
            let (mut keys, mut cursor) = (Vec::new(), "0".to_owned());
            loop {
                if by.passed() {
                    return Err(Fault::timeout("SCAN of the lock keys"));
                }
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(&cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, found) = scan_reply(round.ask(node, &cmd.get_packed_command())?)?;
                keys.extend(found);
                if next == "0" {
                    return Ok(keys);
                }
                cursor = next;
            }
        };
        (self.nodes().iter())
            .map(|node| (node.name.clone(), keys(node).map_err(Error::from)))
            .collect()
    }

    /// Whether a quorum of masters has the lock key, asked within `by`, as
    /// [`quorum_says`](Self::quorum_says) asks.
    pub(crate) fn exists(&self, keys: &LockKeys, by: Deadline) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&keys.lock);
        self.quorum_says(&cmd, by, |r| match r {
            Ok(v) => Some(matches!(v, Value::Int(1))),
            Err(_) => None,
        })
    }

    /// Whether a quorum of masters answers `cmd` with a reply that `yes` calls true (`None`:
    /// no answer), asked within `by`: a master whose connection failed (a pooled connection
    /// that died in a restart) is asked once more at once, on a new connection, within the
    /// same bound, as an acquire is.
    pub(crate) fn quorum_says(
        &self,
        cmd: &redis::Cmd,
        by: Deadline,
        yes: impl Fn(&Result<Value, Fault>) -> Option<bool>,
    ) -> Result<bool> {
        let packed = cmd.get_packed_command();
        let send = |targets: &[usize]| self.one_each(targets, cmd, &packed, by, false);
        let replies = self.retried(by, send).into_iter().map(|(_, r)| {
            yes(&r).ok_or_else(|| Error::from(r.err().unwrap_or(Fault::timeout("no reply"))))
        });
        let held = quorum::tally(replies, Ok)?.need(self.quorum())?;
        Ok(held.into_iter().filter(|&y| y).count() >= self.quorum())
    }
}

/// A `SCAN` reply: the next cursor and the keys of this step.
fn scan_reply(v: Value) -> Result<(String, Vec<String>), Fault> {
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    if let Value::Array(parts) = &v
        && let [cursor, Value::Array(keys)] = parts.as_slice()
        && let Some(cursor) = text(cursor)
    {
        return Ok((cursor, keys.iter().filter_map(text).collect()));
    }
    Err(Fault::bad_reply("SCAN", &v))
}
