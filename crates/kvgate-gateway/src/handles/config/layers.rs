//! The one merge of `kvgate serve`'s settings layers: each layer is a partial tree of keys (a
//! `serde_json::Value` object), laid over the ones before it key by key, and the result is read
//! once by [`super::Settings`]'s `Deserialize` (the keys no layer gives take their defaults
//! there, and `[router]`'s `gate_profile` is applied first, the given router keys over it).
//!
//! - **file**: TOML, YAML (`.yaml`/`.yml`) or JSON (`.json`), as written.
//! - **environment**: `KVGATE_<KEY>` for a top-level key, `__` between the levels of a nested
//!   one: `KVGATE_MAX_RETRIES=1`, `KVGATE_ROUTER__EPSILON_EXPLORE_STICKY=0`. A variable whose
//!   first level names no key is not a setting (the tests' `KVGATE_NATS_SERVER`, …) and is
//!   left alone.
//! - **flags**: `--set key.path=value` (repeatable, in order), `--set key+=value` appends to a
//!   list (`--pod URL` is `--set pods+=URL`).
//!
//! A value in the environment or `--set` is read as a TOML value when it is one (`0`, `true`,
//! `0.5`, `["x-a", "x-b"]`, `"123"` for a string of digits), else as a string
//! (`127.0.0.1:8080`, `app=vllm`). Before merging, the names of each layer are made canonical:
//! llm-d's camelCase `[router]` names become their keys ([`kvgate_core::config::router_key_name`])
//! and a renamed key becomes its new name ([`RENAMED`]), so that one key given under two names
//! in two layers is still one key.

use super::ConfigError;
use serde_json::{Map, Value};
use std::path::Path;

/// The prefix of the environment layer's variables.
pub const ENV_PREFIX: &str = "KVGATE_";

/// Top-level keys renamed, with their new names: the old name keeps working (a warning says
/// the new one). `max_queued_requests` is the admission queue at the top level; the
/// flow-control queue keeps that name under `[flow_control]`.
pub const RENAMED: &[(&str, &str)] = &[("max_queued_requests", "max_waiting_requests")];

/// Where a layer came from, for error messages.
pub fn describe_env() -> String {
    format!("the {ENV_PREFIX}* environment")
}

/// A config file's tree. An empty file is no keys, unless `reloaded` (then it is what a reader
/// sees half way through a truncate-then-write, and refused).
pub fn file_tree(path: &Path, reloaded: bool) -> Result<Value, ConfigError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: p.clone(),
        source,
    })?;
    if text.trim().is_empty() {
        return if reloaded {
            Err(ConfigError::EmptyFile { path: p })
        } else {
            Ok(Value::Object(Map::new()))
        };
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let parsed: Result<Value, String> = match ext {
        "yaml" | "yml" => serde_saphyr::from_str(&text).map_err(|e| e.to_string()),
        "json" => serde_json::from_str(&text).map_err(|e| e.to_string()),
        _ => toml::from_str(&text).map_err(|e| e.to_string()),
    };
    let tree = parsed.map_err(|message| ConfigError::Parse {
        path: p.clone(),
        message,
    })?;
    if !tree.is_object() {
        return Err(ConfigError::Parse {
            path: p,
            message: "expected a table of keys at the top".into(),
        });
    }
    Ok(canonical(tree))
}

/// The environment layer of `vars` (every variable of the process, or a test's): those named
/// `KVGATE_<KEY>[__<KEY>…]` whose first key is one of `top_keys`.
pub fn env_tree<'a>(
    vars: impl IntoIterator<Item = (&'a str, &'a str)>,
    top_keys: &[&str],
) -> Result<Value, ConfigError> {
    let mut tree = Value::Object(Map::new());
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let top = canonical_top(&path[0]);
        if !top_keys.contains(&top) {
            continue;
        }
        assign(&mut tree, &path, parse_value(value), false).map_err(|message| {
            ConfigError::Parse {
                path: describe_env(),
                message: format!("{name}: {message}"),
            }
        })?;
    }
    Ok(canonical(tree))
}

/// Applies `key.path=value` / `key.path+=value` assignments, in order, to `tree`.
pub fn apply_sets(tree: &mut Value, sets: &[String]) -> Result<(), ConfigError> {
    for set in sets {
        let bad = |message: String| ConfigError::Parse {
            path: "--set".into(),
            message: format!("{set:?}: {message}"),
        };
        let (key, value, append) = match set.split_once('=') {
            Some((k, v)) => match k.strip_suffix('+') {
                Some(k) => (k, v, true),
                None => (k, v, false),
            },
            None => return Err(bad("expected key.path=value".into())),
        };
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        if path.iter().any(String::is_empty) {
            return Err(bad("empty key".into()));
        }
        let value = if append {
            Value::String(value.to_string())
        } else {
            parse_value(value)
        };
        let canonical_path = canonical_path(&path);
        assign(tree, &canonical_path, value, append).map_err(bad)?;
    }
    Ok(())
}

/// Lays `over` on `base`: tables merge key by key, anything else replaces.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

/// A value from the environment or `--set`: a TOML value when it is one, else the string.
fn parse_value(text: &str) -> Value {
    #[derive(serde::Deserialize)]
    struct One {
        v: Value,
    }
    match toml::from_str::<One>(&format!("v = {text}")) {
        Ok(One { v }) => v,
        Err(_) => Value::String(text.to_string()),
    }
}

/// Sets `path` in `tree` to `value` (or appends it, to a list), making the tables on the way.
fn assign(tree: &mut Value, path: &[String], value: Value, append: bool) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty key")?;
    let mut node = tree;
    for key in parents {
        let Value::Object(map) = node else {
            return Err(format!("{key} is inside a key that is not a table"));
        };
        node = map
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    let Value::Object(map) = node else {
        return Err(format!("{last} is inside a key that is not a table"));
    };
    if append {
        match map
            .entry(last.clone())
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(list) => list.push(value),
            _ => return Err(format!("{last} is not a list: `+=` appends to lists only")),
        }
    } else {
        map.insert(last.clone(), value);
    }
    Ok(())
}

fn canonical_top(key: &str) -> &str {
    RENAMED
        .iter()
        .find(|(old, _)| *old == key)
        .map_or(key, |(_, new)| new)
}

fn canonical_path(path: &[String]) -> Vec<String> {
    let mut out: Vec<String> = path.to_vec();
    if let Some(top) = out.first_mut() {
        *top = canonical_top(top).to_string();
    }
    if out.len() == 2
        && out[0] == "router"
        && let Some(name) = kvgate_core::config::router_key_name(&out[1])
    {
        out[1] = name.to_string();
    }
    out
}

/// `tree` with its names made canonical (see the module docs).
fn canonical(tree: Value) -> Value {
    let Value::Object(map) = tree else {
        return tree;
    };
    let mut out = Map::new();
    for (key, value) in map {
        let new = canonical_top(&key);
        if new != key {
            tracing::warn!(old = %key, new = %new, "config key renamed; use the new name");
        }
        let value = match (new, value) {
            ("router", Value::Object(router)) => Value::Object(
                router
                    .into_iter()
                    .map(|(k, v)| {
                        let k = kvgate_core::config::router_key_name(&k).map_or(k, str::to_string);
                        (k, v)
                    })
                    .collect(),
            ),
            (_, value) => value,
        };
        merge_key(&mut out, new.to_string(), value);
    }
    Value::Object(out)
}

/// Inserts `key`; when the layer names it twice (an old and a new name), the later wins.
fn merge_key(map: &mut Map<String, Value>, key: String, value: Value) {
    match map.get_mut(&key) {
        Some(slot) => merge(slot, value),
        None => {
            map.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_read_as_toml_when_they_are_toml_else_as_strings() {
        assert_eq!(parse_value("0"), json!(0));
        assert_eq!(parse_value("0.5"), json!(0.5));
        assert_eq!(parse_value("true"), json!(true));
        assert_eq!(parse_value("[\"a\", \"b\"]"), json!(["a", "b"]));
        assert_eq!(parse_value("\"123\""), json!("123"));
        assert_eq!(parse_value("127.0.0.1:8080"), json!("127.0.0.1:8080"));
        assert_eq!(parse_value("app=vllm"), json!("app=vllm"));
        assert_eq!(parse_value("prefix"), json!("prefix"));
    }

    #[test]
    fn merge_lays_tables_key_by_key_and_replaces_the_rest() {
        let mut base = json!({"a": 1, "router": {"x": 1, "y": 2}, "l": [1]});
        merge(&mut base, json!({"router": {"y": 3}, "l": [2], "b": true}));
        assert_eq!(
            base,
            json!({"a": 1, "router": {"x": 1, "y": 3}, "l": [2], "b": true})
        );
    }

    #[test]
    fn env_names_nest_with_double_underscores_and_other_variables_are_left_alone() {
        let vars = [
            ("KVGATE_ROUTER__EPSILON_EXPLORE_STICKY", "0"),
            ("KVGATE_MAX_RETRIES", "1"),
            ("KVGATE_MAX_QUEUED_REQUESTS", "5"),
            ("KVGATE_NATS_SERVER", "/bin/nats"),
            ("PATH", "/bin"),
        ];
        let tree = env_tree(vars, &["router", "max_retries", "max_waiting_requests"]).unwrap();
        assert_eq!(
            tree,
            json!({"router": {"epsilon_explore_sticky": 0}, "max_retries": 1,
                   "max_waiting_requests": 5})
        );
    }

    #[test]
    fn sets_assign_append_and_name_keys_canonically() {
        let mut tree = json!({"pods": ["http://a:1"], "router": {"affinity_gate_tau": 0.5}});
        apply_sets(
            &mut tree,
            &[
                "pods+=http://b:1,events=tcp://b:5557".into(),
                "router.affinityGateTau=0.7".into(),
                "max_queued_requests=3".into(),
            ],
        )
        .unwrap();
        assert_eq!(
            tree,
            json!({"pods": ["http://a:1", "http://b:1,events=tcp://b:5557"],
                   "router": {"affinity_gate_tau": 0.7}, "max_waiting_requests": 3})
        );
        for bad in ["no_equals", "=1", "a..b=1", "router.x+=1"] {
            let mut t = json!({"router": {"x": 1}});
            assert!(apply_sets(&mut t, &[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_file_with_camel_case_router_names_merges_with_snake_case_ones() {
        let file = canonical(json!({"router": {"affinityGateTau": 0.5, "prefixWeight": 1}}));
        assert_eq!(
            file,
            json!({"router": {"affinity_gate_tau": 0.5, "weighted_prefix_weight": 1}})
        );
    }
}
