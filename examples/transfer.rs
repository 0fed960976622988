//! Transfers between accounts in a real SQL database: several processes move money between
//! random pairs of accounts. Each transfer takes both accounts at once with one `MultiMutex`
//! (never deadlocks, whatever order the pair is named in) and writes both balances in one
//! database transaction guarded by each account's fencing token (`UPDATE ... WHERE id = $1 AND
//! fence < $2`), so a holder that lost its lease can never overwrite a newer one's write. At
//! the end it checks that money is conserved and prints the throughput.
//!
//! ```text
//! cargo run --example transfer                          # SQLite, in a temporary file
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example transfer
//! ```
//!
//! `TRANSFER_PROCESSES` (3), `TRANSFER_THREADS` (4), `TRANSFER_ACCOUNTS` (5) and
//! `TRANSFER_SECS` (3) change the run. The table has a name of its own per run and is dropped
//! at the end.

#[path = "support/mod.rs"]
mod support;

use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use locksmith::Client;

/// Every account starts with this much.
const START: i64 = 1_000;

/// The role of a worker process (the example runs itself as its workers).
const ROLE: &str = "TRANSFER_ROLE";

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Where the accounts live.
#[derive(Debug, Clone)]
enum Target {
    /// An SQLite database file.
    Sqlite(String),
    /// A PostgreSQL connection string.
    Postgres(String),
}

impl Target {
    fn from_env() -> Target {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            return Target::Postgres(url);
        }
        if let Ok(path) = std::env::var("TRANSFER_SQLITE") {
            return Target::Sqlite(path);
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "locksmith-transfer-{}-{nanos}.db",
            std::process::id()
        ));
        Target::Sqlite(path.to_string_lossy().into_owned())
    }

    fn describe(&self) -> &'static str {
        match self {
            Target::Sqlite(_) => "SQLite (temporary file)",
            Target::Postgres(_) => "PostgreSQL",
        }
    }
}

/// A connection to the accounts' database.
enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

impl Db {
    fn open(target: &Target) -> support::Result<Db> {
        Ok(match target {
            Target::Sqlite(path) => {
                let c = rusqlite::Connection::open(path)?;
                // Other processes write the same file: wait for their write lock.
                c.busy_timeout(Duration::from_secs(10))?;
                Db::Sqlite(c)
            }
            Target::Postgres(url) => {
                Db::Postgres(Box::new(postgres::Client::connect(url, postgres::NoTls)?))
            }
        })
    }

    /// Creates the table with `accounts` accounts of [`START`] each, fence 0.
    fn create(&mut self, table: &str, accounts: u64) -> support::Result<()> {
        let ddl = format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, \
             fence BIGINT NOT NULL)"
        );
        let insert = format!("INSERT INTO {table} (id, balance, fence) VALUES ($1, $2, 0)");
        match self {
            Db::Sqlite(c) => {
                c.execute_batch(&ddl)?;
                for id in 0..accounts as i64 {
                    c.execute(&insert, rusqlite::params![id, START])?;
                }
            }
            Db::Postgres(c) => {
                c.batch_execute(&ddl)?;
                for id in 0..accounts as i64 {
                    c.execute(&insert, &[&id, &START])?;
                }
            }
        }
        Ok(())
    }

    /// Moves `amount` from account `from` to `to` in one transaction, each write fenced by its
    /// account's token. Returns false (and changes nothing) when a fence refused a write: the
    /// database has seen a newer holder of that account.
    fn transfer(
        &mut self,
        table: &str,
        (from, from_token): (i64, i64),
        (to, to_token): (i64, i64),
        amount: i64,
    ) -> support::Result<bool> {
        let update = format!(
            "UPDATE {table} SET balance = balance + $1, fence = $2 WHERE id = $3 AND fence < $2"
        );
        match self {
            Db::Sqlite(c) => {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let a = tx.execute(&update, rusqlite::params![-amount, from_token, from])?;
                let b = tx.execute(&update, rusqlite::params![amount, to_token, to])?;
                if a == 1 && b == 1 {
                    tx.commit()?;
                    return Ok(true);
                }
                tx.rollback()?;
                Ok(false)
            }
            Db::Postgres(c) => {
                let mut tx = c.transaction()?;
                let a = tx.execute(&update, &[&-amount, &from_token, &from])?;
                let b = tx.execute(&update, &[&amount, &to_token, &to])?;
                if a == 1 && b == 1 {
                    tx.commit()?;
                    return Ok(true);
                }
                tx.rollback()?;
                Ok(false)
            }
        }
    }

    /// The sum of every balance.
    fn total(&mut self, table: &str) -> support::Result<i64> {
        let q = format!("SELECT COALESCE(SUM(balance), 0) FROM {table}");
        Ok(match self {
            Db::Sqlite(c) => c.query_row(&q, [], |r| r.get(0))?,
            Db::Postgres(c) => {
                // SUM of BIGINT is NUMERIC in PostgreSQL: cast it back.
                let q = format!("SELECT COALESCE(SUM(balance), 0)::BIGINT FROM {table}");
                c.query_one(&q, &[])?.get(0)
            }
        })
    }

    fn drop_table(&mut self, table: &str) -> support::Result<()> {
        let q = format!("DROP TABLE IF EXISTS {table}");
        match self {
            Db::Sqlite(c) => c.execute_batch(&q)?,
            Db::Postgres(c) => c.batch_execute(&q)?,
        }
        Ok(())
    }
}

/// A small seeded random number generator (xorshift), enough to pick accounts.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The lock name of account `id`.
fn account(id: i64) -> String {
    format!("example:transfer:account:{id}")
}

/// One worker process: `threads` threads transfer until the run is over; prints its count.
fn worker() -> support::Result<()> {
    let redis = support::redis();
    let target = Target::from_env();
    let table = std::env::var("TRANSFER_TABLE")?;
    let threads = env_or("TRANSFER_THREADS", 4) as usize;
    let accounts = env_or("TRANSFER_ACCOUNTS", 5);
    let run = Duration::from_millis(env_or("TRANSFER_RUN_MS", 3000));
    let client = Client::open(redis.url())?;
    let end = Instant::now() + run;
    let counts = support::on_threads(threads, |t| {
        let mut db = Db::open(&target)?;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(std::process::id()) << 16) ^ t as u64);
        let (mut done, mut fenced) = (0u64, 0u64);
        while Instant::now() < end {
            let from = rng.below(accounts) as i64;
            let to = (from + 1 + rng.below(accounts - 1) as i64) % accounts as i64;
            // Both accounts at once, in whatever order: no deadlock, no hand-written ordering.
            let pair = client.multi_lock([account(from), account(to)])?;
            let guard = pair.lock()?;
            let token = |id: i64| -> support::Result<i64> {
                let t = guard
                    .fencing_token(&account(id))
                    .ok_or("a name not in the set")?;
                Ok(i64::try_from(t)?)
            };
            let amount = 1 + rng.below(100) as i64;
            if db.transfer(&table, (from, token(from)?), (to, token(to)?), amount)? {
                done += 1;
            } else {
                // Only a holder that lost its lease (paused past it) is ever refused.
                fenced += 1;
            }
            guard.unlock()?;
        }
        Ok((done, fenced))
    })?;
    let done: u64 = counts.iter().map(|c| c.0).sum();
    let fenced: u64 = counts.iter().map(|c| c.1).sum();
    println!("done {done} fenced {fenced}");
    Ok(())
}

fn main() -> support::Result<()> {
    if std::env::var(ROLE).is_ok() {
        return worker();
    }
    let redis = support::redis();
    let target = Target::from_env();
    let processes = env_or("TRANSFER_PROCESSES", 3);
    let threads = env_or("TRANSFER_THREADS", 4);
    let accounts = env_or("TRANSFER_ACCOUNTS", 5).max(2);
    let secs = env_or("TRANSFER_SECS", 3);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let table = format!("locksmith_transfer_{}_{nanos}", std::process::id());
    let mut db = Db::open(&target)?;
    db.create(&table, accounts)?;
    println!(
        "{processes} processes x {threads} threads transfer between {accounts} accounts in {} \
         for {secs} s (table {table})",
        target.describe()
    );

    let result = run(&redis, &target, &table, processes, threads, accounts, secs);
    let total = db.total(&table);
    db.drop_table(&table)?;
    drop(db);
    if let Target::Sqlite(path) = &target {
        let _ = std::fs::remove_file(path);
    }
    let (done, fenced, took) = result?;
    let total = total?;
    let expected = START * accounts as i64;
    println!(
        "{done} transfers in {:.1} s: {:.0} transfers/s; {fenced} refused by a fence",
        took.as_secs_f64(),
        done as f64 / took.as_secs_f64()
    );
    println!("money: {total} (expected {expected})");
    if total != expected {
        return Err(format!("money was not conserved: {total} instead of {expected}").into());
    }
    println!("money is conserved");
    let names: Vec<String> = (0..accounts as i64).map(account).collect();
    redis.tell_what_is_left(&names.iter().map(String::as_str).collect::<Vec<_>>())?;
    Ok(())
}

/// Starts the worker processes and adds up what they report.
fn run(
    redis: &support::Redis,
    target: &Target,
    table: &str,
    processes: u64,
    threads: u64,
    accounts: u64,
    secs: u64,
) -> support::Result<(u64, u64, Duration)> {
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let children: Vec<Child> = (0..processes)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.env(ROLE, "worker")
                .env("REDIS_URL", redis.url())
                .env("TRANSFER_TABLE", table)
                .env("TRANSFER_THREADS", threads.to_string())
                .env("TRANSFER_ACCOUNTS", accounts.to_string())
                .env("TRANSFER_RUN_MS", (secs * 1000).to_string())
                .stdout(std::process::Stdio::piped());
            match target {
                Target::Sqlite(path) => cmd.env("TRANSFER_SQLITE", path).env_remove("DATABASE_URL"),
                Target::Postgres(url) => cmd.env("DATABASE_URL", url),
            };
            cmd.spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let (mut done, mut fenced) = (0, 0);
    for child in children {
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("a worker failed ({}): {text}", out.status).into());
        }
        let line = text
            .lines()
            .find(|l| l.starts_with("done "))
            .ok_or("a worker reported nothing")?;
        let words: Vec<&str> = line.split_whitespace().collect();
        done += words
            .get(1)
            .and_then(|w| w.parse::<u64>().ok())
            .unwrap_or(0);
        fenced += words
            .get(3)
            .and_then(|w| w.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok((done, fenced, started.elapsed()))
}
