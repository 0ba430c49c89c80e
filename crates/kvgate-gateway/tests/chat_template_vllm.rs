//! Chat prompts in token mode equal vLLM's own: conversations rendered and tokenized through the
//! gateway's tokenizer API (`GatewayTokenizer::encode_chat`) give exactly the token ids a real
//! vLLM returns from `POST /tokenize` for the same body, with the model's chat template and with
//! a richer test template (tests/fixtures/chat_template_rich.jinja, sent as the request's
//! `chat_template`: the pod must run with `--trust-request-chat-template`), which is also
//! compared with Hugging Face transformers' `apply_chat_template`.
//!
//! Environment:
//! - `KVGATE_VLLM_URL` (a running pod, e.g. http://127.0.0.1:18300) and `KVGATE_VLLM_MODEL_DIR`
//!   (the model it serves: tokenizer.json, tokenizer_config.json, chat_template.jinja);
//!   `KVGATE_VLLM_SERVED_MODEL` its served name (default `tiny`, scripts/real-vllm/pod.sh's).
//! - `KVGATE_VLLM_PYTHON`: a Python with transformers, for the transformers comparison.
//! - Unset, each test says so on stderr and passes — unless `KVGATE_REQUIRE_VLLM=1` (CI), when
//!   it fails instead.

use kvgate_gateway::tokenizer::GatewayTokenizer;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn required() -> bool {
    std::env::var("KVGATE_REQUIRE_VLLM").is_ok_and(|v| v == "1")
}

/// The env var, or `None` after saying the test did not run (a panic with `KVGATE_REQUIRE_VLLM=1`).
fn env_or_skip(test: &str, names: &[&str]) -> Option<Vec<String>> {
    let values: Vec<Option<String>> = names
        .iter()
        .map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
        .collect();
    if values.iter().all(Option::is_some) {
        return Some(values.into_iter().flatten().collect());
    }
    let msg = format!("{test}: not run: set {} to run it", names.join(" and "));
    assert!(!required(), "KVGATE_REQUIRE_VLLM=1 but {msg}");
    eprintln!("{msg}");
    None
}

/// POST the JSON text `payload` to `url` + `path` (plain HTTP/1.1): status and JSON body.
fn post(url: &str, path: &str, payload: &str) -> (u16, Value) {
    let hostport = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut stream = std::net::TcpStream::connect(&hostport).expect("connect to the vLLM pod");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, rest) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// `body` (a JSON object's text) with `fields` (key, JSON text) put first, its own order kept.
fn with_fields(body: &str, fields: &[(&str, String)]) -> String {
    let rest = body.trim_start().strip_prefix('{').expect("a JSON object");
    let mut out = String::from("{");
    for (k, v) in fields {
        out.push_str(&format!("{}: {v}, ", json!(k)));
    }
    out.push_str(rest);
    out
}

/// vLLM's token ids for a chat body, or its error message.
fn vllm_ids(url: &str, body: &str) -> Result<Vec<u32>, String> {
    let (status, answer) = post(url, "/tokenize", body);
    if status != 200 {
        return Err(format!("{status}: {answer}"));
    }
    Ok(serde_json::from_value(answer["tokens"].clone()).unwrap())
}

/// The conversations compared: every shape the gateway has to render the way vLLM does.
/// Bodies are JSON text: objects keep the key order written here (`json!` sorts keys), so the
/// order-sensitive cases are raw strings.
fn conversations() -> Vec<(&'static str, String)> {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
        {"function": {"name": "no_description", "parameters": {"b": 1, "a": 2}}, "type": "function"}
    ]);
    let long = "All work and no play makes Jack a dull boy. ".repeat(120);
    let mut cases: Vec<(&str, String)> = vec![(
        "key order kept (tools and arguments)",
        r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": "f",
              "arguments": "{\"zeta\": 1, \"alpha\": [2.50, 1e3, -0.0]}"}, "id": "c9"}]}],
              "tools": [{"function": {"parameters": {"type": "object", "properties":
              {"zeta": {"type": "number"}, "alpha": {"type": "array"}}}, "name": "f",
              "description": "d"}, "type": "function"}]}"#
            .to_string(),
    )];
    let sorted = vec![
        (
            "one user turn",
            json!({"messages": [{"role": "user", "content": "Hello!"}]}),
        ),
        (
            "system and user",
            json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"}]}),
        ),
        (
            "multi-turn",
            json!({"messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
            {"role": "assistant", "content": "Green."},
            {"role": "user", "content": "And a third."}]}),
        ),
        (
            "unicode",
            json!({"messages": [
            {"role": "user", "content": "Grüße aus Köln — 日本語のテキスト, emoji 🙂🚀, Ελληνικά, \u{2028} עברית"}]}),
        ),
        (
            "empty content",
            json!({"messages": [
            {"role": "system", "content": ""}, {"role": "user", "content": ""}]}),
        ),
        (
            "null content",
            json!({"messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": null},
            {"role": "user", "content": "again"}]}),
        ),
        (
            "content as text parts",
            json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "First part."},
                {"type": "text", "text": "Second part."}]}]}),
        ),
        (
            "parts of several text kinds",
            json!({"messages": [
            {"role": "user", "content": [{"type": "input_text", "text": "in"}, "bare string",
                {"type": "refusal", "refusal": "no"}, {"type": "text", "text": null}]}]}),
        ),
        (
            "tool call and tool result",
            json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
            {"role": "user", "content": "Thanks"}]}),
        ),
        (
            "tool result as text parts",
            json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r1"},
                {"type": "text", "text": "r2"}]}]}),
        ),
        (
            "request with tools",
            json!({"messages": [
            {"role": "user", "content": "Weather in Rome?"}], "tools": tools}),
        ),
        (
            "add_generation_prompt false",
            json!({"messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
            "add_generation_prompt": false}),
        ),
        (
            "continue_final_message",
            json!({"messages": [
            {"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "One, two,"}],
            "add_generation_prompt": false, "continue_final_message": true}),
        ),
        (
            "developer role",
            json!({"messages": [
            {"role": "system", "content": "sys"}, {"role": "user", "content": "u"},
            {"role": "developer", "content": "dev note"}]}),
        ),
        (
            "named participant",
            json!({"messages": [
            {"role": "user", "name": "alice", "content": "Hi, I am Alice."}]}),
        ),
        (
            "billing header in system text",
            json!({"messages": [
            {"role": "system", "content": "x-anthropic-billing-header: cch=123\nReal system prompt"},
            {"role": "user", "content": "hello"}]}),
        ),
        (
            "whitespace and newlines",
            json!({"messages": [
            {"role": "user", "content": "  leading and trailing  \n\n\ttabs\r\nCRLF  "}]}),
        ),
        (
            "markup characters",
            json!({"messages": [
            {"role": "user", "content": "<b>bold</b> & 'quotes' \"double\" {{ not jinja }} {% raw %}"}]}),
        ),
        (
            "long prompt",
            json!({"messages": [{"role": "user", "content": long}]}),
        ),
        (
            "chat_template_kwargs and reasoning_effort",
            json!({"messages": [
            {"role": "user", "content": "think"}], "chat_template_kwargs": {"foo": "bar"},
            "reasoning_effort": "low"}),
        ),
        (
            "add_special_tokens true",
            json!({"messages": [
            {"role": "user", "content": "with BOS"}], "add_special_tokens": true}),
        ),
        (
            "assistant reasoning",
            json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "because"},
            {"role": "user", "content": "q2"}]}),
        ),
    ];
    cases.extend(sorted.into_iter().map(|(n, v)| (n, v.to_string())));
    cases
}

struct Compared {
    matched: usize,
    both_refused: usize,
}

/// Compares the gateway's ids for each case with vLLM's (sent with `vllm_fields` first);
/// panics listing every mismatch.
fn compare_with_vllm(
    tokenizer: &GatewayTokenizer,
    url: &str,
    cases: &[(&str, String)],
    vllm_fields: &[(&str, String)],
) -> Compared {
    let mut mismatches = Vec::new();
    let (mut matched, mut both_refused) = (0, 0);
    for (name, body) in cases {
        let ours = tokenizer
            .encode_chat(body.as_bytes())
            .expect("the tokenizer has a chat template");
        let theirs = vllm_ids(url, &with_fields(body, vllm_fields));
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) if a == b => matched += 1,
            (Err(_), Err(_)) => both_refused += 1,
            _ => mismatches.push(format!("{name}:\n  kvgate {ours:?}\n  vLLM   {theirs:?}")),
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    Compared {
        matched,
        both_refused,
    }
}

fn rich_template() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_template_rich.jinja")
}

/// The rich template's cases: the conversations above, plus ones its `raise_exception`s refuse.
fn rich_cases() -> Vec<(&'static str, String)> {
    let mut cases = conversations();
    cases.push((
        "bad role (raise_exception)",
        json!({"messages": [{"role": "user", "content": "x"}, {"role": "narrator", "content": "y"}]})
            .to_string(),
    ));
    cases.push((
        "starts with assistant (raise_exception)",
        json!({"messages": [{"role": "assistant", "content": "x"}]}).to_string(),
    ));
    cases.push((
        "bang suffix and tool call arguments",
        json!({"messages": [{"role": "user", "content": "!now"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"z\": [1, 2.5, null], \"a\": {\"é\": true}}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]}]})
        .to_string(),
    ));
    cases
}

fn model_tokenizer(dir: &str, template: Option<&Path>) -> GatewayTokenizer {
    let t = GatewayTokenizer::load(Some(&Path::new(dir).join("tokenizer.json")), template)
        .expect("load the model's tokenizer.json");
    assert!(
        t.chat_template().is_some(),
        "no chat template found in {dir}"
    );
    t
}

#[test]
fn chat_prompts_tokenize_exactly_as_vllm_with_the_models_template() {
    let Some(env) = env_or_skip(
        "chat_prompts_tokenize_exactly_as_vllm_with_the_models_template",
        &["KVGATE_VLLM_URL", "KVGATE_VLLM_MODEL_DIR"],
    ) else {
        return;
    };
    let model = std::env::var("KVGATE_VLLM_SERVED_MODEL").unwrap_or_else(|_| "tiny".into());
    let tokenizer = model_tokenizer(&env[1], None);
    let cases = conversations();
    let c = compare_with_vllm(
        &tokenizer,
        &env[0],
        &cases,
        &[("model", json!(model).to_string())],
    );
    eprintln!(
        "model's template: {} of {} conversations equal to vLLM's /tokenize ids, {} refused by both",
        c.matched,
        cases.len(),
        c.both_refused
    );
    assert!(c.matched >= 20, "only {} conversations matched", c.matched);
}

#[test]
fn chat_prompts_tokenize_exactly_as_vllm_with_a_rich_template() {
    let Some(env) = env_or_skip(
        "chat_prompts_tokenize_exactly_as_vllm_with_a_rich_template",
        &["KVGATE_VLLM_URL", "KVGATE_VLLM_MODEL_DIR"],
    ) else {
        return;
    };
    let model = std::env::var("KVGATE_VLLM_SERVED_MODEL").unwrap_or_else(|_| "tiny".into());
    let template = std::fs::read_to_string(rich_template()).unwrap();
    let tokenizer = model_tokenizer(&env[1], Some(&rich_template()));
    let cases = rich_cases();
    let fields = [
        ("model", json!(model).to_string()),
        ("chat_template", json!(template).to_string()),
    ];
    let c = compare_with_vllm(&tokenizer, &env[0], &cases, &fields);
    eprintln!(
        "rich template: {} of {} conversations equal to vLLM's /tokenize ids, {} refused by both",
        c.matched,
        cases.len(),
        c.both_refused
    );
    assert_eq!(c.both_refused, 2, "the two raise_exception cases");
    assert!(c.matched >= 20, "only {} conversations matched", c.matched);
}

#[test]
fn the_rich_template_renders_as_transformers_apply_chat_template() {
    let Some(env) = env_or_skip(
        "the_rich_template_renders_as_transformers_apply_chat_template",
        &["KVGATE_VLLM_PYTHON", "KVGATE_VLLM_MODEL_DIR"],
    ) else {
        return;
    };
    let template = std::fs::read_to_string(rich_template()).unwrap();
    let tokenizer = model_tokenizer(&env[1], Some(&rich_template()));
    // transformers renders messages as given, so these are already in the form vLLM hands
    // its template: string content, parsed arguments, tools as vLLM's schema dumps them.
    let tool = r#"{"type": "function", "function": {"name": "f", "description": null,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}"#;
    let cases: Vec<String> = vec![
        r#"{"messages": [{"role": "user", "content": "  Hello  "}]}"#.into(),
        r#"{"messages": [{"role": "system", "content": " sys "}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "!u2"}]}"#.into(),
        r#"{"messages": [{"role": "user", "content": "Grüße 🙂 日本"}], "add_generation_prompt": false}"#.into(),
        format!(
            r#"{{"messages": [{{"role": "user", "content": "w"}},
            {{"role": "assistant", "content": "", "tool_calls": [{{"id": "c", "type": "function",
                "function": {{"arguments": {{"q": "x", "n": [1, 2.5, null, true]}}, "name": "f"}}}}]}},
            {{"role": "tool", "content": "r", "tool_call_id": "c"}}], "tools": [{tool}, {tool}]}}"#
        ),
        r#"{"messages": [{"role": "user", "content": "<b>&'\"</b>"}]}"#.into(),
        r#"{"messages": [{"role": "critic", "content": "x"}]}"#.into(),
    ];
    let request = format!(
        r#"{{"model_dir": {}, "template": {}, "cases": [{}]}}"#,
        json!(env[1]),
        json!(template),
        cases.join(", ")
    );
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_apply_chat_template.py");
    let mut child = std::process::Command::new(&env[0])
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run KVGATE_VLLM_PYTHON");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the transformers script failed");
    let theirs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), cases.len());
    let (mut matched, mut both_refused) = (0, 0);
    for (case, theirs) in cases.iter().zip(&theirs) {
        let ours = tokenizer
            .encode_chat(case.as_bytes())
            .expect("a chat template");
        match (ours, theirs.get("error")) {
            (Err(_), Some(_)) => both_refused += 1,
            (Ok(ids), None) => {
                let theirs: Vec<u32> = serde_json::from_value(theirs.clone()).unwrap();
                assert_eq!(ids, theirs, "{case}");
                matched += 1;
            }
            (ours, _) => panic!("{case}: kvgate {ours:?}, transformers {theirs}"),
        }
    }
    eprintln!(
        "rich template: {matched} of {} cases equal to transformers' ids, {both_refused} refused by both",
        cases.len()
    );
    assert_eq!((matched, both_refused), (5, 1));
}
