//! `locksmith --redlock URL,URL,URL` against three real, independent redis-servers: a lock
//! held by a quorum client is listed, shown, watched and force-unlocked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use locksmith::Client;

#[test]
fn list_show_watch_and_unlock_with_a_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let masters = urls.join(",");
    let c = Client::redlock(&urls).label(LABEL).build().unwrap();
    let name = unique_name("quorum");
    let m = c.mutex(&name).unwrap();
    let probe = c.mutex(&name).unwrap();
    let held = hold("quorum-worker", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });

    let r = run_expect(&["--redlock", &masters, "list", &name, "--json"], 0);
    let json = json_lines(&r.stdout);
    assert_eq!(json.len(), 1, "{}", r.stdout);
    let j = json_of(&json, &name, "mutex");
    assert_eq!(j["thread"], "quorum-worker");
    assert_eq!(j["label"], LABEL);

    let r = run_expect(&["--redlock", &masters, "show", &name], 0);
    assert!(
        r.stdout
            .contains(&format!("holder: {LABEL} (thread quorum-worker)")),
        "{}",
        r.stdout
    );
    let r = run_expect(&["--redlock", &masters, "watch", &name, "--once"], 0);
    assert!(
        r.stdout.contains("redlock: re-read once a second"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("quorum-worker"), "{}", r.stdout);

    let r = run_expect(&["--redlock", &masters, "unlock", &name, "--yes"], 0);
    assert!(r.stdout.contains("force-unlocked the mutex"), "{r:?}");
    assert!(!probe.is_locked().unwrap(), "freed on the quorum");
    drop(held);
    run_expect(&["--redlock", &masters, "list", &name], 3);
}
