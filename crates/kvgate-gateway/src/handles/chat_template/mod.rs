//! The served model's chat template, rendered as vLLM 0.32 renders it, so that in token mode a
//! chat request is cut into the same token blocks as on the engine (the model's template, not
//! kvgate's own rendering `kvgate_core::request::render_chat`).
//!
//! # Where the template comes from
//! Loaded once at start, next to the `--tokenizer` file, as `transformers` loads it:
//! `chat_template.jinja` (plus named ones in `additional_chat_templates/NAME.jinja`), else the
//! `chat_template` key of `tokenizer_config.json` (a string, or a list of `{name, template}`);
//! `--chat-template FILE` replaces it. The special tokens (`bos_token`, `eos_token`, `unk_token`,
//! `sep_token`, `pad_token`, `cls_token`, `mask_token`: strings or `{"content": …}` objects) come
//! from `tokenizer_config.json`, else `special_tokens_map.json`. A request with `tools` uses the
//! template named `tool_use` when there is one, else `default` (`get_chat_template`).
//!
//! # What vLLM does between `messages` and token ids (read in vLLM 0.32's source:
//! `vllm/renderers/chat_utils.py`, `vllm/renderers/hf.py`, `vllm/renderers/params.py`,
//! `vllm/entrypoints/openai/chat_completion/protocol.py`, `…/serve/tokenize/protocol.py`, and
//! `transformers`' `utils/chat_template_utils.py`), mirrored here:
//! - **Content format.** vLLM looks at the template: one that loops over a message's content
//!   (`for x in message['content']`, `… in content`) gets content as a list of
//!   `{"type": "text", "text": …}` parts ("openai"); any other gets one string, the text parts
//!   joined by `\n` ("string"). A string content is one text part; a null or absent one none.
//!   kvgate detects the loop by scanning the template's `{% for %}` tags (vLLM walks the Jinja
//!   AST; a loop over a macro parameter bound to the content is not detected here).
//! - **Messages** are rebuilt as vLLM's "conversation" (see [`conversation`]): `role`,
//!   `content`, then `tool_calls` (arguments parsed from their JSON string into a dict; an empty
//!   list dropped), `reasoning` + `reasoning_content`, `tool_call_id`, `name`, `task`; tool
//!   results sent as text parts become one string; Claude Code's billing-header line is dropped
//!   from system text; a template that never names `developer` gets developer messages as one
//!   merged system message.
//! - **Tools** as vLLM's schema dumps them (`description`/`parameters` `None` when absent, other
//!   fields dropped).
//! - **Variables**: the special tokens, `chat_template_kwargs`, `reasoning_effort` (and
//!   `enable_thinking = reasoning_effort != "none"` unless the kwargs set it), then `messages`,
//!   `tools` (`None` without), `documents`, `add_generation_prompt` (request field, default
//!   true). Values `None` or `"auto"` in the kwargs are dropped, as vLLM's `merge_kwargs` does.
//!   `continue_final_message` (request field) is applied as `transformers` does (a marker after
//!   the last message's text, the rendering cut there); it is not a template variable.
//! - **Jinja environment** as `transformers`': `trim_blocks`, `lstrip_blocks`, `{% break %}` /
//!   `{% continue %}`, no autoescape; `raise_exception(msg)`, `strftime_now(fmt)`, and `tojson`
//!   as `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)` (separators
//!   `", "` and `": "`, no HTML escaping; minijinja's own escapes `<>&'`). Python string and
//!   dict methods (`.strip()`, `.startswith()`, `.items()`, …) come from `minijinja-contrib`'s
//!   pycompat; `{{ x }}` of a list, dict or float prints Python's `repr`.
//! - **Tokens**: the rendered text is tokenized with `add_special_tokens` = the request field,
//!   default **false** for chat (the template writes the BOS itself).
//!
//! # Limits
//! - Multimodal content parts (images, audio, video, embeddings, files) and a request carrying
//!   its own `chat_template` are not rendered: the prompt scores cold ([`ChatTemplateError`]).
//! - `strftime_now` reads the gateway's clock in UTC; vLLM reads the pod's local time. A
//!   template that prints the date (Llama 3.x) renders differently across midnight or in another
//!   time zone, and every day's prompts start a new prefix — as on the engine.
//! - Templates using what minijinja lacks (`{% generation %}`, Python `%` string formatting,
//!   methods pycompat lacks) fail to load or render: the start fails (bad syntax) or the prompt
//!   scores cold (a render error). `{{ x|string }}` or `~` of a list prints minijinja's form.
//! - Pod-side flags kvgate cannot see: vLLM's own `--chat-template`,
//!   `--chat-template-content-format` and `--default-chat-template-kwargs` must be matched here
//!   (`--chat-template`) or left at their defaults.
//!
//! Memory: the template sources and their compiled form, once per process.

pub(crate) mod conversation;
pub(crate) mod python;

use conversation::{ContentFormat, Json, Obj};

/// Template instructions one render may execute (minijinja's fuel): a render of a body of
/// hundreds of thousands of messages fits (~1 s in a release build), a request cannot make one
/// run for minutes. Unit tests use a smaller budget so that running out takes no time in a
/// debug build.
pub const RENDER_FUEL: u64 = if cfg!(test) { 2_000_000 } else { 50_000_000 };
/// Widest `tojson(indent=N)` accepted; wider is clamped.
const MAX_TOJSON_INDENT: i64 = 16;

/// Most bytes a render may produce: 8 × the body it came from, at least 1 MiB, at most 256 MiB.
/// A template only ever adds a bounded amount of markup per message; output beyond this means
/// the body exploits the template (deep `tools` printed with `indent`), and it is refused.
pub fn render_output_limit(body_bytes: usize) -> usize {
    body_bytes.saturating_mul(8).clamp(1 << 20, 256 << 20)
}

/// The render's output, refused past `limit` bytes.
struct LimitedOutput {
    text: String,
    limit: usize,
}

impl std::io::Write for LimitedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.limit {
            return Err(std::io::Error::other(
                "rendered prompt over the output budget",
            ));
        }
        // minijinja writes whole UTF-8 strings.
        match std::str::from_utf8(buf) {
            Ok(s) => self.text.push_str(s),
            Err(_) => return Err(std::io::Error::other("rendered prompt is not UTF-8")),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The names of `transformers`' special-token attributes (`SPECIAL_TOKENS_ATTRIBUTES`), the
/// template variables they become.
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The arguments of `apply_chat_template` that are consumed there, never template variables.
const NOT_TEMPLATE_VARIABLES: [&str; 12] = [
    "conversation",
    "chat_template",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
    "continue_final_message",
    "tools",
];

/// `transformers`' marker for `continue_final_message` (`render_jinja_template`).
const CONTINUE_FINAL_MESSAGE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// At start: a template file unreadable, a config not JSON, a template that does not parse.
    #[error("cannot load chat template {path}: {message}")]
    Load { path: String, message: String },
    /// The request's chat fields are malformed or use what kvgate does not render.
    #[error("chat request not rendered: {0}")]
    Request(String),
    /// The template failed: `raise_exception`, an undefined call, a type error.
    #[error("chat template failed: {0}")]
    Render(String),
}

/// A rendered chat prompt and how to tokenize it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    pub text: String,
    /// The request's `add_special_tokens` (default false for chat, as vLLM).
    pub add_special_tokens: bool,
}

/// The model's chat template(s), compiled; cheap to clone.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// `tool_use` exists (picked for requests with tools).
    has_tool_use: bool,
    /// Per named template: does its text name the `developer` role, and its content format.
    formats: Arc<Vec<(String, bool, ContentFormat)>>,
    /// The special tokens' names and texts, the first template variables.
    special_tokens: Arc<Vec<(String, String)>>,
    /// The sources, as text: which file and key (for logs and /debug/config).
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChatTemplate({})", self.source)
    }
}

/// A request's chat fields, read from the raw body (so that objects keep their key order).
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Size of the body it came from: sets the rendering's output budget.
    body_bytes: usize,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    documents: Option<Json>,
    reasoning_effort: Option<Json>,
    chat_template_kwargs: Obj,
    add_generation_prompt: bool,
    continue_final_message: bool,
    add_special_tokens: bool,
}

impl ChatRequest {
    /// The chat fields of a `/v1/chat/completions` (or `/tokenize`) body.
    pub fn from_body(body: &[u8]) -> Result<ChatRequest, ChatTemplateError> {
        let body_len = body.len();
        let bad = |m: &str| ChatTemplateError::Request(m.to_string());
        let body: Json = serde_json::from_slice(body)
            .map_err(|e| ChatTemplateError::Request(format!("body is not JSON: {e}")))?;
        let body = body
            .as_object()
            .ok_or_else(|| bad("body is not an object"))?;
        let messages = match body.get("messages") {
            Some(Json::Array(m)) => m.clone(),
            _ => return Err(bad("messages must be a list")),
        };
        if body.get_some("chat_template").is_some() {
            return Err(bad("the request carries its own chat_template"));
        }
        let tools = match body.get_some("tools") {
            None => None,
            Some(Json::Array(t)) => Some(t.clone()),
            Some(_) => return Err(bad("tools must be a list")),
        };
        let flag = |key: &str, default: bool| match body.get_some(key) {
            None => Ok(default),
            Some(Json::Bool(b)) => Ok(*b),
            Some(_) => Err(ChatTemplateError::Request(format!(
                "{key} must be a boolean"
            ))),
        };
        let chat_template_kwargs = match body.get_some("chat_template_kwargs") {
            None => Obj::default(),
            Some(Json::Object(o)) => o.clone(),
            Some(_) => return Err(bad("chat_template_kwargs must be an object")),
        };
        let request = ChatRequest {
            body_bytes: body_len,
            messages,
            tools,
            documents: body.get_some("documents").cloned(),
            reasoning_effort: body.get_some("reasoning_effort").cloned(),
            chat_template_kwargs,
            add_generation_prompt: flag("add_generation_prompt", true)?,
            continue_final_message: flag("continue_final_message", false)?,
            add_special_tokens: flag("add_special_tokens", false)?,
        };
        if request.add_generation_prompt && request.continue_final_message {
            return Err(bad(
                "cannot set both continue_final_message and add_generation_prompt",
            ));
        }
        Ok(request)
    }
}

fn load_error(path: &Path, message: impl std::fmt::Display) -> ChatTemplateError {
    ChatTemplateError::Load {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn read(path: &Path) -> Result<String, ChatTemplateError> {
    std::fs::read_to_string(path).map_err(|e| load_error(path, e))
}

/// A special token's text: a string, or an `AddedToken` object's `content`.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, ChatTemplateError> {
    if !path.exists() {
        return Ok(None);
    }
    serde_json::from_str(&read(path)?)
        .map(Some)
        .map_err(|e| load_error(path, e))
}

impl ChatTemplate {
    /// The chat template of the model whose `tokenizer.json` is at `tokenizer_path`, or the
    /// template in `override_path`. `Ok(None)`: the model has none.
    pub fn load(
        tokenizer_path: &Path,
        override_path: Option<&Path>,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let dir = tokenizer_path.parent().unwrap_or(Path::new("."));
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?;
        let mut templates: Vec<(String, String)> = Vec::new();
        let source;
        if let Some(path) = override_path {
            templates.push(("default".into(), read(path)?));
            source = format!("{}", path.display());
        } else if dir.join("chat_template.jinja").exists() {
            let path = dir.join("chat_template.jinja");
            templates.push(("default".into(), read(&path)?));
            let extra_dir = dir.join("additional_chat_templates");
            if let Ok(entries) = std::fs::read_dir(&extra_dir) {
                let mut extra: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
                    .collect();
                extra.sort();
                for p in extra {
                    if let Some(name) = p.file_stem().and_then(|s| s.to_str()) {
                        templates.push((name.to_string(), read(&p)?));
                    }
                }
            }
            source = format!("{}", path.display());
        } else {
            match config.as_ref().and_then(|c| c.get("chat_template")) {
                None | Some(serde_json::Value::Null) => return Ok(None),
                Some(serde_json::Value::String(t)) => templates.push(("default".into(), t.clone())),
                Some(serde_json::Value::Array(list)) => {
                    for item in list {
                        let name = item.get("name").and_then(|n| n.as_str());
                        let text = item.get("template").and_then(|t| t.as_str());
                        match (name, text) {
                            (Some(n), Some(t)) => templates.push((n.into(), t.into())),
                            _ => {
                                return Err(load_error(
                                    &config_path,
                                    "chat_template list items need a name and a template",
                                ));
                            }
                        }
                    }
                }
                Some(_) => {
                    return Err(load_error(
                        &config_path,
                        "chat_template is neither a string nor a list",
                    ));
                }
            }
            source = format!("{} (chat_template)", config_path.display());
        }
        if !templates.iter().any(|(n, _)| n == "default") {
            return Err(load_error(
                Path::new(&source),
                "no template named \"default\"",
            ));
        }
        let mut special_tokens = Vec::new();
        let legacy = read_json(&dir.join("special_tokens_map.json"))?;
        for name in SPECIAL_TOKENS {
            let text = [config.as_ref(), legacy.as_ref()]
                .into_iter()
                .flatten()
                .find_map(|c| c.get(name).and_then(token_text));
            if let Some(text) = text {
                special_tokens.push((name.to_string(), text));
            }
        }
        Self::compile(templates, special_tokens, source)
    }

    /// Compiles `templates` (name, source; one named `default`) with `special_tokens`.
    pub fn from_sources(
        templates: Vec<(String, String)>,
        special_tokens: Vec<(String, String)>,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        Self::compile(templates, special_tokens, "given sources".into())?
            .ok_or_else(|| load_error(Path::new("given sources"), "no template"))
    }

    fn compile(
        templates: Vec<(String, String)>,
        special_tokens: Vec<(String, String)>,
        source: String,
    ) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_fuel(Some(RENDER_FUEL));
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| load_error(Path::new(&source), e))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, state, value| match python::python_str(value) {
            Some(s) => out.write_str(&s).map_err(minijinja::Error::from),
            None => minijinja::escape_formatter(out, state, value),
        });
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |format: String| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            python::strftime_utc(&format, now)
        });
        env.add_filter("tojson", tojson);
        let mut formats = Vec::new();
        for (name, text) in &templates {
            let developer = text.contains("\"developer\"") || text.contains("'developer'");
            formats.push((name.clone(), developer, detect_content_format(text)));
        }
        let has_tool_use = templates.iter().any(|(n, _)| n == "tool_use");
        for (name, text) in templates {
            env.add_template_owned(name.clone(), text)
                .map_err(|e| load_error(Path::new(&source), format!("template {name}: {e:#}")))?;
        }
        Ok(Some(ChatTemplate {
            env: Arc::new(env),
            has_tool_use,
            formats: Arc::new(formats),
            special_tokens: Arc::new(special_tokens),
            source,
        }))
    }

    /// Where the template came from (for logs).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `request` rendered with the model's template, as vLLM renders it.
    pub fn render(&self, request: &ChatRequest) -> Result<RenderedChat, ChatTemplateError> {
        let name = if request.tools.is_some() && self.has_tool_use {
            "tool_use"
        } else {
            "default"
        };
        let (names_developer, format) = self
            .formats
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, d, f)| (*d, *f))
            .unwrap_or((false, ContentFormat::String));
        let template = self
            .env
            .get_template(name)
            .map_err(|e| ChatTemplateError::Render(format!("{e:#}")))?;
        if request.messages.is_empty() {
            return Err(ChatTemplateError::Request("no messages".into()));
        }
        let mut messages = conversation::conversation(&request.messages, format)
            .map_err(ChatTemplateError::Request)?;
        let has_developer = messages
            .iter()
            .any(|m| m.get("role").and_then(Json::as_str) == Some("developer"));
        if has_developer && !names_developer {
            messages = conversation::developer_to_system(messages);
        }
        if request.continue_final_message {
            mark_final_message(&mut messages, template.source())?;
        }
        let tools = match &request.tools {
            Some(t) => Value::from(
                conversation::tools(t)
                    .map_err(ChatTemplateError::Request)?
                    .iter()
                    .map(Obj::to_value)
                    .collect::<Vec<_>>(),
            ),
            None => Value::from(()),
        };

        // transformers: {**special_tokens_map, **kwargs}, then the named arguments.
        let mut vars: Vec<(String, Value)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        let mut kwargs = request.chat_template_kwargs.clone();
        if let Some(effort) = &request.reasoning_effort {
            if !request.chat_template_kwargs.contains("enable_thinking") {
                let thinking = effort.as_str() != Some("none");
                kwargs.insert("enable_thinking", Json::Bool(thinking));
            }
            kwargs.insert("reasoning_effort", effort.clone());
        }
        if let Some(documents) = &request.documents {
            kwargs.insert("documents", documents.clone());
        }
        for (k, v) in &kwargs.0 {
            if matches!(v, Json::Null) || v.as_str() == Some("auto") {
                continue;
            }
            if k == "messages" {
                return Err(ChatTemplateError::Request(
                    "chat_template_kwargs may not set messages".into(),
                ));
            }
            if NOT_TEMPLATE_VARIABLES.contains(&k.as_str()) {
                continue;
            }
            vars.push((k.clone(), v.to_value()));
        }
        let documents = vars
            .iter()
            .position(|(k, _)| k == "documents")
            .map(|i| vars.remove(i).1)
            .unwrap_or(Value::from(()));
        vars.retain(|(k, _)| k != "add_generation_prompt");
        vars.push((
            "messages".into(),
            Value::from(messages.iter().map(Obj::to_value).collect::<Vec<_>>()),
        ));
        vars.push(("tools".into(), tools));
        vars.push(("documents".into(), documents));
        vars.push((
            "add_generation_prompt".into(),
            Value::from(request.add_generation_prompt),
        ));
        let ctx = python::dict(vars);
        let limit = render_output_limit(request.body_bytes);
        let mut out = LimitedOutput {
            text: String::new(),
            limit,
        };
        python::with_output_limit(limit, || {
            template.render_captured_to(ctx, &mut out).map(drop)
        })
        .map_err(|e| ChatTemplateError::Render(render_error_text(&e)))?;
        let mut text = out.text;
        if request.continue_final_message {
            text = cut_at_final_message(text)?;
        }
        Ok(RenderedChat {
            text,
            add_special_tokens: request.add_special_tokens,
        })
    }
}

/// The message of a template error: `raise_exception`'s own text, else minijinja's.
fn render_error_text(e: &minijinja::Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => format!("{e:#}"),
    }
}

/// transformers' `continue_final_message`: the marker appended to the last message's content
/// (or its last text part).
fn mark_final_message(messages: &mut [Obj], template: &str) -> Result<(), ChatTemplateError> {
    let bad = |m: &str| ChatTemplateError::Request(m.to_string());
    if !template.contains("content") {
        return Err(bad(
            "continue_final_message needs a template that uses the message content",
        ));
    }
    let last = messages.last_mut().ok_or_else(|| bad("no messages"))?;
    let Some(content) = last.get_mut("content") else {
        return Err(bad("the final message has no content to continue"));
    };
    match content {
        Json::Str(s) => s.push_str(CONTINUE_FINAL_MESSAGE_TAG),
        Json::Array(parts) => {
            let text = parts.iter_mut().rev().find_map(|p| match p {
                Json::Object(o) => o.get_mut("text"),
                _ => None,
            });
            match text {
                Some(Json::Str(s)) => s.push_str(CONTINUE_FINAL_MESSAGE_TAG),
                _ => return Err(bad("no text to continue in the final message")),
            }
        }
        _ => return Err(bad("the final message has no content to continue")),
    }
    Ok(())
}

/// The rendering up to the marker (and without the whitespace before it, when the template
/// trimmed what followed it).
fn cut_at_final_message(text: String) -> Result<String, ChatTemplateError> {
    let tag = CONTINUE_FINAL_MESSAGE_TAG.trim();
    let Some(at) = text.rfind(tag) else {
        return Err(ChatTemplateError::Render(
            "continue_final_message: the final message does not appear in the rendering".into(),
        ));
    };
    if text[at..].starts_with(CONTINUE_FINAL_MESSAGE_TAG) {
        Ok(text[..at].to_string())
    } else {
        Ok(text[..at].trim_end().to_string())
    }
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// `json.dumps` with those arguments, positional or by name (`sort_keys` by name only:
/// minijinja passes at most five arguments).
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, minijinja::Error> {
    let pick = |positional: Option<Value>, name: &str| -> Result<Option<Value>, minijinja::Error> {
        match positional {
            Some(v) => Ok(Some(v)),
            None => kwargs.get::<Option<Value>>(name),
        }
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.as_str().is_some() => v.as_str().map(str::to_string),
        Some(v) => {
            let n = i64::try_from(v.clone()).map_err(|_| {
                minijinja::Error::new(ErrorKind::InvalidOperation, "indent must be an int or str")
            })?;
            // Python accepts any width; more than 16 spaces per level only multiplies output.
            Some(" ".repeat(n.clamp(0, MAX_TOJSON_INDENT) as usize))
        }
    };
    let separators = match pick(separators, "separators")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => Some((a.to_string(), b.to_string())),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "separators must be a pair of strings",
                    ));
                }
            }
        }
    };
    let sort_keys = pick(None, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = python::JsonStyle::new(ensure_ascii, indent, separators, sort_keys);
    Ok(Value::from_safe_string(python::json_dumps(value, &style)?))
}

/// vLLM's content-format detection (`_detect_content_format`), approximated on the text: a
/// `{% for … in X.content %}`, `X['content']`, `X["content"]` or `… in content` loop means
/// "openai".
fn detect_content_format(template: &str) -> ContentFormat {
    let mut rest = template;
    while let Some(start) = rest.find("{%") {
        let tag = &rest[start + 2..];
        let end = tag.find("%}").unwrap_or(tag.len());
        let body = tag[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        rest = &tag[end..];
        let Some(after_for) = body.strip_prefix("for") else {
            continue;
        };
        if !after_for.starts_with(char::is_whitespace) {
            continue;
        }
        let Some((_, iter)) = after_for.split_once(" in ") else {
            continue;
        };
        let iter = iter.trim_start();
        let ident_end = iter
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(iter.len());
        let (ident, tail) = iter.split_at(ident_end);
        let ends_word = |s: &str| !s.starts_with(|c: char| c.is_alphanumeric() || c == '_');
        let content_access = tail.strip_prefix(".content").is_some_and(ends_word)
            || tail.starts_with("['content']")
            || tail.starts_with("[\"content\"]");
        if (ident == "content" && ends_word(tail)) || (!ident.is_empty() && content_access) {
            return ContentFormat::OpenAi;
        }
    }
    ContentFormat::String
}

#[cfg(test)]
mod tests;
