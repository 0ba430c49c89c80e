//! Config file reloading: the file's modification time (and size) is polled every
//! [`POLL_INTERVAL`]; on change the file is re-read and laid again under the same environment
//! and flags, through the same merge as at start (`[router]`: the `gate_profile` first, the keys
//! given over it). A file that fails to read, parse or validate keeps the old config; the reason
//! is logged at warn and counted (`kvgate_config_reload_errors`). So does an empty (or
//! whitespace-only) file, and one that leaves no configured pod while discovery is static,
//! unless it sets `allow_empty_pods = true` ([`GatewayConfig::check_reloaded`]): a
//! truncate-then-write caught half way would otherwise route nothing. A file that changes a
//! key read at start only ([`crate::config::KEYS`], [`GatewayConfig::start_only_changes`]:
//! listeners, slots, `index`, a kept pod's KV events, …) is refused whole the same way, logged at error with the
//! settings it names: applying the rest would leave the file saying what the gateway does not
//! do.

use crate::config::{GatewayConfig, ServeArgs};
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

/// Re-reads the config file (`args.config`, at `path`) and applies it; Err (old config kept) when it is invalid.
pub fn reload_now(shared: &Arc<Shared>, args: &ServeArgs, path: &Path) -> Result<(), String> {
    let result = GatewayConfig::from_args_reloaded(args)
        .and_then(|new| new.check_reloaded().map(|()| new))
        .map_err(|e| e.to_string());
    match result {
        Ok(new) => {
            let (restart_needed, changed) = {
                let running = shared.config();
                (new.start_only_changes(&running), **running != new)
            };
            if !restart_needed.is_empty() {
                // Refused whole, not half applied: the file now says something the gateway
                // does not do, and `/debug/config` would not show it.
                let why = format!(
                    "it changes settings read at start only ({}); restart kvgate to apply them, \
                     or put their running values back",
                    restart_needed.join(", ")
                );
                shared.telemetry.metrics.config_reload_errors.inc();
                tracing::error!(path = %path.display(), %why, "config file refused; keeping the old config");
                return Err(why);
            }
            if changed {
                for pod in shared.apply_config(new) {
                    start_pod(shared, pod);
                }
                tracing::info!(path = %path.display(), "config reloaded");
            }
            Ok(())
        }
        Err(why) => {
            shared.telemetry.metrics.config_reload_errors.inc();
            tracing::warn!(path = %path.display(), %why, "config file rejected; keeping the old config");
            Err(why)
        }
    }
}

/// Starts an added pod's scrape loop, its model-list reader (and KV-event subscriber, when it
/// has events); all stop when the pod is removed.
pub fn start_pod(shared: &Arc<Shared>, pod: Arc<crate::pods::Pod>) {
    crate::kv_events::spawn_for(shared, &pod);
    tokio::spawn(crate::served_models::models_loop(
        shared.clone(),
        pod.clone(),
    ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::RouterConfig;
    use kvgate_core::config::ExploreMode;

    #[tokio::test]
    async fn a_reload_to_the_seed_profile_runs_the_seed_gate_and_a_bad_file_keeps_it() {
        let dir = std::env::temp_dir().join(format!("kvgate-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvgate.toml");
        std::fs::write(
            &path,
            "pods = [\"http://127.0.0.1:9\"]\n[router]\nexplore_max_extra_ms = 40\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        };
        let config = GatewayConfig::from_args(&args).unwrap();
        assert_eq!(config.router.explore_mode, ExploreMode::RandomNonSticky);
        let shared = Shared::new(config.clone());
        shared.apply_config(config);

        std::fs::write(
            &path,
            "allow_empty_pods = true\n[router]\ngate_profile = \"seed\"\n",
        )
        .unwrap();
        reload_now(&shared, &args, &path).unwrap();
        assert_eq!(shared.config().router, RouterConfig::seed());
        assert_eq!(
            *shared.session.lock().router().config(),
            RouterConfig::seed()
        );

        std::fs::write(&path, "[router]\ngate_profile = \"sead\"\n").unwrap();
        let why = reload_now(&shared, &args, &path).unwrap_err();
        assert!(why.contains("sead"), "{why}");
        assert_eq!(shared.config().router, RouterConfig::seed());
        assert_eq!(shared.telemetry.metrics.config_reload_errors.get(), 1);
    }

    fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvgate-reload-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvgate.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A gateway's state started from a config file holding `text`.
    fn started(name: &str, text: &str) -> (std::path::PathBuf, ServeArgs, Arc<Shared>) {
        let path = temp_config(name, text);
        let args = ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        };
        let config = GatewayConfig::from_args(&args).unwrap();
        let shared = Shared::new(config.clone());
        shared.apply_config(config);
        (path, args, shared)
    }

    #[tokio::test]
    async fn an_empty_file_or_no_pods_on_reload_keeps_the_last_good_config_and_is_counted() {
        let good = "pods = [\"http://127.0.0.1:9\"]\nmax_retries = 1\n";
        let (path, args, shared) = started("empty", good);
        // What a truncate-then-write shows half way, an empty ConfigMap, a list emptied.
        for (n, bad) in ["", " \n\t\n", "pods = []\n", "max_retries = 0\n"]
            .into_iter()
            .enumerate()
        {
            std::fs::write(&path, bad).unwrap();
            let why = reload_now(&shared, &args, &path).unwrap_err();
            assert!(
                why.contains("empty") || why.contains("no pods"),
                "{bad:?}: {why}"
            );
            assert_eq!(shared.config().pods.len(), 1, "{bad:?}");
            assert_eq!(shared.fleet.pods.all().len(), 1, "{bad:?}");
            assert_eq!(shared.config().max_retries, 1, "{bad:?}");
            assert_eq!(
                shared.telemetry.metrics.config_reload_errors.get(),
                n as u64 + 1
            );
        }
        // Asked for explicitly: no pods is a config.
        std::fs::write(&path, "pods = []\nallow_empty_pods = true\n").unwrap();
        reload_now(&shared, &args, &path).unwrap();
        assert!(shared.config().pods.is_empty());
        assert!(shared.fleet.pods.all().is_empty());
        assert_eq!(shared.telemetry.metrics.config_reload_errors.get(), 4);
        // An empty file is refused even then: it cannot say what it means.
        std::fs::write(&path, "").unwrap();
        assert!(reload_now(&shared, &args, &path).is_err());
        assert!(shared.config().allow_empty_pods);
    }

    #[tokio::test]
    async fn a_reload_that_changes_a_start_only_setting_is_refused_whole() {
        let good = "pods = [\"http://127.0.0.1:9\"]\nmax_retries = 1\n";
        let (path, args, shared) = started("start-only", good);
        // A live key and a start-only one together: neither applies.
        std::fs::write(
            &path,
            "pods = [\"http://127.0.0.1:9\"]\nmax_retries = 0\nindex = \"engine\"\n",
        )
        .unwrap();
        let why = reload_now(&shared, &args, &path).unwrap_err();
        assert!(why.contains("index") && why.contains("restart"), "{why}");
        assert_eq!(shared.config().max_retries, 1);
        assert_eq!(shared.config().index, crate::config::IndexKind::Routed);
        assert_eq!(shared.telemetry.metrics.config_reload_errors.get(), 1);
        // The start-only key back to its running value: the live change applies.
        std::fs::write(&path, "pods = [\"http://127.0.0.1:9\"]\nmax_retries = 0\n").unwrap();
        reload_now(&shared, &args, &path).unwrap();
        assert_eq!(shared.config().max_retries, 0);
        assert_eq!(shared.telemetry.metrics.config_reload_errors.get(), 1);
    }

    #[tokio::test]
    async fn keys_that_were_flags_only_reload_when_live_and_are_refused_when_start_only() {
        let good = "pods = [\"http://127.0.0.1:9\"]\n";
        let (path, args, shared) = started("flag-keys", good);
        // A live key that was a flag only: applied.
        std::fs::write(&path, format!("{good}first_byte_timeout_ms = 1234\n")).unwrap();
        reload_now(&shared, &args, &path).unwrap();
        assert_eq!(
            shared.config().first_byte_timeout,
            Duration::from_millis(1234)
        );
        // Start-only keys that were flags only: refused whole, named, counted; nothing applied.
        std::fs::write(
            &path,
            format!("{good}first_byte_timeout_ms = 1\ncapture = \"/tmp/c.jsonl\"\nseed = 3\n"),
        )
        .unwrap();
        let why = reload_now(&shared, &args, &path).unwrap_err();
        assert!(why.contains("seed, capture"), "{why}");
        assert_eq!(
            shared.config().first_byte_timeout,
            Duration::from_millis(1234)
        );
        assert_eq!(shared.config().capture, None);
        assert_eq!(shared.telemetry.metrics.config_reload_errors.get(), 1);
    }

    #[tokio::test]
    async fn with_discovery_a_reloaded_file_without_pods_is_accepted() {
        let path = temp_config("discovery", "pods = [\"http://127.0.0.1:9\"]\n");
        let args = ServeArgs {
            config: Some(path.clone()),
            discovery: Some(crate::config::DiscoveryKind::Kubernetes),
            ..ServeArgs::default()
        };
        let config = GatewayConfig::from_args(&args).unwrap();
        let shared = Shared::new(config.clone());
        shared.apply_config(config);
        std::fs::write(&path, "max_retries = 0\n").unwrap();
        reload_now(&shared, &args, &path).unwrap();
        assert!(shared.config().pods.is_empty());
        assert_eq!(shared.config().max_retries, 0);
        // Still, an empty file is a write caught half way.
        std::fs::write(&path, "").unwrap();
        assert!(reload_now(&shared, &args, &path).is_err());
        assert_eq!(shared.telemetry.metrics.config_reload_errors.get(), 1);
    }
}
