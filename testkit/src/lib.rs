//! The test and benchmark harness of locksmith (development only, never published).
//!
//! Everything here runs against real `redis-server` processes over real sockets (or the
//! server named by `LOCKSMITH_TEST_SERVER`, such as a `valkey-server`: see [`server_program`]):
//!
//! - [`RedisServer`]: a private `redis-server` on a free port (never 6379): start, stop,
//!   restart empty on the same port, pause and resume (`SIGSTOP`/`SIGCONT`), optionally pinned
//!   to a CPU; killed on `Drop`, with the tail of its log printed when the test panics.
//! - [`RedisCluster`]: a Redis Cluster (3 masters + 3 replicas by default) joined with
//!   `redis-cli --cluster create`; failover, kill, pause and slot migration helpers.
//! - [`SentinelSet`]: a Redis Sentinel deployment (1 master, 2 replicas with `--replicaof`, 3
//!   sentinels from config files it writes, short failure detection), killed on `Drop`.
//! - [`free_port`], [`unique_name`] and the keys of a lock name ([`lock_key`], ...).
//! - [`lock_value`] / [`lock_state_at`]: a `Mutex` lock's value on the server, parsed (the one
//!   parse of it the tests use).
//! - [`proxy::Proxy`]: a TCP proxy for faults on the wire (lost or delayed replies, a black
//!   hole, killed connections).
//! - Command counting: [`commandstats`] / [`script_calls`] (`INFO commandstats`), the
//!   [`Stats`] maps of the benchmark, and [`Monitor`] (`MONITOR`).
//! - [`TlsFiles`]: a test CA and certificates made with `openssl`, for
//!   [`RedisServer::start_tls`]; [`skip_without_tls`] for a server built without TLS.
//! - [`TestChild`]: a child process that re-runs the current test binary in a given role.
//! - [`thread_count`] and friends: threads of this process, from `/proc`.
//! - [`with_deadline`] / [`wait_until`]: every blocking step of a test is bounded.
//! - [`lua_source`]: the Lua source the client sends for a script (the library's own assembly
//!   of it, over the same files), for tests that recognise a script's calls by its SHA1.
//! - [`checker`]: the fenced store, the interval log of critical sections and the checker of
//!   mutual exclusion and fencing order, on one clock shared by the processes of the host
//!   ([`mono_ns`]).
//!
//! The helpers panic on failure: a panic is a failed test. Linux only (`/proc`, `kill`,
//! `taskset`).

// A failed set-up step fails the test that asked for it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod checker;
mod child;
mod clock;
pub mod clock_shift;
pub mod cluster;
mod lock_value;
mod names;
mod program;
pub mod proxy;
mod rng;
mod scripts;
pub mod sentinel;
mod server;
mod stats;
mod threads;
mod tls;
mod tls_probe;
mod wait;

pub use child::{ROLE_VAR, TestChild, child_env, is_child};
pub use clock::{mono_ns, ms_between, realtime_ns};
pub use cluster::RedisCluster;
pub use lock_value::{LockState, LockValue, lock_state_at, lock_value, lock_value_at};
pub use names::{
    PREFIX, encode_name, fence_key, key_slot, lock_key, release_channel, unique_name, unique_suffix,
};
pub use program::{CLI_VAR, SERVER_VAR, cli_program, server_program};
pub use rng::Rng;
pub use scripts::{lua_source, script_files};
pub use sentinel::SentinelSet;
pub use server::{ClosedPort, RedisServer, connect, free_port, pin, signal, stop_for};
pub use stats::{
    ChannelSpy, client_list, errorstats, keys_matching, lock_keys_left, pubsub_clients, token_of,
    wait_numsub,
};
pub use stats::{
    Monitor, Stats, calls, calls_by_command, client_level, commandstats, exists, failed_by_command,
    hget, numsub, pttl, script_calls, script_stat, stat, stats_brief, stats_delta, stats_total,
    usec_by_command,
};
pub use threads::{
    assert_threads, new_thread_named, process_cpu_ns, process_user_ns, rss_kib,
    settled_thread_count, tasks, thread_count, thread_cpu_ns,
};
pub use tls::{ServerCert, TlsFiles};
pub use tls_probe::{REQUIRE_TLS_VAR, skip_without_tls, tls_unavailable};
pub use wait::{wait_until, with_deadline};
