use super::*;

/// A fresh directory under the system temp dir with `files` (name, contents) and an empty
/// `tokenizer.json` path in it (only its folder is read here).
fn model_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-chat-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir.join("tokenizer.json")
}

fn request(body: &str) -> ChatRequest {
    ChatRequest::from_body(body.as_bytes()).unwrap()
}

fn one(source: &str) -> ChatTemplate {
    ChatTemplate::from_sources(
        vec![("default".into(), source.into())],
        vec![
            ("bos_token".into(), "<s>".into()),
            ("eos_token".into(), "</s>".into()),
        ],
    )
    .unwrap()
}

fn render(t: &ChatTemplate, body: &str) -> Result<String, ChatTemplateError> {
    t.render(&request(body)).map(|r| r.text)
}

const SIMPLE: &str = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

#[test]
fn chat_template_jinja_wins_over_the_config_key_and_tokens_may_be_objects() {
    let path = model_dir(
        "jinja",
        &[
            ("chat_template.jinja", SIMPLE),
            (
                "tokenizer_config.json",
                r#"{"chat_template": "from config", "bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>"}"#,
            ),
        ],
    );
    let t = ChatTemplate::load(&path, None).unwrap().unwrap();
    assert!(t.source().ends_with("chat_template.jinja"));
    assert_eq!(
        render(&t, r#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap(),
        "<B><|user|>hi<E>\n<|assistant|>"
    );
}

#[test]
fn the_config_key_may_be_a_string_or_named_templates_and_tools_pick_tool_use() {
    let path = model_dir(
        "string",
        &[(
            "tokenizer_config.json",
            r#"{"chat_template": "S{{ messages[0].content }}"}"#,
        )],
    );
    let t = ChatTemplate::load(&path, None).unwrap().unwrap();
    assert_eq!(
        render(&t, r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap(),
        "Sx"
    );

    let path = model_dir(
        "named",
        &[(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T{{ tools[0].function.name }}"}]}"#,
        )],
    );
    let t = ChatTemplate::load(&path, None).unwrap().unwrap();
    assert_eq!(
        render(&t, r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap(),
        "D"
    );
    assert_eq!(
        render(
            &t,
            r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#
        )
        .unwrap(),
        "Tf"
    );
}

#[test]
fn an_override_file_replaces_the_models_template() {
    let path = model_dir(
        "override",
        &[("chat_template.jinja", "model"), ("mine.jinja", "mine")],
    );
    let mine = path.with_file_name("mine.jinja");
    let t = ChatTemplate::load(&path, Some(&mine)).unwrap().unwrap();
    assert_eq!(
        render(&t, r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap(),
        "mine"
    );
}

#[test]
fn no_template_is_none_and_broken_ones_are_load_errors() {
    let path = model_dir(
        "none",
        &[("tokenizer_config.json", r#"{"bos_token": "<s>"}"#)],
    );
    assert!(ChatTemplate::load(&path, None).unwrap().is_none());
    let path = model_dir("nothing", &[]);
    assert!(ChatTemplate::load(&path, None).unwrap().is_none());

    let path = model_dir(
        "syntax",
        &[("chat_template.jinja", "{% for m in messages %}")],
    );
    assert!(matches!(
        ChatTemplate::load(&path, None),
        Err(ChatTemplateError::Load { .. })
    ));
    let path = model_dir(
        "nodefault",
        &[(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "x", "template": "X"}]}"#,
        )],
    );
    assert!(matches!(
        ChatTemplate::load(&path, None),
        Err(ChatTemplateError::Load { .. })
    ));
    let path = model_dir("badjson", &[("tokenizer_config.json", "{not json")]);
    assert!(ChatTemplate::load(&path, None).is_err());
    let missing = path.with_file_name("no-such.jinja");
    assert!(ChatTemplate::load(&path, Some(&missing)).is_err());
}

#[test]
fn add_generation_prompt_defaults_to_true_and_can_be_turned_off() {
    let t = one(SIMPLE);
    let body = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(
        render(&t, body).unwrap(),
        "<s><|user|>hi</s>\n<|assistant|>"
    );
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}"#;
    assert_eq!(render(&t, body).unwrap(), "<s><|user|>hi</s>\n");
}

#[test]
fn raise_exception_and_template_errors_are_render_errors() {
    let t = one(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
    );
    assert_eq!(
        render(&t, r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap(),
        "ok"
    );
    match render(&t, r#"{"messages":[{"role":"bot","content":"x"}]}"#) {
        Err(ChatTemplateError::Render(m)) => assert_eq!(m, "first must be user"),
        other => panic!("{other:?}"),
    }
    let t = one("{{ no_such_function() }}");
    assert!(matches!(
        render(&t, r#"{"messages":[{"role":"user","content":"x"}]}"#),
        Err(ChatTemplateError::Render(_))
    ));
}

#[test]
fn tools_reach_the_template_and_tojson_prints_as_json_dumps() {
    let t = one(
        "{{ tools|tojson }}|{{ tools[0].function.parameters|tojson(indent=2) }}|{{ messages[0].content|tojson }}",
    );
    let body = r#"{"messages":[{"role":"user","content":"<a> & 'é'"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":[true,null]}}}]}"#;
    assert_eq!(
        render(&t, body).unwrap(),
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": null, \"parameters\": {\"z\": 1, \"a\": [true, null]}}}]|{\n  \"z\": 1,\n  \"a\": [\n    true,\n    null\n  ]\n}|\"<a> & 'é'\""
    );
    let no_tools = one("{{ tools }}");
    assert_eq!(
        render(&no_tools, r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap(),
        "None"
    );
}

#[test]
fn python_string_methods_and_reprs_work_as_in_jinja2() {
    let t = one(
        "{{ messages[0].content.strip() }}|{{ messages[0].content.startswith('  a') }}|{% for k, v in messages[0].items() %}{{ k }}={{ v|length }};{% endfor %}|{{ [1.5, 'x', none] }}",
    );
    assert_eq!(
        render(&t, r#"{"messages":[{"role":"user","content":"  ab  "}]}"#).unwrap(),
        "ab|True|role=4;content=6;|[1.5, 'x', None]"
    );
}

#[test]
fn kwargs_reasoning_effort_and_documents_become_variables() {
    let t = one(
        "{{ foo }}|{{ enable_thinking }}|{{ reasoning_effort }}|{{ documents }}|{{ baz is defined }}|{{ add_generation_prompt }}",
    );
    let body = r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"none",
        "chat_template_kwargs":{"foo":"bar","baz":null,"add_generation_prompt":false}}"#;
    assert_eq!(render(&t, body).unwrap(), "bar|False|none|None|False|True");
    let body = r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high",
        "chat_template_kwargs":{"enable_thinking":false}}"#;
    assert_eq!(render(&t, body).unwrap(), "|False|high|None|False|True");
}

#[test]
fn content_format_follows_the_templates_loops() {
    assert_eq!(
        detect_content_format(
            "{% for m in messages %}{% for c in m['content'] %}{% endfor %}{% endfor %}"
        ),
        ContentFormat::OpenAi
    );
    assert_eq!(
        detect_content_format("{%- for part in message.content | selectattr('type') -%}"),
        ContentFormat::OpenAi
    );
    assert_eq!(
        detect_content_format("{% for x in content %}"),
        ContentFormat::OpenAi
    );
    assert_eq!(detect_content_format(SIMPLE), ContentFormat::String);
    assert_eq!(
        detect_content_format("{% for x in contents %}{% for y in m.content_x %}"),
        ContentFormat::String
    );

    let parts = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
    assert_eq!(
        render(&one("{{ messages[0].content }}"), parts).unwrap(),
        "a\nb"
    );
    let looping = one(
        "{% for m in messages %}{% for c in m.content %}[{{ c.text }}]{% endfor %}{% endfor %}",
    );
    assert_eq!(render(&looping, parts).unwrap(), "[a][b]");
}

#[test]
fn continue_final_message_cuts_after_the_last_message() {
    let t =
        one("{% for m in messages %}<{{ m.role }}>{{ m['content'] }}</{{ m.role }}>{% endfor %}");
    let body = r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"Sure, "}],
        "continue_final_message":true,"add_generation_prompt":false}"#;
    assert_eq!(render(&t, body).unwrap(), "<user>q</user><assistant>Sure, ");
    let both = r#"{"messages":[{"role":"user","content":"q"}],"continue_final_message":true}"#;
    assert!(ChatRequest::from_body(both.as_bytes()).is_err());
}

#[test]
fn requests_that_cannot_be_rendered_are_request_errors() {
    for body in [
        "not json",
        r#"{"messages":"x"}"#,
        r#"{"messages":[]}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"chat_template":"{{ 1 }}"}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"yes"}"#,
    ] {
        let result = ChatRequest::from_body(body.as_bytes()).and_then(|r| one(SIMPLE).render(&r));
        assert!(
            matches!(result, Err(ChatTemplateError::Request(_))),
            "{body}: {result:?}"
        );
    }
}

#[test]
fn add_special_tokens_defaults_to_false_for_chat() {
    let t = one(SIMPLE);
    let r = t
        .render(&request(r#"{"messages":[{"role":"user","content":"x"}]}"#))
        .unwrap();
    assert!(!r.add_special_tokens);
    let r = t
        .render(&request(
            r#"{"messages":[{"role":"user","content":"x"}],"add_special_tokens":true}"#,
        ))
        .unwrap();
    assert!(r.add_special_tokens);
}

#[test]
fn a_body_of_many_keys_renders_in_linear_time() {
    // 200,000 keys in an object nobody reads: a scan per key (the old object) took minutes.
    let mut metadata = String::from("{");
    for i in 0..200_000 {
        if i > 0 {
            metadata.push(',');
        }
        metadata.push_str(&format!("\"k{i}\":{i}"));
    }
    metadata.push('}');
    let plain = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let heavy =
        format!(r#"{{"metadata":{metadata},"messages":[{{"role":"user","content":"hi"}}]}}"#);
    let t = one(SIMPLE);
    let start = std::time::Instant::now();
    assert_eq!(render(&t, &heavy).unwrap(), render(&t, plain).unwrap());
    // A guard against the quadratic case only (debug build, shared machine).
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_render_that_would_blow_up_its_output_is_refused() {
    // A deep tools schema printed with a wide indent: ~100× the body without the budget.
    let t =
        one("{{ tools | tojson(indent=1000) }}{% for m in messages %}{{ m.content }}{% endfor %}");
    let mut deep = String::from("{\"a\":1}");
    for _ in 0..100 {
        deep = format!("{{\"x\":[{deep},{deep}]}}");
        if deep.len() > 200_000 {
            break;
        }
    }
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{deep}}}}}]}}"#
    );
    let e = render(&t, &body).unwrap_err().to_string();
    assert!(e.contains("budget"), "{e}");
    // The same template on a small schema renders (indent clamped to 16).
    let small = r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"x":[1]}}}]}"#;
    let text = render(&t, small).unwrap();
    // The list's item one level in: 16 spaces, not 1,000.
    assert_eq!(text.lines().nth(1), Some("                {"), "{text}");
}

#[test]
fn a_template_that_loops_forever_runs_out_of_fuel() {
    let t = one(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}",
    );
    let e = render(&t, r#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("fuel"), "{e}");
}
