//! The `transfer` example, run as a user would: accounts in SQLite (the default) and in
//! PostgreSQL (127.0.0.1:5432, database `test`, user `postgres` or `root`, or `DATABASE_URL`),
//! several processes transferring between random pairs; money must be conserved and the
//! example's table dropped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::RedisServer;

/// Runs the example with `envs` against a Redis of its own; returns its standard output.
fn run_example(redis: &RedisServer, envs: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["run", "--quiet", "--example", "transfer"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("REDIS_URL", redis.url())
        .env("TRANSFER_SECS", "2")
        .env_remove("DATABASE_URL");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the example failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("money is conserved"), "{stdout}");
    let rate = stdout
        .lines()
        .find(|l| l.contains("transfers/s"))
        .expect("a throughput line");
    let done: u64 = rate.split_whitespace().next().unwrap().parse().unwrap();
    assert!(done > 0, "{stdout}");
    stdout
}

/// The example's table, from its first line.
fn table_of(stdout: &str) -> String {
    let at = stdout.find("(table ").expect("the table's name") + "(table ".len();
    stdout[at..].split(')').next().unwrap().to_owned()
}

#[test]
fn transfer_example_on_sqlite() {
    let redis = RedisServer::start();
    let path = std::env::temp_dir().join(format!("{}.db", common::unique_name("transfer")));
    let path = path.to_string_lossy().into_owned();
    let out = run_example(&redis, &[("TRANSFER_SQLITE", &path)]);
    assert!(out.contains("SQLite"), "{out}");
    assert!(
        !std::path::Path::new(&path).exists(),
        "the example left its database file"
    );
}

#[test]
fn transfer_example_on_postgres() {
    let candidates = match std::env::var("DATABASE_URL") {
        Ok(url) => vec![url],
        Err(_) => vec![
            "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            "postgres://root@127.0.0.1:5432/test".to_owned(),
        ],
    };
    let Some((url, mut pg)) = candidates.into_iter().find_map(|url| {
        postgres::Client::connect(&url, postgres::NoTls)
            .ok()
            .map(|c| (url, c))
    }) else {
        println!("skipped: no PostgreSQL answers at 127.0.0.1:5432 (database `test`)");
        return;
    };
    let redis = RedisServer::start();
    let out = run_example(&redis, &[("DATABASE_URL", &url)]);
    assert!(out.contains("PostgreSQL"), "{out}");
    let table = table_of(&out);
    let left: i64 = pg
        .query_one(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = $1",
            &[&table],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the example left its table {table}");
}
