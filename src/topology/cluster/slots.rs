//! Slots as the servers name them: the slot map a node gives (`CLUSTER SHARDS`, or
//! `CLUSTER SLOTS` on an older server) parsed into each master's ranges, the slot and node a
//! `MOVED` or `ASK` reply names, and the slot a script call goes to.
//!
//! Apart from the cluster's state and its routing (the parent module) because it is pure
//! reading of replies and commands: no connection, no lock, tested on replies as servers
//! send them. The map itself (which node owns each slot now) and when it is read again are
//! the parent's.

use std::collections::HashMap;

use redis::{Value, from_redis_value_ref as read};

use crate::protocol::keys;

/// The slot and `host:port` of a `MOVED` or `ASK` reply's details (`3999 127.0.0.1:6381`).
pub(super) fn redirect(details: Option<&str>) -> Option<(u16, String, u16)> {
    let mut parts = details?.split_whitespace();
    let slot = parts.next()?.parse().ok()?;
    let addr = parts.next()?;
    let (host, port) = addr.rsplit_once(':')?;
    Some((slot, host.to_owned(), port.parse().ok()?))
}

/// The fields of a RESP2 flat array or a RESP3 map, as the `redis` crate reads either.
type Fields = HashMap<String, Value>;

/// One master's slot ranges, from `CLUSTER SHARDS` or `CLUSTER SLOTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) start: u16,
    pub(crate) end: u16,
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// A node's host as a map names it: an empty or unknown one (`""`, `"?"`: a node that never
/// met another does not know its own IP) means `asked`, the node that gave the map.
fn host_or(host: Option<String>, asked: &str) -> String {
    host.filter(|h| !h.is_empty() && h != "?")
        .unwrap_or_else(|| asked.to_owned())
}

/// Parses `CLUSTER SHARDS`, given by the node at `asked`: each shard's slot ranges and its
/// master (`tls` picks the `tls-port`).
pub(crate) fn parse_shards(v: &Value, tls: bool, asked: &str) -> Option<Vec<Range>> {
    let mut out = Vec::new();
    for shard in read::<Vec<Fields>>(v).ok()? {
        let slots: Vec<u16> = read(shard.get("slots")?).ok()?;
        let nodes: Vec<Fields> = read(shard.get("nodes")?).ok()?;
        let text = |n: &Fields, k: &str| n.get(k).and_then(|v| read::<String>(v).ok());
        let master = nodes.iter().find(|n| {
            text(n, "role").as_deref() == Some("master")
                && text(n, "health").as_deref() != Some("fail")
        });
        let Some(master) = master else { continue };
        let endpoint = text(master, "endpoint").filter(|h| !h.is_empty() && h != "?");
        let host = host_or(endpoint.or_else(|| text(master, "ip")), asked);
        let port = tls.then(|| master.get("tls-port")).flatten();
        let port: u16 = read(port.or_else(|| master.get("port"))?).ok()?;
        for pair in slots.chunks(2) {
            let &[start, end] = pair else { return None };
            let host = host.clone();
            out.push(Range {
                start,
                end,
                host,
                port,
            });
        }
    }
    Some(out)
}

/// Parses `CLUSTER SLOTS`, given by the node at `asked`:
/// `[[start, end, [host, port, id, ...], replicas...], ...]`.
pub(crate) fn parse_slots(v: &Value, asked: &str) -> Option<Vec<Range>> {
    let range = |r: Vec<Value>| {
        let master: Vec<Value> = read(r.get(2)?).ok()?;
        Some(Range {
            start: read(r.first()?).ok()?,
            end: read(r.get(1)?).ok()?,
            host: host_or(read(master.first()?).ok(), asked),
            port: read(master.get(1)?).ok()?,
        })
    };
    read::<Vec<Vec<Value>>>(v)
        .ok()?
        .into_iter()
        .map(range)
        .collect()
}

/// The slot of a script call (or of a one-key command): its first key.
pub(crate) fn call_slot(cmd: &redis::Cmd) -> u16 {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b),
            _ => None,
        })
        .collect();
    let first = args.first().map(|a| a.to_ascii_uppercase());
    let key = match first.as_deref() {
        Some(b"EVALSHA" | b"EVAL" | b"FCALL") => args.get(3),
        _ => args.get(1),
    };
    key.map_or(0, |k| keys::slot(&String::from_utf8_lossy(k)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::protocol::keys::LockKeys;
    use crate::protocol::{mutex, scripts};

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A `CLUSTER SHARDS` reply of one shard: its slot ranges (`[start, end, ...]`) and nodes.
    fn shards(slots: &[i64], nodes: Vec<Value>) -> Value {
        Value::Array(vec![Value::Array(vec![
            bulk("slots"),
            Value::Array(slots.iter().map(|&s| Value::Int(s)).collect()),
            bulk("nodes"),
            Value::Array(nodes),
        ])])
    }

    /// A node of a `CLUSTER SHARDS` reply, on 127.0.0.1 at `port`.
    fn shard_node(port: i64, role: &str, health: &str) -> Value {
        Value::Array(vec![
            bulk("id"),
            bulk("x"),
            bulk("port"),
            Value::Int(port),
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("endpoint"),
            bulk("127.0.0.1"),
            bulk("role"),
            bulk(role),
            bulk("health"),
            bulk(health),
        ])
    }

    #[test]
    fn redirect_details_parse() {
        assert_eq!(
            redirect(Some("3999 127.0.0.1:6381")),
            Some((3999, "127.0.0.1".into(), 6381))
        );
        assert_eq!(redirect(Some("1 ::1:7000")), Some((1, "::1".into(), 7000)));
        assert_eq!(redirect(Some("x 127.0.0.1:1")), None);
        assert_eq!(redirect(None), None);
    }

    /// Every key and channel of every lock type's call hashes to the lock's one slot, for
    /// many names: plain, with braces in any place, percent signs and non-ASCII.
    #[test]
    fn every_key_and_channel_of_a_lock_share_its_slot() {
        let mut names: Vec<String> = [
            "a",
            "{",
            "}",
            "{}",
            "}{",
            "{a}",
            "a{b}c",
            "{{x}}",
            "%7B",
            "%",
            "a}b{c",
            "é ü 名前",
            "{名前}",
            "🔒{🔑}",
            "x{}y",
            "  ",
            "*?[]",
            "\n{\t}",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let alphabet: Vec<char> = "ab{}%:é名🔒 ".chars().collect();
        for _ in 0..2000 {
            let len = (x % 12 + 1) as usize;
            let mut s = String::new();
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            names.push(s);
        }
        let holder = scripts::Holder {
            owner: "o",
            acquisition: "g",
        };
        let lease = Duration::from_secs(1);
        for name in &names {
            for prefix in ["locksmith:", "", "p%:"] {
                let k = LockKeys::new(prefix, name);
                let acquire = mutex::Acquire {
                    owner: "o",
                    lease,
                    request: "r",
                    live: None,
                    block: 0,
                    waited: false,
                    quorum: false,
                };
                let release = mutex::Release {
                    acquisition: "g",
                    level: scripts::Level::Outermost,
                    request: "r",
                    publish: mutex::Publish::Always,
                    fence: None,
                };
                let calls = [
                    mutex::acquire(&k, &acquire),
                    mutex::release(&k, &release, false),
                    mutex::renew(&k, "g", lease, None),
                    crate::protocol::fair_mutex::acquire(&k, "o", "r", lease, true, None, None),
                    crate::protocol::fair_mutex::release(&k, holder, scripts::Level::Inner, "r"),
                    crate::protocol::semaphore::release(&k, holder),
                    crate::protocol::rw_lock::read(&k, "o", "r", lease, true, true),
                    crate::protocol::rw_lock::release(&k, holder, true, false),
                ];
                for call in &calls {
                    let args: Vec<String> = call
                        .cmd
                        .args_iter()
                        .filter_map(|a| match a {
                            redis::Arg::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
                            _ => None,
                        })
                        .collect();
                    let nkeys: usize = args[2].parse().unwrap_or(0);
                    for key in &args[3..3 + nkeys] {
                        assert_eq!(keys::slot(key), k.slot, "{name:?}: key {key:?}");
                    }
                    // Every argument naming a channel or key of this lock (they start with
                    // the prefix and the tag) is in the slot too.
                    let base = k.lock.strip_suffix(":lock").unwrap_or(&k.lock);
                    for a in &args[3 + nkeys..] {
                        if a.starts_with(base) {
                            assert_eq!(keys::slot(a), k.slot, "{name:?}: argument {a:?}");
                        }
                    }
                    assert_eq!(call_slot(&call.cmd), k.slot);
                }
                assert_eq!(keys::slot(&k.channel), k.slot);
                // A fair mutex's grant channels are the release channel plus a waiter id.
                assert_eq!(keys::slot(&format!("{}abc-123", k.channel)), k.slot);
            }
        }
    }

    #[test]
    fn cluster_slots_and_shards_parse() {
        let slots = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(5460),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id1")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id4")]),
        ])]);
        assert_eq!(
            parse_slots(&slots, "127.0.0.1"),
            Some(vec![Range {
                start: 0,
                end: 5460,
                host: "127.0.0.1".into(),
                port: 7000
            }])
        );
        let nodes = vec![
            shard_node(7003, "replica", "online"),
            shard_node(7000, "master", "online"),
        ];
        let r =
            parse_shards(&shards(&[0, 10, 20, 30], nodes), false, "127.0.0.1").unwrap_or_default();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].start, r[0].end, r[0].port), (0, 10, 7000));
        assert_eq!((r[1].start, r[1].end, r[1].port), (20, 30, 7000));
    }

    /// Valkey keeps a master that failed over in its shard, as `role master` with
    /// `health fail`, before or after the promoted one: the promoted one is the master.
    #[test]
    fn a_failed_master_is_not_taken_for_the_shards_master() {
        let node = |port, health| shard_node(port, "master", health);
        for nodes in [
            vec![node(7000, "fail"), node(7003, "online")],
            vec![node(7003, "online"), node(7000, "fail")],
        ] {
            let r =
                parse_shards(&shards(&[0, 16383], nodes), false, "127.0.0.1").unwrap_or_default();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].port, 7003);
        }
    }
}
