//! Config file reloading: the file's modification time (and size) is polled every
//! [`POLL_INTERVAL`]; on change the file is re-read and resolved with the same command-line
//! flags. A file that fails to read, parse or validate keeps the old config; the reason is
//! logged and counted (`kvgate_config_reload_errors`).

use crate::config::{FileConfig, GatewayConfig};
use crate::serve::ServeArgs;
use crate::state::Shared;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies a version of the config file: modification time and size.
pub type Stamp = Option<(SystemTime, u64)>;

/// The file's current [`Stamp`]; take it *before* reading the file, so that a change made
/// while it is read is seen by the next poll.
pub fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Re-reads the config file and applies it; Err (old config kept) when it is invalid.
pub fn reload_now(shared: &Arc<Shared>, args: &ServeArgs, path: &Path) -> Result<(), String> {
    let result = FileConfig::load(path)
        .and_then(|file| GatewayConfig::resolve(args, Some(&file)))
        .map_err(|e| e.to_string());
    match result {
        Ok(new) => {
            if **shared.config() != new {
                for pod in shared.apply_config(new) {
                    start_pod(shared, pod);
                }
                tracing::info!(path = %path.display(), "config reloaded");
            }
            Ok(())
        }
        Err(why) => {
            shared.metrics.config_reload_errors.inc();
            tracing::warn!(path = %path.display(), %why, "config file rejected; keeping the old config");
            Err(why)
        }
    }
}

/// Starts an added pod's scrape loop (and KV-event subscriber, when it has events); both stop
/// when the pod is removed.
pub fn start_pod(shared: &Arc<Shared>, pod: Arc<crate::pods::Pod>) {
    crate::kv_events::spawn_for(shared, &pod);
    tokio::spawn(crate::scrape::scrape_loop(shared.clone(), pod));
}

/// Polls `args.config` until the task is dropped; `loaded` is the stamp of the version in use.
pub async fn watch(shared: Arc<Shared>, args: ServeArgs, loaded: Stamp) {
    let Some(path) = args.config.clone() else {
        return;
    };
    let mut last = loaded;
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    loop {
        ticker.tick().await;
        let now = stamp(&path);
        if now != last {
            last = now;
            let _ = reload_now(&shared, &args, &path);
        }
    }
}
