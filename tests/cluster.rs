//! Redis Cluster: routing, sharded pub/sub and failover, against a real local cluster.
use locksmith_testkit::RedisCluster;
use std::time::Duration;
#[test]
fn harness() {
    let c = RedisCluster::start();
    let s = c.shards();
    eprintln!("{s:?}");
    let slot = c.slot_of("foo");
    let m = c.master_of_slot(slot);
    let to = c.masters().into_iter().find(|x| *x != m).unwrap();
    let _: () = redis::cmd("SET")
        .arg("foo")
        .arg("1")
        .query(&mut c.conn(m))
        .unwrap();
    c.migrate_slot(slot, to);
    assert_eq!(c.master_of_slot(slot), to);
    let r = c.replica_of_slot(slot);
    c.failover(r, Duration::from_secs(20));
    assert_eq!(c.master_of_slot(slot), r);
}
