//! Servers whose wall clock a test steps while they run: an NTP step, a VM restored from a
//! snapshot, an operator's `date -s`.
//!
//! [`enable`] builds a small shared library (`clock_shift.c`, with the C compiler `cc`) once
//! per process; every server this harness starts afterwards in the process (single servers,
//! replicas, sentinels, cluster nodes, on both Redis and Valkey) runs with it preloaded
//! (`LD_PRELOAD`). It adds an offset to the server's `CLOCK_REALTIME` (what `TIME`, key expiry
//! and every wall-clock reading of the server see); the monotonic clocks stay as they are,
//! as with a real step. [`step`] moves the offset of the server on a port; a server restarted
//! on the same port keeps it, as a host's clock does. `libfaketime` is not used: it allocates
//! while the server's allocator starts and hangs it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The variable naming the offset file, read by the preloaded library.
const FILE_VAR: &str = "LOCKSMITH_CLOCK_FILE";

static ENABLED: AtomicBool = AtomicBool::new(false);
static LIBRARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The directory of this process's offset files and library.
fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("locksmith-clock-{}", std::process::id()))
}

fn build() -> Result<PathBuf, String> {
    let dir = dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join("clock_shift.c");
    std::fs::write(&src, include_str!("clock_shift.c"))
        .map_err(|e| format!("{}: {e}", src.display()))?;
    let lib = dir.join("libclock_shift.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!("cannot run cc (a C compiler is needed to step server clocks): {e}")
        })?;
    if !out.status.success() {
        return Err(format!(
            "cc failed to build the clock shim: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(lib)
}

/// Builds the clock library (once per process) and starts every later server of this process
/// with it.
///
/// # Errors
/// When the library cannot be built (no `cc`).
pub fn enable() -> Result<(), String> {
    LIBRARY.get_or_init(build).clone()?;
    ENABLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// The offset file of the server on `port`.
fn file(port: u16) -> PathBuf {
    dir().join(format!("offset-{port}"))
}

/// Gives `cmd`, about to start the server of `port`, the clock library and its offset file
/// (offset 0 unless a test stepped that port's clock before), when [`enable`] was called.
pub(crate) fn apply(cmd: &mut Command, port: u16) {
    if !ENABLED.load(Ordering::SeqCst) {
        return;
    }
    let Some(Ok(lib)) = LIBRARY.get() else {
        return;
    };
    let path = file(port);
    if !path.exists() {
        let _ = std::fs::write(&path, 0i64.to_le_bytes());
    }
    cmd.env("LD_PRELOAD", lib).env(FILE_VAR, &path);
}

/// The current offset of the clock of the server on `port`, in microseconds.
pub fn offset_us(port: u16) -> i64 {
    std::fs::read(file(port))
        .ok()
        .and_then(|b| b.get(..8)?.try_into().ok())
        .map_or(0, i64::from_le_bytes)
}

/// Steps the wall clock of the server on `port` (started after [`enable`]) by `by_us`
/// microseconds (negative: back), at once.
///
/// # Panics
/// When clocks are not enabled, or the offset file cannot be written.
pub fn step(port: u16, by_us: i64) {
    assert!(
        ENABLED.load(Ordering::SeqCst),
        "clock_shift::enable() was not called before the server started"
    );
    let next = offset_us(port) + by_us;
    // Written in place (never replaced): the server maps this very file.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(file(port))
        .unwrap_or_else(|e| panic!("the clock file of port {port}: {e}"));
    f.write_all(&next.to_le_bytes())
        .unwrap_or_else(|e| panic!("the clock file of port {port}: {e}"));
}

/// Steps the clock of the server on `port` back by `by`.
pub fn step_back(port: u16, by: Duration) {
    step(port, -i64::try_from(by.as_micros()).unwrap_or(i64::MAX));
}

/// Steps the clock of the server on `port` forward by `by`.
pub fn step_forward(port: u16, by: Duration) {
    step(port, i64::try_from(by.as_micros()).unwrap_or(i64::MAX));
}
