//! Every parser of bytes a run folder holds survives garbage: checkpoint
//! manifests, the `latest` pointer and `--config` TOML files, over
//! arbitrary bytes and structured mutations of valid input, return an
//! error, never panic, and never read outside the checkpoint folder or
//! past a file's recorded size.

use std::path::Path;

use mlx_llama::checkpoint::{self, Manifest};
use proptest::prelude::*;

/// A valid manifest of a checkpoint folder holding `model.safetensors`
/// with `bytes` (a few of them).
fn valid(dir: &Path, bytes: &[u8]) -> serde_json::Value {
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    std::fs::write(dir.join("optimizer.safetensors"), b"state").unwrap();
    let files = checkpoint::file_entries(dir).unwrap();
    serde_json::json!({
        "format": checkpoint::FORMAT,
        "step": 4,
        "world": 1,
        "resume_key": {},
        "config": {},
        "vocab_size": 8,
        "files": files,
        "layout": {
            "optimizer_files": ["optimizer.safetensors"],
            "data": mlx_data::LoaderState {
                epoch: 0,
                batch_in_epoch: 2,
                seed: 42,
                rank: 0,
                world: 1,
                n_samples: 100,
                per_rank_batch: 2,
                block_size: 32,
                mode: mlx_data::BatchMode::Pack,
            },
        },
    })
}

/// The folder's manifest as JSON (written with `value`), verified.
fn verify_with(dir: &Path, value: &serde_json::Value) -> anyhow::Result<Manifest> {
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(value).unwrap(),
    )
    .unwrap();
    checkpoint::verify(dir)
}

#[test]
fn names_outside_the_folder_devices_and_empty_lists_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let m = valid(d.path(), b"weights");
    verify_with(d.path(), &m).unwrap();
    std::fs::write(d.path().join("..").join("outside"), b"x").ok();
    for bad in [
        "../outside",
        "/dev/zero",
        "/etc/passwd",
        "..",
        ".",
        "",
        "a/b",
        "a\\b",
        "nul\0",
        "manifest.json",
    ] {
        let mut v = m.clone();
        v["files"][0]["name"] = bad.into();
        let e = format!("{:#}", verify_with(d.path(), &v).unwrap_err());
        assert!(
            e.contains("not a file name inside the checkpoint folder"),
            "{bad:?}: {e}"
        );
    }
    let mut v = m.clone();
    v["files"] = serde_json::json!([]);
    let e = format!("{:#}", verify_with(d.path(), &v).unwrap_err());
    assert!(e.contains("lists no files"), "{e}");
    // A link to a device inside the folder is no checkpoint file either,
    // and a size on record bounds the read.
    std::os::unix::fs::symlink("/dev/zero", d.path().join("zero")).unwrap();
    let mut v = m.clone();
    v["files"][0]["name"] = "zero".into();
    let e = format!("{:#}", verify_with(d.path(), &v).unwrap_err());
    assert!(e.contains("not a regular file"), "{e}");
    let mut v = m.clone();
    v["files"][0]["bytes"] = 3.into();
    let e = format!("{:#}", verify_with(d.path(), &v).unwrap_err());
    assert!(e.contains("4 bytes, the manifest says 3"), "{e}");
}

/// Only files the manifest lists are read: a file of the folder it does
/// not list (left out of the list, or added beside it) makes the
/// checkpoint corrupt, naming the file; hidden files (`.DS_Store`) and
/// folders, never read, do not. A manifest saying format 1 but listing
/// files has them checked all the same.
#[test]
fn a_file_the_manifest_does_not_list_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let m = valid(d.path(), b"weights");
    std::fs::write(d.path().join(".DS_Store"), b"finder").unwrap();
    std::fs::create_dir(d.path().join("mlx-lm")).unwrap();
    verify_with(d.path(), &m).unwrap();

    let mut v = m.clone();
    v["files"].as_array_mut().unwrap().remove(0);
    v["layout"]["optimizer_files"] = serde_json::json!(["optimizer.safetensors"]);
    assert_eq!(v["files"][0]["name"], "optimizer.safetensors");
    let e = format!("{:#}", verify_with(d.path(), &v).unwrap_err());
    assert!(
        e.contains("model.safetensors") && e.contains("not listed in the manifest"),
        "{e}"
    );

    std::fs::write(d.path().join("loader_rank1.json"), b"{}").unwrap();
    let e = format!("{:#}", verify_with(d.path(), &m).unwrap_err());
    assert!(
        e.contains("loader_rank1.json") && e.contains("not listed in the manifest"),
        "{e}"
    );
    std::fs::remove_file(d.path().join("loader_rank1.json")).unwrap();

    let mut v = m.clone();
    v["format"] = 1.into();
    std::fs::write(d.path().join("model.safetensors"), b"weightz").unwrap();
    let e = format!("{:#}", verify_with(d.path(), &v).unwrap_err());
    assert!(
        e.contains("model.safetensors") && e.contains("sha256"),
        "{e}"
    );
}

/// The tokenizer a checkpoint's manifest names is read from the
/// checkpoint's copy (checked against its recorded size and sha256), else
/// only from inside the run folder: a path outside it, `..` out of it, or
/// a device is refused, naming the path.
#[test]
fn a_manifests_tokenizer_path_stays_inside_its_run_folder() {
    use mlx_llama::{TokenizerChoice, TrainConfig};
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let ckpt = run.join("checkpoints").join("step_00000004");
    std::fs::create_dir_all(&ckpt).unwrap();
    let tokenizer_of = |m: &serde_json::Value, tokenizer: TokenizerChoice| {
        let mut v = m.clone();
        v["config"] = serde_json::to_value(TrainConfig {
            tokenizer,
            ..TrainConfig::default()
        })
        .unwrap();
        std::fs::write(ckpt.join("manifest.json"), v.to_string()).unwrap();
        checkpoint::tokenizer_of(&ckpt).map_err(|e| format!("{e:#}"))
    };
    let m = valid(&ckpt, b"weights");
    std::fs::write(run.join("tok.json"), b"{}").unwrap();
    std::fs::write(d.path().join("outside.json"), b"{}").unwrap();
    let inside = run.join("tok.json").canonicalize().unwrap();
    assert_eq!(
        tokenizer_of(&m, TokenizerChoice::File(run.join("tok.json"))).unwrap(),
        TokenizerChoice::File(inside)
    );
    for bad in [
        d.path().join("outside.json"),
        run.join("..").join("outside.json"),
        "/dev/zero".into(),
        "/etc/passwd".into(),
    ] {
        let e = tokenizer_of(&m, TokenizerChoice::File(bad.clone())).unwrap_err();
        assert!(
            e.contains("outside its run folder") && e.contains(&bad.display().to_string()),
            "{bad:?}: {e}"
        );
    }
    let e = tokenizer_of(&m, TokenizerChoice::Gpt2Files("/etc".into())).unwrap_err();
    assert!(e.contains("outside its run folder"), "{e}");
    // A device inside the run folder is no tokenizer file either.
    std::fs::create_dir(run.join("dev")).unwrap();
    let e = tokenizer_of(&m, TokenizerChoice::File(run.join("dev"))).unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
    // The checkpoint's copy, whatever the path the manifest names...
    std::fs::write(ckpt.join("tokenizer.json"), b"{\"copy\": 1}").unwrap();
    let m = valid(&ckpt, b"weights");
    assert_eq!(
        tokenizer_of(&m, TokenizerChoice::File("/dev/zero".into())).unwrap(),
        TokenizerChoice::File(ckpt.join("tokenizer.json"))
    );
    // ...read no further than its recorded size.
    std::fs::write(ckpt.join("tokenizer.json"), b"{\"copy\": 1, \"more\": 2}").unwrap();
    let e = tokenizer_of(&m, TokenizerChoice::File("/dev/zero".into())).unwrap_err();
    assert!(
        e.contains("tokenizer.json") && e.contains("the manifest says 11 bytes"),
        "{e}"
    );
}

#[test]
fn the_latest_pointer_names_only_a_checkpoint_folder() {
    assert_eq!(
        checkpoint::parse_pointer(b"step_00000012\n").unwrap(),
        "step_00000012"
    );
    for bad in [
        &b"../../etc"[..],
        b"/dev/zero",
        b"step_12",
        // One step, one folder: a longer spelling of step 12 is not its.
        b"step_000000012",
        b"step_00000012/../x",
        b"",
        b"\xff\xfe",
    ] {
        assert!(checkpoint::parse_pointer(bad).is_err(), "{bad:?}");
    }
    assert_eq!(checkpoint::step_of("step_00000012"), Some(12));
    assert_eq!(checkpoint::step_of("step_123456789"), Some(123_456_789));
    assert_eq!(checkpoint::step_of("step_000000012"), None);
    let d = tempfile::tempdir().unwrap();
    let c = d.path().join("checkpoints");
    std::fs::create_dir_all(&c).unwrap();
    std::fs::write(c.join("latest"), "../../outside").unwrap();
    let e = format!("{:#}", checkpoint::latest(d.path()).unwrap_err());
    assert!(e.contains("not a checkpoint folder name"), "{e}");
    // An endless pointer is read only so far.
    std::os::unix::fs::symlink("/dev/zero", c.join("latest2")).unwrap();
    std::fs::rename(c.join("latest2"), c.join("latest")).unwrap();
    let e = format!("{:#}", checkpoint::latest(d.path()).unwrap_err());
    assert!(e.contains("larger than 64 bytes"), "{e}");
}

/// A JSON value derived from `seed`: what a mutation puts in a field.
fn junk(seed: u8, text: &str) -> serde_json::Value {
    match seed % 7 {
        0 => serde_json::Value::Null,
        1 => text.into(),
        2 => (-1i64).into(),
        3 => u64::MAX.into(),
        4 => serde_json::json!([text]),
        5 => serde_json::json!({ text: 1 }),
        _ => 1.5.into(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn manifests_of_arbitrary_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Manifest::from_bytes(&bytes);
    }

    #[test]
    fn mutated_manifests_are_verified_or_refused(
        field in 0usize..9,
        seed in any::<u8>(),
        text in "[./a-z\\\\\0]{0,12}",
        cut in 0usize..2000,
    ) {
        let d = tempfile::tempdir().unwrap();
        let mut m = valid(d.path(), b"weights");
        let fields = ["format", "step", "world", "files", "layout", "vocab_size"];
        match field {
            0..=5 => m[fields[field]] = junk(seed, &text),
            6 => m["files"][0]["name"] = text.clone().into(),
            7 => m["files"][0]["bytes"] = junk(seed, &text),
            _ => m["layout"]["optimizer_files"][0] = text.clone().into(),
        }
        let mut bytes = serde_json::to_vec(&m).unwrap();
        if seed % 3 == 0 {
            bytes.truncate(cut.min(bytes.len()));
        }
        std::fs::write(d.path().join("manifest.json"), &bytes).unwrap();
        if let Ok(got) = checkpoint::verify(d.path()) {
            // Whatever passed names only plain files of the folder.
            for f in &got.files {
                prop_assert!(checkpoint::is_plain_name(&f.name));
                prop_assert!(d.path().join(&f.name).is_file());
            }
        }
    }

    #[test]
    fn pointers_of_arbitrary_bytes_are_errors_or_plain_step_names(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(name) = checkpoint::parse_pointer(&bytes) {
            prop_assert!(checkpoint::is_plain_name(&name) && name.starts_with("step_"));
        }
    }

    #[test]
    fn config_files_of_arbitrary_bytes_are_errors_not_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        valid_prefix in any::<bool>(),
    ) {
        let cmd = clap::Command::new("train")
            .arg(clap::Arg::new("steps").long("steps"))
            .arg(clap::Arg::new("fresh").long("fresh").action(clap::ArgAction::SetTrue));
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run.toml");
        let mut text = if valid_prefix { b"steps = 4\nfresh = true\n".to_vec() } else { vec![] };
        text.extend(&bytes);
        std::fs::write(&p, &text).unwrap();
        let _ = mlx_llama::options_file::file_args(&cmd, &p);
    }
}
