//! `locksmith`: the operator's command-line tool of the locksmith library. It connects
//! through the library (`Client::builder`, `Client::sentinel`, `Client::cluster`,
//! `Client::redlock`, labelled `locksmith-cli`) and runs `list`, `show`, `unlock` and `watch`
//! with the functions of `locksmith_cli` (see `--help` and `cli/README.md`).

use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;

use clap::Parser;
use locksmith::{Client, ClientBuilder, Holder, LockInfo, LockKind};
use locksmith_cli::args::{Cli, Command, ConnArgs, Kind, Target};
use locksmith_cli::exit::Failure;
use locksmith_cli::listen::{self, Listener, Source};
use locksmith_cli::model::{HolderView, LockView};
use locksmith_cli::{prompt, render, watch};

/// The label this tool's client carries (`ClientBuilder::label`).
const LABEL: &str = "locksmith-cli";

fn main() -> ExitCode {
    // Usage errors exit with 2, `--help` and `--version` with 0.
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("locksmith: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    // The `redis` crate builds its TLS configurations with the process's default provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = cli.conn.target(std::env::var("REDIS_URL").ok())?;
    let client = builder(&cli.conn, &target)?.build().map_err(failure)?;
    let quorum = matches!(target, Target::Redlock(_));
    match &cli.command {
        Command::List(a) => list(&client, &a.name_prefix, a.json),
        Command::Show(a) => show(&client, quorum, &a.name, a.json),
        Command::Unlock(a) => unlock(&client, quorum, &a.name, a.kind, a.yes),
        Command::Watch(a) => watch(&client, &cli.conn, &target, &a.name_prefix, a.frames()),
    }
}

/// The exit code of a library error: 2 for what the command line got wrong, else 1.
fn failure(e: locksmith::Error) -> Failure {
    if e.is_invalid_name()
        || e.is_invalid_config()
        || e.is_unsupported()
        || matches!(e, locksmith::Error::InvalidUrl { .. })
    {
        Failure::usage(e.to_string())
    } else {
        Failure::redis(e.to_string())
    }
}

fn read_pem(option: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::usage(format!("{option} {}: {e}", path.display())))
}

/// The library's builder for the target, with the key prefix, the label, the timeouts and
/// the TLS files.
fn builder(conn: &ConnArgs, target: &Target) -> Result<ClientBuilder, Failure> {
    let mut b = match target {
        Target::Single(url) => Client::builder(&url.0),
        Target::Sentinel { sentinels, master } => {
            let mut b = Client::sentinel(sentinels.iter().map(|u| u.0.as_str()), master);
            match (&conn.master_password, &conn.master_user) {
                (Some(password), user) => b = b.master_auth(user.as_deref(), &password.0),
                (None, Some(_)) => {
                    return Err(Failure::usage(
                        "--master-user needs the master's password (LOCKSMITH_MASTER_PASSWORD \
                         or --master-password)",
                    ));
                }
                (None, None) => {}
            }
            if let Some(db) = conn.master_db {
                b = b.master_db(db);
            }
            b
        }
        Target::Cluster(seeds) => Client::cluster(seeds.iter().map(|u| u.0.as_str())),
        Target::Redlock(masters) => Client::redlock(masters.iter().map(|u| u.0.as_str())),
    };
    b = b
        .label(LABEL)
        .key_prefix(conn.prefix.clone())
        .connect_timeout(conn.timeout)
        .command_timeout(conn.timeout)
        .retry_timeout(conn.timeout);
    if let Some(ca) = &conn.tls_ca {
        b = b.tls_root_cert(read_pem("--tls-ca", ca)?);
    }
    if let (Some(cert), Some(key)) = (&conn.tls_cert, &conn.tls_key) {
        b = b.tls_client_cert(read_pem("--tls-cert", cert)?, read_pem("--tls-key", key)?);
    }
    Ok(b)
}

fn holder_view(h: Holder) -> HolderView {
    HolderView {
        label: h.label,
        thread: h.thread,
        hold_count: h.hold_count,
        fencing_token: h.fencing_token,
        held_for: h.held_for,
        lease_left: h.lease_left,
    }
}

/// The plain-data copy of a `LockInfo` (`None` for a lock type this tool does not know).
fn lock_view(info: LockInfo) -> Option<LockView> {
    Some(LockView {
        kind: Kind::from_name(info.kind.as_str())?,
        name: info.name,
        holders: info.holders.into_iter().map(holder_view).collect(),
        shared: info.shared,
        waiters: info.waiters,
        value: info.value,
    })
}

/// The held locks whose name starts with `name_prefix`, in name order.
fn locks(client: &Client, name_prefix: &str) -> Result<Vec<LockView>, Failure> {
    let mut views = Vec::new();
    for info in client.locks(name_prefix).map_err(failure)? {
        views.extend(lock_view(info.map_err(failure)?));
    }
    LockView::sort(&mut views);
    Ok(views)
}

/// Every lock type that uses `name`, in type order.
///
/// A quorum client has only the `Mutex` and the `Election`: its locks of that name come from
/// the listing.
fn lock_info(client: &Client, quorum: bool, name: &str) -> Result<Vec<LockView>, Failure> {
    if quorum {
        let mut views = locks(client, name)?;
        views.retain(|v| v.name == name);
        return Ok(views);
    }
    let mut views: Vec<LockView> = client
        .lock_info(name)
        .map_err(failure)?
        .into_iter()
        .filter_map(lock_view)
        .collect();
    LockView::sort(&mut views);
    Ok(views)
}

/// Writes `text` to stdout; a closed stdout (`| head`) is not an error.
fn print(text: &str) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

fn list(client: &Client, name_prefix: &str, json: bool) -> Result<(), Failure> {
    let views = locks(client, name_prefix)?;
    if views.is_empty() {
        return Err(Failure::not_found(if name_prefix.is_empty() {
            "no lock held".to_owned()
        } else {
            format!(
                "no lock held whose name starts with \"{}\"",
                render::printable(name_prefix)
            )
        }));
    }
    print(&if json {
        render::json_lines(&views)
    } else {
        render::table(&views)
    });
    Ok(())
}

fn show(client: &Client, quorum: bool, name: &str, json: bool) -> Result<(), Failure> {
    let views = lock_info(client, quorum, name)?;
    if views.is_empty() {
        return Err(Failure::not_found(format!(
            "nothing holds or waits for a lock named \"{}\"",
            render::printable(name)
        )));
    }
    print(&if json {
        render::json_lines(&views)
    } else {
        render::show(&views)
    });
    Ok(())
}

fn unlock(
    client: &Client,
    quorum: bool,
    name: &str,
    kind: Option<Kind>,
    yes: bool,
) -> Result<(), Failure> {
    let views = lock_info(client, quorum, name)?;
    let chosen = prompt::choose(name, &views, kind)?;
    let stdin = io::stdin();
    prompt::confirm(
        yes,
        stdin.is_terminal(),
        &prompt::question(chosen),
        &mut stdin.lock(),
        &mut io::stderr(),
    )?;
    let lock_kind: LockKind = chosen
        .kind
        .as_str()
        .parse()
        .map_err(|_| Failure::usage(format!("the library has no lock type {}", chosen.kind)))?;
    let shown = render::printable(name);
    if client.force_unlock(name, lock_kind).map_err(failure)? {
        print(&prompt::unlocked(chosen));
        Ok(())
    } else {
        Err(Failure::not_found(format!(
            "the {} \"{shown}\" was no longer held; nothing changed",
            chosen.kind
        )))
    }
}

/// The listener of the release channels: one server, or the Sentinel master (none on a
/// cluster, whose channels are sharded per node, nor with a quorum, whose every master
/// publishes each release).
fn listener(conn: &ConnArgs, target: &Target) -> Result<Option<Listener>, Failure> {
    let source = match target {
        Target::Single(url) => Source::Server(listen::parse(&url.0)?),
        Target::Sentinel { sentinels, master } => {
            let mut settings = redis::RedisConnectionInfo::default();
            if let Some(user) = &conn.master_user {
                settings = settings.set_username(user);
            }
            if let Some(password) = &conn.master_password {
                settings = settings.set_password(&password.0);
            }
            if let Some(db) = conn.master_db {
                settings = settings.set_db(db);
            }
            Source::Sentinel {
                sentinels: sentinels
                    .iter()
                    .map(|u| listen::parse(&u.0))
                    .collect::<Result<_, _>>()?,
                master: master.clone(),
                settings,
            }
        }
        Target::Cluster(_) | Target::Redlock(_) => return Ok(None),
    };
    let root_cert = match &conn.tls_ca {
        Some(ca) => Some(read_pem("--tls-ca", ca)?),
        None => None,
    };
    let client_tls = match (&conn.tls_cert, &conn.tls_key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read_pem("--tls-cert", cert)?,
            client_key: read_pem("--tls-key", key)?,
        }),
        _ => None,
    };
    let certs = (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
        client_tls,
        root_cert,
    });
    Ok(Some(Listener {
        source,
        certs,
        timeout: conn.timeout,
    }))
}

fn watch(
    client: &Client,
    conn: &ConnArgs,
    target: &Target,
    name_prefix: &str,
    frames: Option<u64>,
) -> Result<(), Failure> {
    let listener = listener(conn, target)?;
    let header = watch::Header {
        prefix: conn.prefix.clone(),
        name_prefix: name_prefix.to_owned(),
        channels: listener.is_some(),
        topology: match target {
            Target::Redlock(_) => "redlock",
            _ => "cluster",
        },
    };
    let rx = match listener {
        Some(l) => {
            let (tx, rx) = mpsc::channel();
            l.spawn(
                conn.prefix.clone(),
                watch::pattern(&conn.prefix, name_prefix),
                tx,
            )
            .map_err(|e| Failure::redis(format!("could not start the listener thread: {e}")))?;
            Some(rx)
        }
        None => None,
    };
    let stdout = io::stdout();
    let clear = stdout.is_terminal();
    watch::run(
        &header,
        frames,
        || locks(client, name_prefix),
        rx.as_ref(),
        clear,
        &mut stdout.lock(),
    )
}
