//! The command line: the options that say which servers to reach, and the four commands.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::exit::{self, Failure};

/// The default key prefix of the library (`ClientBuilder::key_prefix`).
pub const DEFAULT_PREFIX: &str = "locksmith:";

/// The server used when neither an option nor `REDIS_URL` names one.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

const ABOUT: &str = "Inspect and clear locksmith's distributed locks (Mutex, FairMutex, \
                     RwLock, Semaphore) and elections on Redis or Valkey";

const LONG_ABOUT: &str = "\
Inspect and clear locksmith's distributed locks (Mutex, FairMutex, RwLock, Semaphore) and \
elections on Redis or Valkey: who holds which lock, since when, with which fencing token and how \
many wait, and who leads which election, in which term, with which value; a live view; and a \
forced unlock for a lock whose holder is stuck (or a new election).

The servers are named as by the library: --url (or REDIS_URL) for one server, --sentinel with \
--master for a Sentinel deployment, --cluster for a Redis Cluster, --redlock for the masters of \
a quorum (RedLock) deployment. TLS and passwords go in the \
URLs (rediss://user:password@host:port/, valkeys://, a trailing #insecure skips the certificate \
check); --tls-ca, --tls-cert and --tls-key add a private CA and a client certificate. Without \
any of them, redis://127.0.0.1:6379/.";

/// `locksmith`: the operator's tool of the locksmith library.
#[derive(Debug, Parser)]
#[command(
    name = "locksmith",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = exit::HELP,
    propagate_version = true,
    disable_help_subcommand = true,
)]
pub struct Cli {
    /// Which servers, and the key prefix.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where the locks are: the topology, the key prefix, TLS files and timeouts.
#[derive(Debug, Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnArgs {
    /// One Redis or Valkey server (`--url`; `REDIS_URL` when absent).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        conflicts_with_all = ["sentinel", "cluster", "redlock"],
        help = "One Redis or Valkey server: redis://[user:password@]host[:port][/db], rediss:// \
                (TLS), valkey://, valkeys://, redis+unix:///path [env: REDIS_URL; default: \
                redis://127.0.0.1:6379/]"
    )]
    pub url: Option<RedisUrl>,

    /// The sentinels of a Sentinel deployment, comma-separated (with --master)
    #[arg(
        long,
        global = true,
        value_name = "URL,URL",
        value_delimiter = ',',
        requires = "master",
        conflicts_with_all = ["cluster", "redlock"]
    )]
    pub sentinel: Vec<RedisUrl>,

    /// The name of the master the sentinels watch (with --sentinel)
    #[arg(long, global = true, value_name = "NAME")]
    pub master: Option<String>,

    /// The user name on the Sentinel master (with --sentinel; a sentinel URL's own user and
    /// password are the sentinel's)
    #[arg(long, global = true, value_name = "USER")]
    pub master_user: Option<String>,

    /// The password of the Sentinel master (with --sentinel); prefer the environment
    /// variable, which no other user of the host sees
    #[arg(
        long,
        global = true,
        value_name = "PASSWORD",
        env = "LOCKSMITH_MASTER_PASSWORD",
        hide_env_values = true
    )]
    pub master_password: Option<Secret>,

    /// The database of the Sentinel master (with --sentinel)
    #[arg(long, global = true, value_name = "DB")]
    pub master_db: Option<i64>,

    /// Nodes of a Redis Cluster, comma-separated (one is enough)
    #[arg(
        long,
        global = true,
        value_name = "URL,URL",
        value_delimiter = ',',
        conflicts_with = "redlock"
    )]
    pub cluster: Vec<RedisUrl>,

    /// The independent masters of a quorum (RedLock) deployment, comma-separated
    #[arg(long, global = true, value_name = "URL,URL", value_delimiter = ',')]
    pub redlock: Vec<RedisUrl>,

    /// The key prefix of the locks (ClientBuilder::key_prefix)
    #[arg(
        long,
        global = true,
        value_name = "PREFIX",
        env = "LOCKSMITH_PREFIX",
        hide_env_values = true,
        default_value = DEFAULT_PREFIX
    )]
    pub prefix: String,

    /// A CA certificate (PEM) to trust for rediss:// instead of the system's roots
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// A client certificate (PEM) for servers that require one (with --tls-key)
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// The bound on connecting and on each command, in seconds
    #[arg(long, global = true, value_name = "SECONDS", default_value = "5", value_parser = parse_seconds)]
    pub timeout: std::time::Duration,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the held locks: one row per holder
    #[command(long_about = LIST_ABOUT, after_help = LIST_CODES)]
    List(ListArgs),
    /// Everything about one name: every lock type that uses it, its holders and its queue
    #[command(after_help = SHOW_CODES)]
    Show(ShowArgs),
    /// Force-unlock a lock whoever holds it, after a confirmation that names the holder
    #[command(long_about = UNLOCK_ABOUT, after_help = UNLOCK_CODES)]
    Unlock(UnlockArgs),
    /// A live view of the held locks, with acquisitions and releases as they happen
    #[command(long_about = WATCH_ABOUT, after_help = WATCH_CODES)]
    Watch(WatchArgs),
}

const LIST_ABOUT: &str = "\
List the held locks under the key prefix whose name starts with NAME_PREFIX (all of them \
without it), of every type: name, type, holder label, thread, hold count (re-entry depth; for a \
semaphore the permits held), how long it has been held, lease left (both by the server's \
clock), fencing token (0 where the type has none; an election's term) and waiters (the queue of \
a fair_mutex, the waiting writers and readers of an rw_lock; - where the type keeps no count). \
An election is listed while it has a leader, the leader as its one holder. A lock held by \
several (the readers of an rw_lock, the permit holders of a semaphore) takes one row per holder.

With --json, one JSON object per lock per line (JSON Lines), with the fields:
  name, type (mutex, fair_mutex, rw_lock, semaphore, election), shared (true when readers hold \
an rw_lock), waiters (a number, or null where the type keeps no count), value (what an \
election's leader proclaimed; null when it proclaimed nothing and for the other types), holders \
(an array, one \
object per holder with label, thread, hold_count, fencing_token, held_for_ms, lease_left_ms), \
and the first holder's label, thread, hold_count, fencing_token, held_for_ms and lease_left_ms \
at the top level (null when only waiters are left).";

const LIST_CODES: &str = "\
Exit codes: 0 some lock listed, 1 Redis error, 2 usage error, 3 no lock held";

const SHOW_CODES: &str = "\
Exit codes: 0 shown, 1 Redis error, 2 usage error, 3 nothing holds or waits for NAME";

const UNLOCK_ABOUT: &str = "\
Force-unlock NAME: frees it on the server whoever holds it (every reader of an rw_lock, every \
permit of a semaphore; a fair_mutex goes to the head of its queue; an election's leadership, \
after which a new election follows among the candidates), publishes the release so that \
waiters (and an election's candidates and observers) wake at once, and the holder loses it at \
its next renewal at the latest.

First it asks for a confirmation that names the holder (on stderr, the answer read from \
stdin); --yes skips it. Without a terminal on stdin and without --yes it refuses (exit code 4). \
When several lock types use the name, --type says which; without it the command refuses and \
lists them (exit code 2).";

const UNLOCK_CODES: &str = "\
Exit codes: 0 unlocked, 1 Redis error, 2 usage error (or several types use NAME and --type is \
missing), 3 nothing held under NAME, 4 not confirmed (no terminal and no --yes, or not \
answered yes)";

const WATCH_ABOUT: &str = "\
A live view of the held locks under the key prefix whose name starts with NAME_PREFIX: the \
table of `list`, redrawn in place, and below it the acquisitions and releases as they happen.

On one server and on Sentinel, the releases are heard on the release channels the library \
publishes on (PSUBSCRIBE): a release of any type publishes when someone waits for it (a \
fair_mutex hands it to the next waiter), and so does a forced unlock; a release nobody \
waits for publishes nothing and shows at the next re-read. An election publishes on its own \
channel when a leader is elected, when it proclaims a value, and when its leadership ends by a \
resignation or a forced unlock (each shows at once as an event). The table is re-read at most \
once a second. On a Redis Cluster, the release channels are sharded per node: the view comes from the once-a-second \
re-read alone, and so it does with --redlock (each release is published on every master).

When stdout is a terminal, each redraw clears the screen (ANSI); otherwise the frames follow \
each other, each starting with a `locksmith watch` line. Ctrl-C ends it; --once draws one \
frame, --count N draws N frames and returns.";

const WATCH_CODES: &str = "Exit codes: 0 ended by --once or --count, 1 Redis error, 2 usage error";

/// `list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only the locks whose name starts with this
    #[arg(value_name = "NAME_PREFIX", default_value = "")]
    pub name_prefix: String,
    /// One JSON object per lock per line (see above)
    #[arg(long)]
    pub json: bool,
}

/// `show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The lock's name
    #[arg(value_name = "NAME")]
    pub name: String,
    /// One JSON object per lock type per line, as `list --json`
    #[arg(long)]
    pub json: bool,
}

/// `unlock`.
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// The lock's name
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Which lock type of that name (needed when several types use it)
    #[arg(long = "type", value_name = "TYPE", value_enum)]
    pub kind: Option<Kind>,
    /// Do not ask for a confirmation
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// `watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only the locks whose name starts with this
    #[arg(value_name = "NAME_PREFIX", default_value = "")]
    pub name_prefix: String,
    /// Draw one frame and return
    #[arg(long, conflicts_with = "count")]
    pub once: bool,
    /// Draw this many frames and return
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

impl WatchArgs {
    /// How many frames to draw (`None`: until Ctrl-C).
    pub fn frames(&self) -> Option<u64> {
        if self.once { Some(1) } else { self.count }
    }
}

/// A lock type, as the command line and the output name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum Kind {
    /// A Mutex
    #[value(name = "mutex")]
    Mutex,
    /// A FairMutex (waiters queue in arrival order)
    #[value(name = "fair_mutex", alias = "fair-mutex")]
    FairMutex,
    /// An RwLock (readers or one writer)
    #[value(name = "rw_lock", alias = "rw-lock")]
    RwLock,
    /// A Semaphore (counted permits)
    #[value(name = "semaphore")]
    Semaphore,
    /// An Election (its holder is the leader; unlocking it starts a new election)
    #[value(name = "election")]
    Election,
}

impl Kind {
    /// Every kind, in the order the output lists them.
    pub const ALL: [Kind; 5] = [
        Kind::Mutex,
        Kind::FairMutex,
        Kind::RwLock,
        Kind::Semaphore,
        Kind::Election,
    ];

    /// The name: `mutex`, `fair_mutex`, `rw_lock`, `semaphore`, `election` (the library's
    /// `LockKind::as_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::FairMutex => "fair_mutex",
            Kind::RwLock => "rw_lock",
            Kind::Semaphore => "semaphore",
            Kind::Election => "election",
        }
    }

    /// The kind of a name that [`as_str`](Self::as_str) gives.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A URL given on the command line: its `Debug` hides the user and password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(pub String);

impl FromStr for RedisUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(RedisUrl(s.to_owned()))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisUrl").field(&redact(&self.0)).finish()
    }
}

/// A password: never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A URL as it may be shown: whatever stands before an `@` after the scheme replaced by
/// `***`.
pub fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |s| s + 3);
    match url[start..].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    }
}

fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(0.001..=3600.0).contains(&secs) {
        return Err("must be from 0.001 to 3600 seconds".into());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// The servers the command reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server.
    Single(RedisUrl),
    /// A Sentinel deployment's master.
    Sentinel {
        /// The sentinels.
        sentinels: Vec<RedisUrl>,
        /// The master's name.
        master: String,
    },
    /// A Redis Cluster, through these seeds.
    Cluster(Vec<RedisUrl>),
    /// Independent masters, a majority of which grant each lock (RedLock).
    Redlock(Vec<RedisUrl>),
}

impl ConnArgs {
    /// The servers: `--sentinel`, `--cluster`, `--redlock`, else `--url`, else `env_url` (`REDIS_URL`),
    /// else [`DEFAULT_URL`]. The options of a Sentinel master are refused on the other
    /// topologies.
    pub fn target(&self, env_url: Option<String>) -> Result<Target, Failure> {
        let empty = |urls: &[RedisUrl]| urls.iter().any(|u| u.0.trim().is_empty());
        let sentinel_only = [
            ("--master", self.master.is_some()),
            ("--master-user", self.master_user.is_some()),
            ("--master-password", self.master_password.is_some()),
            ("--master-db", self.master_db.is_some()),
        ];
        if !self.sentinel.is_empty() {
            if empty(&self.sentinel) {
                return Err(Failure::usage("--sentinel has an empty URL"));
            }
            let master = self.master.clone().unwrap_or_default();
            if master.is_empty() {
                return Err(Failure::usage("--sentinel needs --master NAME"));
            }
            return Ok(Target::Sentinel {
                sentinels: self.sentinel.clone(),
                master,
            });
        }
        // LOCKSMITH_MASTER_PASSWORD may be set for other uses: only the options given on the
        // command line are refused here.
        if let Some((option, _)) = sentinel_only
            .iter()
            .filter(|(o, _)| *o != "--master-password")
            .find(|(_, given)| *given)
        {
            return Err(Failure::usage(format!(
                "{option} applies to a Sentinel deployment (--sentinel URL,URL --master NAME)"
            )));
        }
        if !self.cluster.is_empty() {
            if empty(&self.cluster) {
                return Err(Failure::usage("--cluster has an empty URL"));
            }
            return Ok(Target::Cluster(self.cluster.clone()));
        }
        if !self.redlock.is_empty() {
            if empty(&self.redlock) {
                return Err(Failure::usage("--redlock has an empty URL"));
            }
            return Ok(Target::Redlock(self.redlock.clone()));
        }
        let url = match &self.url {
            Some(url) => url.clone(),
            None => RedisUrl(
                env_url
                    .filter(|u| !u.trim().is_empty())
                    .unwrap_or_else(|| DEFAULT_URL.to_owned()),
            ),
        };
        Ok(Target::Single(url))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("locksmith").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn list_takes_a_prefix_and_json() {
        let cli = parse(&["list", "orders:", "--json"]).unwrap();
        match cli.command {
            Command::List(a) => {
                assert_eq!(a.name_prefix, "orders:");
                assert!(a.json);
            }
            other => panic!("{other:?}"),
        }
        let cli = parse(&["list"]).unwrap();
        match cli.command {
            Command::List(a) => assert_eq!(a.name_prefix, ""),
            other => panic!("{other:?}"),
        }
        assert_eq!(cli.conn.prefix, DEFAULT_PREFIX);
    }

    #[test]
    fn connection_options_go_before_or_after_the_command() {
        let a = parse(&["--url", "redis://h:1/", "list"]).unwrap();
        let b = parse(&["list", "--url", "redis://h:1/"]).unwrap();
        assert_eq!(a.conn.url, b.conn.url);
        assert_eq!(
            a.conn.target(None).unwrap(),
            Target::Single(RedisUrl("redis://h:1/".into()))
        );
    }

    #[test]
    fn the_server_comes_from_url_then_env_then_the_default() {
        let cli = parse(&["list"]).unwrap();
        assert_eq!(
            cli.conn.target(Some("redis://env:2/".into())).unwrap(),
            Target::Single(RedisUrl("redis://env:2/".into()))
        );
        assert_eq!(
            cli.conn.target(None).unwrap(),
            Target::Single(RedisUrl(DEFAULT_URL.into()))
        );
        let cli = parse(&["--url", "redis://flag:3/", "list"]).unwrap();
        assert_eq!(
            cli.conn.target(Some("redis://env:2/".into())).unwrap(),
            Target::Single(RedisUrl("redis://flag:3/".into()))
        );
    }

    #[test]
    fn sentinel_and_cluster_take_comma_separated_urls() {
        let cli = parse(&[
            "--sentinel",
            "redis://a:1,redis://b:2",
            "--master",
            "mymaster",
            "show",
            "x",
        ])
        .unwrap();
        assert_eq!(
            cli.conn.target(Some("redis://ignored/".into())).unwrap(),
            Target::Sentinel {
                sentinels: vec![
                    RedisUrl("redis://a:1".into()),
                    RedisUrl("redis://b:2".into())
                ],
                master: "mymaster".into()
            }
        );
        let cli = parse(&["--cluster", "redis://a:1,redis://b:2", "list"]).unwrap();
        assert_eq!(
            cli.conn.target(None).unwrap(),
            Target::Cluster(vec![
                RedisUrl("redis://a:1".into()),
                RedisUrl("redis://b:2".into())
            ])
        );
        let cli = parse(&["list", "--redlock", "redis://a:1,redis://b:2,redis://c:3"]).unwrap();
        match cli.conn.target(None).unwrap() {
            Target::Redlock(urls) => assert_eq!(urls.len(), 3),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["--redlock", "redis://a/", "--cluster", "redis://b/", "list"]).is_err());
    }

    #[test]
    fn conflicting_or_incomplete_topologies_are_usage_errors() {
        let e = parse(&["--url", "redis://a/", "--cluster", "redis://b/", "list"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        let e = parse(&["--sentinel", "redis://a/", "list"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        let cli = parse(&["--master", "m", "list"]).unwrap();
        let f = cli.conn.target(None).unwrap_err();
        assert_eq!(f.code, exit::USAGE);
        assert!(f.message.contains("--master"), "{f}");
        let cli = parse(&["--cluster", "redis://a/,", "list"]).unwrap();
        assert_eq!(cli.conn.target(None).unwrap_err().code, exit::USAGE);
    }

    #[test]
    fn unlock_takes_a_type_by_its_library_name() {
        let cli = parse(&["unlock", "n", "--type", "fair_mutex", "--yes"]).unwrap();
        match cli.command {
            Command::Unlock(a) => {
                assert_eq!(a.name, "n");
                assert_eq!(a.kind, Some(Kind::FairMutex));
                assert!(a.yes);
            }
            other => panic!("{other:?}"),
        }
        match parse(&["unlock", "n", "--type", "election"])
            .unwrap()
            .command
        {
            Command::Unlock(a) => assert_eq!(a.kind, Some(Kind::Election)),
            other => panic!("{other:?}"),
        }
        assert_eq!(Kind::from_name("election"), Some(Kind::Election));
        let e = parse(&["unlock", "n", "--type", "spinlock"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        for k in Kind::ALL {
            assert_eq!(Kind::from_name(k.as_str()), Some(k));
            assert_eq!(k.to_string(), k.as_str());
        }
    }

    #[test]
    fn watch_draws_once_count_times_or_forever() {
        let frames = |args: &[&str]| match parse(args).unwrap().command {
            Command::Watch(w) => w.frames(),
            other => panic!("{other:?}"),
        };
        assert_eq!(frames(&["watch"]), None);
        assert_eq!(frames(&["watch", "--once"]), Some(1));
        assert_eq!(frames(&["watch", "p", "--count", "3"]), Some(3));
        assert!(parse(&["watch", "--count", "0"]).is_err());
        assert!(parse(&["watch", "--once", "--count", "2"]).is_err());
    }

    #[test]
    fn every_command_has_help_with_the_exit_codes() {
        for sub in ["list", "show", "unlock", "watch"] {
            let e = parse(&[sub, "--help"]).unwrap_err();
            assert_eq!(e.exit_code(), 0);
            let text = e.to_string();
            assert!(text.contains("Exit codes"), "{sub}: {text}");
            assert!(text.contains("--url"), "{sub}: {text}");
        }
        let text = parse(&["--help"]).unwrap_err().to_string();
        for code in [
            "0  ok",
            "1  Redis",
            "2  usage",
            "3  not found",
            "4  refused",
        ] {
            assert!(text.contains(code), "{text}");
        }
    }

    #[test]
    fn debug_never_shows_a_password() {
        let cli = parse(&[
            "--sentinel",
            "redis://u:s3cret@a:1",
            "--master",
            "m",
            "--master-password",
            "m4ster",
            "list",
        ])
        .unwrap();
        let text = format!("{cli:?}");
        assert!(
            !text.contains("s3cret") && !text.contains("m4ster"),
            "{text}"
        );
        assert_eq!(redact("rediss://u:p@h:1/0"), "rediss://***@h:1/0");
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
    }

    #[test]
    fn timeouts_are_seconds() {
        let cli = parse(&["--timeout", "0.5", "list"]).unwrap();
        assert_eq!(cli.conn.timeout, std::time::Duration::from_millis(500));
        assert!(parse(&["--timeout", "0", "list"]).is_err());
        assert!(parse(&["--timeout", "x", "list"]).is_err());
    }
}
