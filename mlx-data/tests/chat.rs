//! Chat templates rendered by mlx-data against transformers' renderings
//! (fixtures written by `fixtures/chat_templates/make_fixtures.py`): the
//! strings, the assistant turns' byte ranges, and the token ids with the
//! assistant mask of GPT-2's tokenizer.

use mlx_data::{ChatTemplate, TextTokenizer};
use serde_json::Value;
use std::path::Path;

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat_templates")
        .join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn template(f: &Value) -> ChatTemplate {
    ChatTemplate {
        source: f["template"].as_str().unwrap().into(),
        bos_token: f["bos_token"].as_str().unwrap().into(),
        eos_token: f["eos_token"].as_str().unwrap().into(),
        origin: "fixture".into(),
    }
}

fn check(name: &str) {
    let f = fixture(name);
    let r = template(&f).renderer().unwrap();
    let tok = TextTokenizer::gpt2().unwrap();
    for case in f["cases"].as_array().unwrap() {
        let what = format!("{name}/{}", case["name"]);
        let messages = case["messages"].as_array().unwrap();
        assert_eq!(
            r.render(messages, false).unwrap(),
            case["rendered"].as_str().unwrap(),
            "{what}"
        );
        assert_eq!(
            r.render(messages, true).unwrap(),
            case["rendered_generation_prompt"].as_str().unwrap(),
            "{what}"
        );
        let (full, spans) = r.assistant_spans(messages).unwrap();
        assert_eq!(full, case["rendered"].as_str().unwrap(), "{what}");
        let expected: Vec<std::ops::Range<usize>> = case["assistant_byte_spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[0].as_u64().unwrap() as usize..s[1].as_u64().unwrap() as usize)
            .collect();
        assert_eq!(spans, expected, "{what}");
        let (ids, mask) = tok.encode_spans(&full, &spans).unwrap();
        let ids_py: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let mask_py: Vec<u8> = serde_json::from_value(case["assistant_mask"].clone()).unwrap();
        assert_eq!(ids, ids_py, "{what}");
        assert_eq!(mask, mask_py, "{what}");
    }
}

#[test]
fn llama3_template_renders_as_transformers() {
    check("llama3");
}

#[test]
fn chatml_template_renders_as_transformers() {
    check("chatml");
}

#[test]
fn templates_come_from_tokenizer_config_or_chat_template_jinja() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tokenizer_config.json");
    assert_eq!(ChatTemplate::from_model_dir(dir.path()).unwrap(), None);
    std::fs::write(
        &cfg,
        r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content | upper }}{{ eos_token }}"}]}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
    assert_eq!(
        t.renderer().unwrap().render(&msgs, false).unwrap(),
        "<s>HI</s>"
    );
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages[0].content.strip('h') }}!",
    )
    .unwrap();
    let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.renderer().unwrap().render(&msgs, false).unwrap(), "i!");
    let e = ChatTemplate {
        source: "{{ raise_exception('no system role') }}".into(),
        ..t
    }
    .renderer()
    .unwrap()
    .render(&msgs, false)
    .unwrap_err()
    .to_string();
    assert!(e.contains("no system role"), "{e}");
}
