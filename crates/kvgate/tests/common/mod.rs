//! Running the `kvgate serve` binary as a process in end-to-end tests.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `kvgate serve` process, killed when dropped (whatever way the test ends), with the
/// addresses it printed.
pub struct ServeProcess {
    pub child: Child,
    /// The traffic listener, `http://ip:port`.
    pub base: String,
    /// The admin listener, `http://ip:port`.
    pub admin: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kvgate serve` with `args` (and whatever `configure` adds, e.g. env), started; waits up to
/// 60 s for its "kvgate serving on http://A (admin http://B), …" line on stderr.
pub fn start_serve(args: &[&str], configure: impl FnOnce(&mut Command)) -> ServeProcess {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvgate"));
    cmd.arg("serve")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    configure(&mut cmd);
    let mut child = cmd.spawn().expect("start kvgate serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    // Keeps draining stderr after the line so the process never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("kvgate serving on ")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(rest.to_string());
            }
        }
    });
    let mut process = ServeProcess {
        child,
        base: String::new(),
        admin: String::new(),
    };
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("kvgate serve printed its listening line");
    process.base = line
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    process.admin = line
        .split("(admin ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .expect("the admin address in the listening line")
        .to_string();
    process
}
