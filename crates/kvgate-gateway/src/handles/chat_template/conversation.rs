//! What vLLM 0.32 makes of a chat request before its template sees it: the `messages` turned into
//! the "conversation" (`vllm/renderers/chat_utils.py`: `_parse_chat_message_content`,
//! `_postprocess_messages`), the `tools` as `ChatCompletionToolsParam.model_dump()` gives them,
//! and the developer-role fallback (`vllm/renderers/hf.py`: `_convert_developer_to_system`,
//! `_consolidate_system_messages`). Key order matters (a template's `tojson` prints it), so the
//! request is read into [`Json`], which keeps the body's order as Python's `json` does.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value whose objects keep their keys in the body's order (a repeated key keeps its
/// first position and its last value, as a Python dict does).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    Str(String),
    Array(Vec<Json>),
    Object(Obj),
}

/// A JSON object in the body's key order. A hash map (O(1) per key; a scan per key made a body
/// of many keys quadratic) that, like a Python dict, keeps a repeated key's first place and its
/// last value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Obj(pub indexmap::IndexMap<String, Json>);

impl Obj {
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.0.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        self.0.get_mut(key)
    }

    /// Like Python's `d.get(key)`: absent and `null` are both `None`.
    pub fn get_some(&self, key: &str) -> Option<&Json> {
        self.get(key).filter(|v| !matches!(v, Json::Null))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn insert(&mut self, key: &str, value: Json) {
        match self.0.get_mut(key) {
            Some(v) => *v = value,
            None => {
                self.0.insert(key.to_string(), value);
            }
        }
    }

    pub fn remove(&mut self, key: &str) {
        self.0.shift_remove(key);
    }
}

impl Json {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Obj> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Python's truthiness of the value `json.loads` would give.
    fn is_truthy(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(b) => *b,
            Json::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
            Json::Str(s) => !s.is_empty(),
            Json::Array(a) => !a.is_empty(),
            Json::Object(o) => !o.0.is_empty(),
        }
    }

    /// As a template value: numbers stay ints or floats as Python's `json` reads them.
    pub fn to_value(&self) -> minijinja::Value {
        use minijinja::Value;
        match self {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::from(i)
                } else if let Some(u) = n.as_u64() {
                    Value::from(u)
                } else {
                    Value::from(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Json::Str(s) => Value::from(s.as_str()),
            Json::Array(a) => Value::from(a.iter().map(Json::to_value).collect::<Vec<_>>()),
            Json::Object(o) => o.to_value(),
        }
    }
}

impl Obj {
    pub fn to_value(&self) -> minijinja::Value {
        super::python::dict(self.0.iter().map(|(k, v)| (k.as_str(), v.to_value())))
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
        Ok(Json::Number(i.into()))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
        Ok(Json::Number(u.into()))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Json, E> {
        Ok(serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::Str(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = Obj::default();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            out.insert(&k, v);
        }
        Ok(Json::Object(out))
    }
}

/// How message content reaches the template (vLLM's `--chat-template-content-format`, detected
/// from the template by default): `String` joins the text parts with `\n`; `OpenAi` keeps a list
/// of `{"type": "text", "text": …}` parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    String,
    OpenAi,
}

/// Content-part types vLLM reads as text (`TEXT_PART_TYPES`), and the field holding the text.
fn text_part_field(part_type: &str) -> Option<&'static str> {
    match part_type {
        "text" | "input_text" | "output_text" => Some("text"),
        "refusal" => Some("refusal"),
        "thinking" => Some("thinking"),
        _ => None,
    }
}

/// Content-part types that carry media: vLLM loads them through its multimodal processor,
/// which kvgate does not have.
const MEDIA_PART_TYPES: [&str; 11] = [
    "input_image",
    "image_url",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "prompt_embeds",
    "image_pil",
    "audio_url",
    "input_audio",
    "video_url",
    "file",
];

/// The fields of vLLM's content-part types (`_KNOWN_CONTENT_PART_FIELDS`); any other field of a
/// text part is kept on it in the openai format.
const KNOWN_PART_FIELDS: [&str; 18] = [
    "audio_embeds",
    "audio_url",
    "closed",
    "data",
    "file",
    "image_embeds",
    "image_pil",
    "image_url",
    "input_audio",
    "name",
    "prompt_cache_breakpoint",
    "refusal",
    "text",
    "thinking",
    "type",
    "uuid",
    "video_embeds",
    "video_url",
];

const CLAUDE_CODE_BILLING_HEADER: &str = "x-anthropic-billing-header";

enum Part {
    Text {
        text: String,
        extra: Vec<(String, Json)>,
    },
    ToolReference(String),
}

/// One content part as `_parse_chat_message_content_part` reads it; `Ok(None)`: skipped (a
/// `text` or `refusal` part without its text).
fn parse_part(part: &Json) -> Result<Option<Part>, String> {
    let obj = match part {
        Json::Str(s) => {
            return Ok(Some(Part::Text {
                text: s.clone(),
                extra: Vec::new(),
            }));
        }
        Json::Object(o) => o,
        _ => return Err("a content part must be a string or an object".into()),
    };
    let extra = || {
        obj.0
            .iter()
            .filter(|(k, _)| !KNOWN_PART_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let has_uuid = obj.get_some("uuid").is_some();
    match obj.get_some("type") {
        Some(Json::Str(t)) if !has_uuid => {
            if let Some(field) = text_part_field(t) {
                return match obj.get_some(field) {
                    None if t == "text" || t == "refusal" => Ok(None),
                    Some(Json::Str(text)) => Ok(Some(Part::Text {
                        text: text.clone(),
                        extra: extra(),
                    })),
                    _ => Err(format!("content part {t:?} without a string {field:?}")),
                };
            }
            if t == "tool_reference" {
                return tool_reference(obj);
            }
            if MEDIA_PART_TYPES.contains(&t.as_str()) {
                return Err(format!(
                    "content part {t:?} is multimodal, which kvgate does not render"
                ));
            }
            Err(format!("unsupported chat content part type {t:?}"))
        }
        None => untyped_part(obj),
        Some(_) if has_uuid => untyped_part(obj),
        Some(_) => Err("invalid 'type' field in a content part".into()),
    }
}

/// A part without a type (or with a `uuid`): vLLM recognises it by its media or
/// `tool_reference` field.
fn untyped_part(obj: &Obj) -> Result<Option<Part>, String> {
    if MEDIA_PART_TYPES.iter().any(|k| obj.contains(k)) {
        return Err("a multimodal content part, which kvgate does not render".into());
    }
    if obj.contains("tool_reference") {
        return tool_reference(obj);
    }
    Err("missing 'type' field in a content part".into())
}

fn tool_reference(obj: &Obj) -> Result<Option<Part>, String> {
    match obj.get_some("name") {
        Some(Json::Str(name)) => Ok(Some(Part::ToolReference(name.clone()))),
        _ => Err("a tool_reference part without a string name".into()),
    }
}

/// Drops Claude Code's attribution line (`x-anthropic-billing-header…`) from system text parts,
/// as vLLM does (`_strip_claude_code_billing_header`).
fn strip_billing_header(parts: Vec<Json>) -> Vec<Json> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let text = match &part {
            Json::Str(s) => Some(s.as_str()),
            Json::Object(o) if o.get("type").and_then(Json::as_str) == Some("text") => {
                o.get("text").and_then(Json::as_str)
            }
            _ => None,
        };
        let Some(text) = text.filter(|t| t.starts_with(CLAUDE_CODE_BILLING_HEADER)) else {
            out.push(part);
            continue;
        };
        let rest = text
            .split_once('\n')
            .map_or("", |(_, rest)| rest)
            .to_string();
        if rest.is_empty() {
            continue;
        }
        out.push(match part {
            Json::Object(mut o) => {
                o.insert("text", Json::Str(rest));
                Json::Object(o)
            }
            _ => Json::Str(rest),
        });
    }
    out
}

/// The request's `messages` as the template sees them.
pub(crate) fn conversation(messages: &[Json], format: ContentFormat) -> Result<Vec<Obj>, String> {
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        out.push(parse_message(message, format)?);
    }
    for message in &mut out {
        postprocess_tool_calls(message)?;
    }
    Ok(out)
}

fn parse_message(message: &Json, format: ContentFormat) -> Result<Obj, String> {
    let message = message.as_object().ok_or("a message must be an object")?;
    let role = match message.get("role") {
        Some(Json::Str(r)) => r.as_str(),
        _ => return Err("a message needs a string role".into()),
    };
    let mut parts = match message.get_some("content") {
        None => Vec::new(),
        Some(Json::Str(s)) => vec![Json::Str(s.clone())],
        Some(Json::Array(a)) => a.clone(),
        Some(_) => return Err("message content must be a string or a list of parts".into()),
    };
    if role == "system" {
        parts = strip_billing_header(parts);
    }
    let mut parsed = Vec::new();
    for part in &parts {
        if let Some(p) = parse_part(part)? {
            parsed.push(p);
        }
    }
    let content = match format {
        ContentFormat::String => {
            let texts: Vec<&str> = parsed
                .iter()
                .map(|p| match p {
                    Part::Text { text, .. } => text.as_str(),
                    Part::ToolReference(name) => name.as_str(),
                })
                .collect();
            Json::Str(texts.join("\n"))
        }
        ContentFormat::OpenAi => Json::Array(
            parsed
                .into_iter()
                .map(|p| {
                    let mut o = Obj::default();
                    match p {
                        Part::Text { text, extra } => {
                            o.insert("type", Json::Str("text".into()));
                            o.insert("text", Json::Str(text));
                            for (k, v) in extra {
                                o.insert(&k, v);
                            }
                        }
                        Part::ToolReference(name) => {
                            o.insert("type", Json::Str("tool_reference".into()));
                            o.insert("name", Json::Str(name));
                        }
                    }
                    Json::Object(o)
                })
                .collect(),
        ),
    };
    let mut out = Obj::default();
    out.insert("role", Json::Str(role.to_string()));
    out.insert("content", content);
    match role {
        "assistant" => {
            if let Some(calls) = message.get_some("tool_calls") {
                out.insert("tool_calls", validated_tool_calls(calls)?);
            }
            if let Some(reasoning) = message.get_some("reasoning") {
                out.insert("reasoning", reasoning.clone());
                out.insert("reasoning_content", reasoning.clone());
            }
        }
        "tool" => {
            if let Some(id) = message.get("tool_call_id") {
                out.insert("tool_call_id", id.clone());
            }
            // Tool results sent as text parts become one string (most templates take only
            // strings there); a list with any other part stays a list.
            if let Some(Json::Array(items)) = out.get("content") {
                let texts: Option<Vec<&str>> = items
                    .iter()
                    .map(|i| {
                        let o = i.as_object()?;
                        (o.get("type").and_then(Json::as_str) == Some("text"))
                            .then(|| o.get("text").and_then(Json::as_str).unwrap_or(""))
                    })
                    .collect();
                if let Some(texts) = texts {
                    let joined = texts.join("\n");
                    out.insert("content", Json::Str(joined));
                }
            }
        }
        _ => {}
    }
    if let Some(Json::Str(name)) = message.get("name") {
        out.insert("name", Json::Str(name.clone()));
    }
    if let Some(Json::Str(task)) = message.get("task") {
        out.insert("task", Json::Str(task.clone()));
    }
    if role == "developer" {
        out.insert("tools", message.get("tools").cloned().unwrap_or(Json::Null));
    }
    Ok(out)
}

/// Assistant `tool_calls` as the request schema (`ChatCompletionMessageToolCallParam`) leaves
/// them: `{id, function: {arguments, name}, type}` in that order, other fields dropped.
fn validated_tool_calls(calls: &Json) -> Result<Json, String> {
    let Json::Array(calls) = calls else {
        return Err("tool_calls must be a list".into());
    };
    let mut out = Vec::with_capacity(calls.len());
    for call in calls {
        let call = call.as_object().ok_or("a tool call must be an object")?;
        let function = call
            .get("function")
            .and_then(Json::as_object)
            .ok_or("a tool call needs a function object")?;
        let field = |o: &Obj, k: &str| match o.get(k) {
            Some(Json::Str(s)) => Ok(Json::Str(s.clone())),
            _ => Err(format!("a tool call needs a string {k:?}")),
        };
        if call.get("type").and_then(Json::as_str) != Some("function") {
            return Err(
                "chat completions only support assistant tool_calls of type 'function'".into(),
            );
        }
        let mut f = Obj::default();
        // A dict is taken as it is (transformers' form); vLLM's schema wants a JSON string.
        let arguments = match function.get("arguments") {
            Some(a @ Json::Object(_)) => a.clone(),
            _ => field(function, "arguments")?,
        };
        f.insert("arguments", arguments);
        f.insert("name", field(function, "name")?);
        let mut c = Obj::default();
        c.insert("id", field(call, "id")?);
        c.insert("function", Json::Object(f));
        c.insert("type", Json::Str("function".into()));
        out.push(Json::Object(c));
    }
    Ok(Json::Array(out))
}

/// `_postprocess_messages`: an empty `tool_calls` is dropped; each call's `arguments` becomes a
/// dict (a JSON string is parsed; empty, invalid or non-object arguments become `{}`).
fn postprocess_tool_calls(message: &mut Obj) -> Result<(), String> {
    if message.get("role").and_then(Json::as_str) != Some("assistant") {
        return Ok(());
    }
    let Some(Json::Array(calls)) = message.get_mut("tool_calls") else {
        return Ok(());
    };
    if calls.is_empty() {
        message.remove("tool_calls");
        return Ok(());
    }
    for call in calls.iter_mut() {
        let Json::Object(call) = call else { continue };
        let Some(Json::Object(function)) = call.get_mut("function") else {
            continue;
        };
        let arguments = match function.get("arguments") {
            Some(a) if a.is_truthy() => match a {
                Json::Object(_) => a.clone(),
                Json::Str(s) => match serde_json::from_str::<Json>(s) {
                    Ok(parsed @ Json::Object(_)) => parsed,
                    _ => Json::Object(Obj::default()),
                },
                _ => Json::Object(Obj::default()),
            },
            _ => Json::Object(Obj::default()),
        };
        function.insert("arguments", arguments);
    }
    Ok(())
}

/// The request's `tools` as `ChatCompletionToolsParam.model_dump()` gives them:
/// `{"type": "function", "function": {"name", "description", "parameters"[, "strict"]
/// [, "defer_loading"]}[, "defer_loading"]}`, `description` and `parameters` `None` when absent,
/// other fields dropped.
pub(crate) fn tools(tools: &[Json]) -> Result<Vec<Obj>, String> {
    let mut out = Vec::with_capacity(tools.len());
    for tool in tools {
        let tool = tool.as_object().ok_or("a tool must be an object")?;
        match tool.get_some("type") {
            None => {}
            Some(Json::Str(t)) if t == "function" => {}
            Some(_) => return Err("a tool's type must be \"function\"".into()),
        }
        let function = tool
            .get("function")
            .and_then(Json::as_object)
            .ok_or("a tool needs a function object")?;
        let name = match function.get("name") {
            Some(Json::Str(n)) => n.clone(),
            _ => return Err("a tool function needs a string name".into()),
        };
        let description = match function.get_some("description") {
            None => Json::Null,
            Some(d @ Json::Str(_)) => d.clone(),
            Some(_) => return Err("a tool's description must be a string".into()),
        };
        let parameters = match function.get_some("parameters") {
            None => Json::Null,
            Some(p @ Json::Object(_)) => p.clone(),
            Some(_) => return Err("a tool's parameters must be an object".into()),
        };
        let top_defer = tool.get_some("defer_loading").cloned();
        let mut f = Obj::default();
        f.insert("name", Json::Str(name));
        f.insert("description", description);
        f.insert("parameters", parameters);
        if let Some(strict) = function.get_some("strict") {
            f.insert("strict", strict.clone());
        }
        if let Some(defer) = function
            .get_some("defer_loading")
            .cloned()
            .or(top_defer.clone())
        {
            f.insert("defer_loading", defer);
        }
        let mut t = Obj::default();
        t.insert("type", Json::Str("function".into()));
        t.insert("function", Json::Object(f));
        if let Some(defer) = top_defer {
            t.insert("defer_loading", defer);
        }
        out.push(t);
    }
    Ok(out)
}

/// For a template that never names the `developer` role: developer messages become system
/// messages (without their `tools`), and all system messages are merged into one at the start
/// (contents joined by a blank line) when there is more than one or one not first.
pub(crate) fn developer_to_system(conversation: Vec<Obj>) -> Vec<Obj> {
    let conversation: Vec<Obj> = conversation
        .into_iter()
        .map(|mut m| {
            if m.get("role").and_then(Json::as_str) == Some("developer") {
                m.insert("role", Json::Str("system".into()));
                m.remove("tools");
            }
            m
        })
        .collect();
    let mut system_contents = Vec::new();
    let mut others = Vec::new();
    let mut consolidate = false;
    for (i, m) in conversation.iter().enumerate() {
        if m.get("role").and_then(Json::as_str) != Some("system") {
            others.push(m.clone());
            continue;
        }
        if i > 0 || !system_contents.is_empty() {
            consolidate = true;
        }
        let content = match m.get("content") {
            Some(Json::Array(parts)) => parts
                .iter()
                .filter_map(|p| match p {
                    Json::Str(s) => Some(s.as_str()),
                    Json::Object(o) => o.get("text").and_then(Json::as_str),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Some(Json::Str(s)) => s.clone(),
            _ => String::new(),
        };
        if !content.is_empty() {
            system_contents.push(content);
        }
    }
    if !consolidate {
        return conversation;
    }
    let mut merged = Obj::default();
    merged.insert("role", Json::Str("system".into()));
    merged.insert("content", Json::Str(system_contents.join("\n\n")));
    std::iter::once(merged).chain(others).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Json {
        serde_json::from_str(s).unwrap()
    }

    fn messages(s: &str) -> Vec<Json> {
        match json(s) {
            Json::Array(a) => a,
            _ => panic!("not an array"),
        }
    }

    fn dump(conv: &[Obj]) -> String {
        let v = minijinja::Value::from(conv.iter().map(Obj::to_value).collect::<Vec<_>>());
        let style = super::super::python::JsonStyle::new(false, None, None, false);
        super::super::python::json_dumps(&v, &style).unwrap()
    }

    // The expected strings below are what vLLM 0.32 printed for `{{ messages|tojson }}` on the
    // same requests (POST /tokenize with a request chat template, then /detokenize).

    #[test]
    fn parts_join_with_newlines_in_string_format_and_stay_parts_in_openai_format() {
        let m = messages(
            r#"[{"role":"system","content":"plain"},
                {"role":"user","content":[{"type":"text","text":"a","zz":3},"bare",
                  {"type":"input_text","text":"it"},{"type":"refusal","refusal":"no"},
                  {"type":"text","text":null},{"type":"thinking","thinking":"th"}]},
                {"role":"assistant","content":null},
                {"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"}]}]"#,
        );
        assert_eq!(
            dump(&conversation(&m, ContentFormat::String).unwrap()),
            r#"[{"role": "system", "content": "plain"}, {"role": "user", "content": "a\nbare\nit\nno\nth"}, {"role": "assistant", "content": ""}, {"role": "tool", "content": "r1\nr2", "tool_call_id": "c1"}]"#
        );
        assert_eq!(
            dump(&conversation(&m, ContentFormat::OpenAi).unwrap()),
            r#"[{"role": "system", "content": [{"type": "text", "text": "plain"}]}, {"role": "user", "content": [{"type": "text", "text": "a", "zz": 3}, {"type": "text", "text": "bare"}, {"type": "text", "text": "it"}, {"type": "text", "text": "no"}, {"type": "text", "text": "th"}]}, {"role": "assistant", "content": []}, {"role": "tool", "content": "r1\nr2", "tool_call_id": "c1"}]"#
        );
    }

    #[test]
    fn tool_calls_are_reordered_and_their_arguments_parsed() {
        let m = messages(
            r#"[{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: abc\nSys"}]},
                {"role":"user","name":"bob","content":"hi"},
                {"role":"assistant","content":null,"reasoning":"hmm","tool_calls":[
                  {"type":"function","function":{"name":"f","arguments":"{\"z\": 1, \"a\": [1.0, 2]}"},"id":"c1"},
                  {"id":"c2","type":"function","function":{"name":"g","arguments":"not json"}},
                  {"id":"c3","type":"function","function":{"name":"h","arguments":"[1]"}}]},
                {"role":"assistant","content":"b","tool_calls":[]}]"#,
        );
        assert_eq!(
            dump(&conversation(&m, ContentFormat::String).unwrap()),
            r#"[{"role": "system", "content": "Sys"}, {"role": "user", "content": "hi", "name": "bob"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"arguments": {"z": 1, "a": [1.0, 2]}, "name": "f"}, "type": "function"}, {"id": "c2", "function": {"arguments": {}, "name": "g"}, "type": "function"}, {"id": "c3", "function": {"arguments": {}, "name": "h"}, "type": "function"}], "reasoning": "hmm", "reasoning_content": "hmm"}, {"role": "assistant", "content": "b"}]"#
        );
    }

    #[test]
    fn tools_are_dumped_as_vllms_schema_with_none_defaults() {
        let t = messages(
            r#"[{"function":{"parameters":{"type":"object","properties":{"z":{"type":"string"}}},"name":"f","extra":5},"type":"function"}]"#,
        );
        assert_eq!(
            dump(&tools(&t).unwrap()),
            r#"[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object", "properties": {"z": {"type": "string"}}}}}]"#
        );
        assert!(tools(&messages(r#"[{"type":"custom","function":{"name":"f"}}]"#)).is_err());
    }

    #[test]
    fn developer_messages_merge_into_the_system_message_when_the_template_lacks_them() {
        let m = messages(
            r#"[{"role":"system","content":"plain"},{"role":"user","content":"u"},
                {"role":"developer","content":"dev","tools":[]}]"#,
        );
        let conv = developer_to_system(conversation(&m, ContentFormat::String).unwrap());
        assert_eq!(
            dump(&conv),
            r#"[{"role": "system", "content": "plain\n\ndev"}, {"role": "user", "content": "u"}]"#
        );
    }

    #[test]
    fn multimodal_and_unknown_parts_are_errors_not_guesses() {
        for part in [
            r#"{"type":"image_url","image_url":{"url":"http://x"}}"#,
            r#"{"image_url":"http://x"}"#,
            r#"{"type":"weird"}"#,
            r#"{"text":"no type"}"#,
            r#"{"type":"input_text"}"#,
            "17",
        ] {
            let m = messages(&format!(r#"[{{"role":"user","content":[{part}]}}]"#));
            assert!(conversation(&m, ContentFormat::String).is_err(), "{part}");
        }
        assert!(conversation(&messages(r#"[{"content":"x"}]"#), ContentFormat::String).is_err());
    }

    #[test]
    fn repeated_keys_keep_their_first_place_and_last_value_as_python_does() {
        let Json::Object(o) = json(r#"{"b":1,"a":2,"b":3}"#) else {
            panic!()
        };
        assert_eq!(
            o.0.into_iter().collect::<Vec<_>>(),
            vec![
                ("b".to_string(), Json::Number(3.into())),
                ("a".to_string(), Json::Number(2.into()))
            ]
        );
    }
}
