//! The fuzz targets: each a reader of bytes from a file or a peer, called as
//! production calls it, and the seeds its corpus starts from (valid inputs
//! written by the project's own writers; `cargo xtask fuzz seeds` writes
//! them to `fuzz/corpus/<target>/`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use mlx_array::{Array, Dtype, Tree};
use mlx_data::source::jsonl::read_rows_from;
use mlx_data::store::{StoreMeta, StoreWriter};
use mlx_data::{BatchMode, BatchSize, DataLoader, LoaderConfig, LoaderState, TokenStore, Verify};
use mlx_dist::fuzzing as dist;
use mlx_dist::handshake::{self, JobCredentials};
use mlx_dist::wire::{AbortPayload, FrameHeader, Heartbeat, OpKind};
use mlx_optim::{Adam, DeviceLossScaler, LossScaler, Optimizer};

/// A fuzz target: its name, the function its inputs go to, its seeds.
pub struct Target {
    /// What `MLX_FUZZ_TARGET` names it (and its corpus folder).
    pub name: &'static str,
    /// Reads one input; a panic is a crash.
    pub run: fn(&[u8]),
    /// Valid inputs, written by the project's own writers.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "wire_frame",
        run: wire_frame,
        seeds: wire_frame_seeds,
    },
    Target {
        name: "mesh_data_link",
        run: mesh_data_link,
        seeds: mesh_data_link_seeds,
    },
    Target {
        name: "mesh_witness",
        run: mesh_witness,
        seeds: mesh_witness_seeds,
    },
    Target {
        name: "handshake",
        run: handshake_server,
        seeds: handshake_seeds,
    },
    Target {
        name: "shm_offer",
        run: shm_offer,
        seeds: shm_offer_seeds,
    },
    Target {
        name: "agent",
        run: agent,
        seeds: agent_seeds,
    },
    Target {
        name: "launcher_output",
        run: launcher_output,
        seeds: dist::launcher_output_seeds,
    },
    Target {
        name: "hostfile_report",
        run: hostfile_report,
        seeds: hostfile_report_seeds,
    },
    Target {
        name: "safetensors",
        run: safetensors,
        seeds: safetensors_seeds,
    },
    Target {
        name: "optimizer_state",
        run: optimizer_state,
        seeds: optimizer_state_seeds,
    },
    Target {
        name: "loss_scale",
        run: loss_scale,
        seeds: loss_scale_seeds,
    },
    Target {
        name: "loader_state",
        run: loader_state,
        seeds: loader_state_seeds,
    },
    Target {
        name: "token_store",
        run: token_store,
        seeds: token_store_seeds,
    },
    Target {
        name: "tokenizer_json",
        run: tokenizer_json,
        seeds: tokenizer_json_seeds,
    },
    Target {
        name: "jsonl",
        run: jsonl,
        seeds: jsonl_seeds,
    },
    Target {
        name: "parquet",
        run: parquet,
        seeds: parquet_seeds,
    },
    Target {
        name: "safetensors_index",
        run: safetensors_index,
        seeds: safetensors_index_seeds,
    },
    Target {
        name: "hub_listing",
        run: hub_listing,
        seeds: hub_listing_seeds,
    },
    Target {
        name: "chat_template",
        run: chat_template,
        seeds: chat_template_seeds,
    },
    Target {
        name: "checkpoint_manifest",
        run: checkpoint_manifest,
        seeds: checkpoint_manifest_seeds,
    },
    Target {
        name: "model_config",
        run: model_config,
        seeds: model_config_seeds,
    },
    Target {
        name: "model_weights",
        run: model_weights,
        seeds: model_weights_seeds,
    },
    Target {
        name: "adapter_config",
        run: adapter_config,
        seeds: adapter_config_seeds,
    },
    Target {
        name: "run_records",
        run: run_records,
        seeds: run_records_seeds,
    },
    Target {
        name: "options_file",
        run: options_file,
        seeds: options_file_seeds,
    },
];

/// A scratch folder of this process (removed by nobody: a fuzz run is one
/// process, and it lives in the system's temporary folder).
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("mlx-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch folder");
        d
    })
}

/// `data` written to the file `name` of the scratch folder.
fn file_with(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, data).expect("writing the input file");
    p
}

/// The bytes a writer left in the scratch file `name`.
fn written(name: &str, write: impl FnOnce(&Path)) -> Vec<u8> {
    let p = scratch().join(name);
    write(&p);
    std::fs::read(&p).expect("reading what was written")
}

// --- mlx-dist ------------------------------------------------------------

fn header(op: OpKind, len: u64) -> FrameHeader {
    let (_, group, seq, dtype, total) = dist::FUZZ_OP;
    FrameHeader {
        op,
        dtype,
        group,
        seq,
        total,
        len,
    }
}

/// `wire::read_frame` and the decoders of its payloads.
fn wire_frame(data: &[u8]) {
    let mut r = data;
    while let Ok((h, payload)) = mlx_dist::wire::read_frame(&mut r, 1 << 16) {
        assert_eq!(payload.len() as u64, h.len);
        match h.op {
            OpKind::Abort => {
                let _ = AbortPayload::decode(&payload);
            }
            OpKind::Heartbeat => {
                let _ = Heartbeat::decode(&payload);
            }
            _ => {}
        }
    }
}

fn frames(frames: &[(FrameHeader, Vec<u8>)]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|(h, p)| h.encode().into_iter().chain(p.iter().copied()))
        .collect()
}

fn abort_frame(culprit: Option<u32>) -> (FrameHeader, Vec<u8>) {
    let p = AbortPayload {
        culprit,
        reason: "rank 1 died".into(),
    }
    .encode();
    (header(OpKind::Abort, p.len() as u64), p)
}

fn heartbeat_frame() -> (FrameHeader, Vec<u8>) {
    let p = Heartbeat {
        current: Some((OpKind::AllSum, 0, 7)),
        begun: 7,
    }
    .encode();
    let mut h = FrameHeader::decode(&FrameHeader::control(OpKind::Heartbeat, p.len())).unwrap();
    h.len = p.len() as u64;
    (h, p.to_vec())
}

fn control(op: OpKind) -> (FrameHeader, Vec<u8>) {
    (
        FrameHeader::decode(&FrameHeader::control(op, 0)).unwrap(),
        Vec::new(),
    )
}

fn wire_frame_seeds() -> Vec<Vec<u8>> {
    vec![
        frames(&[
            (header(OpKind::AllSum, 16), vec![1; 16]),
            abort_frame(Some(1)),
        ]),
        frames(&[heartbeat_frame(), control(OpKind::Bye)]),
    ]
}

/// The data links' frame reads (`OpCtx::recv`, `recv_with`, `check_header`).
fn mesh_data_link(data: &[u8]) {
    let _ = dist::data_link_frames(data);
}

fn mesh_data_link_seeds() -> Vec<Vec<u8>> {
    // The first byte picks the lengths expected: 0b11 = 64 bytes each.
    let data = |n: usize| (header(OpKind::AllSum, 64), vec![n as u8; 64]);
    let mut ok = vec![0xff];
    ok.extend(frames(&(0..16).map(data).collect::<Vec<_>>()));
    let mut abort = vec![0xff];
    abort.extend(frames(&[data(0), abort_frame(None)]));
    vec![ok, abort]
}

/// The reader of a peer's witness (heartbeats, goodbyes, aborts).
fn mesh_witness(data: &[u8]) {
    let _ = dist::witness_frames(data);
}

fn mesh_witness_seeds() -> Vec<Vec<u8>> {
    vec![
        frames(&[heartbeat_frame(), heartbeat_frame(), control(OpKind::Bye)]),
        frames(&[heartbeat_frame(), abort_frame(Some(0))]),
        frames(&[control(OpKind::Bye), control(OpKind::ByeAck)]),
    ]
}

fn credentials() -> JobCredentials {
    JobCredentials {
        job_id: [7; 16],
        secret: b"fuzz".to_vec(),
        world: 4,
        links: 2,
    }
}

/// Both sides of the connection handshake; the first byte picks the side.
fn handshake_server(data: &[u8]) {
    let Some((&side, rest)) = data.split_first() else {
        return;
    };
    let cred = credentials();
    if side & 1 == 0 {
        let _ = handshake::server(&mut dist::InputStream(rest), &cred, 0, |_| Ok(()));
    } else {
        let _ = handshake::client(&mut dist::InputStream(rest), &cred, 1, 0, 0);
    }
}

/// What a client sends: its HELLO (as `handshake::client` writes it) and a tag.
fn handshake_seeds() -> Vec<Vec<u8>> {
    /// Keeps what the client writes; answers with a refusal.
    struct Record(Vec<u8>, &'static [u8]);
    impl std::io::Read for Record {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            std::io::Read::read(&mut self.1, buf)
        }
    }
    impl std::io::Write for Record {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut r = Record(Vec::new(), b"\x01\x04\x00nope");
    let _ = handshake::client(&mut r, &credentials(), 1, 0, 0);
    let mut server = vec![0u8];
    server.extend(&r.0);
    server.extend([0xab; 32]);
    // What a server answers, to the client side: success, rank, nonce, tag.
    let mut client = vec![1u8, 0, 0, 0, 0, 0];
    client.extend([0x5a; 64]);
    vec![server, client, b"\x01\x01\x04\x00nope".to_vec()]
}

/// A lower rank's shared-memory offer, answered after the handshake; the
/// first byte turns segments on (odd) or off.
fn shm_offer(data: &[u8]) {
    let _ = dist::shm_offer(data);
}

fn shm_offer_seeds() -> Vec<Vec<u8>> {
    [true, false]
        .into_iter()
        .map(|segment| [vec![1u8], dist::shm_offer_bytes(segment)].concat())
        .collect()
}

/// The remote agent's order line and the frames after it.
fn agent(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which & 1 == 0 {
        let _ = dist::agent_frames(rest);
    } else if let Ok(text) = std::str::from_utf8(rest) {
        let _ = dist::agent_order(text);
    }
}

fn agent_seeds() -> Vec<Vec<u8>> {
    let mut frames = vec![0u8];
    frames.extend(dist::agent_frame_bytes(b"hello\n", 15));
    let mut order = vec![1u8];
    order.extend(dist::agent_order_line(&["python3", "-c", "print(1)"]).bytes());
    vec![frames, order]
}

/// What the launcher reads from ranks, `mpirun` and remote hosts: tagged
/// output, sealed agent lines, `--check` requests and answers, progress events.
fn launcher_output(data: &[u8]) {
    let _ = dist::launcher_output(data);
}

/// The host file (`--hostfile`), a rank's failure report, a timeout.
fn hostfile_report(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = mlx_dist::config::parse_hostfile(text);
    let _ = mlx_dist::report::parse_report(text, 1, 4);
    let _ = mlx_dist::config::parse_seconds(text, true);
}

fn hostfile_report_seeds() -> Vec<Vec<u8>> {
    vec![
        b"# hosts\nnode1 slots=2\nnode2:29500\n[::1]:4000 slots=1\n".to_vec(),
        br#"{"rank":1,"culprit":2,"reason":"rank 2 closed its connection"}"#.to_vec(),
        b"1.5".to_vec(),
    ]
}

// --- mlx-array -----------------------------------------------------------

/// `load_safetensors` (checkpoints, models) and `load_safetensors_parts`
/// (a tensor-parallel rank's shard); the first byte picks which and the block.
fn safetensors(data: &[u8]) {
    use mlx_array::io::Part;
    let Some((&pick, file)) = data.split_first() else {
        return;
    };
    let p = file_with("in.safetensors", file);
    let loaded = match pick & 3 {
        0 => mlx_array::load_safetensors(&p),
        1 => {
            let parts = 1 + (pick as usize >> 4 & 3);
            let block = Part::Block {
                axis: pick as usize >> 2 & 3,
                index: (pick as usize >> 6) % parts,
                parts,
            };
            mlx_array::io::load_safetensors_parts(&p, |_, _| block)
        }
        2 => mlx_array::io::load_safetensors_parts(&p, |name, _| {
            if name.len() % 2 == 0 {
                Part::Whole
            } else {
                Part::Skip
            }
        }),
        _ => mlx_array::load_tree(&p).map(|t| (t.flatten().into_iter().collect(), HashMap::new())),
    };
    if let Ok((arrays, _)) = loaded {
        for a in arrays.values() {
            let _ = a.astype(Dtype::F32).and_then(|f| f.to_vec::<f32>());
        }
    }
}

fn safetensors_seeds() -> Vec<Vec<u8>> {
    let arrays = vec![
        (
            "layers.0.w".to_string(),
            Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap(),
        ),
        (
            "layers.0.b".to_string(),
            Array::from_slice(&[1i32, -2], &[2]).unwrap(),
        ),
        (
            "flag".to_string(),
            Array::from_slice(&[mlx_array::Bool8(1), mlx_array::Bool8(0)], &[2]).unwrap(),
        ),
    ];
    let file = written("seed.safetensors", |p| {
        mlx_array::save_safetensors(
            p,
            &arrays,
            Some(HashMap::from([("format".into(), "mlx".into())])),
        )
        .unwrap()
    });
    // An empty tensor with large dimensions, its header written by hand (an
    // overflow in its strides was the first crash this target's inputs met).
    let header = r#"{"t":{"dtype":"F32","shape":[0,1048576,4],"data_offsets":[0,0]}}"#;
    let empty = [&(header.len() as u64).to_le_bytes()[..], header.as_bytes()].concat();
    [0u8, 0b0001_0001, 2, 3]
        .iter()
        .map(|&pick| [vec![pick], file.clone()].concat())
        .chain([[vec![1u8], empty].concat()])
        .collect()
}

// --- mlx-optim -----------------------------------------------------------

/// The parameters the optimizer-state target resumes: `w` [2, 2], `b` [2].
fn params() -> Tree {
    Tree::unflatten([
        (
            "w".to_string(),
            Array::from_slice(&[0.5f32, -0.5, 1.0, 2.0], &[2, 2]).unwrap(),
        ),
        (
            "b".to_string(),
            Array::from_slice(&[0.0f32, 1.0], &[2]).unwrap(),
        ),
    ])
    .unwrap()
}

/// An Adam optimizer's state file, loaded as a resume loads it, then one step.
fn optimizer_state(data: &[u8]) {
    let p = file_with("state.safetensors", data);
    let mut params = params();
    let mut opt = Adam::new(1e-3);
    if opt.load_state(&p, &params).is_ok() {
        let grads = params.map(|_, a| Ok(a.clone())).unwrap();
        if opt.update_tree(&mut params, &grads).is_ok() {
            for (_, a) in params.flatten() {
                let _ = a.to_vec::<f32>();
            }
        }
    }
}

fn optimizer_state_seeds() -> Vec<Vec<u8>> {
    let mut params = params();
    let mut opt = Adam::new(1e-3);
    let grads = params.map(|_, a| Ok(a.clone())).unwrap();
    opt.update_tree(&mut params, &grads).unwrap();
    let stepped = written("seed-state.safetensors", |p| opt.save_state(p).unwrap());
    let fresh = written("seed-fresh.safetensors", |p| {
        Adam::new(1e-3).save_state(p).unwrap()
    });
    vec![stepped, fresh]
}

/// A float16 run's `loss_scale.json`, resumed as the trainer resumes it,
/// then a few settled steps.
fn loss_scale(data: &[u8]) {
    let Ok(settled) = serde_json::from_slice::<LossScaler>(data) else {
        return;
    };
    if let Ok(mut s) = DeviceLossScaler::new(settled) {
        for finite in [true, false, true, true] {
            s.settle(finite);
        }
        let _ = s.scale().item::<f32>();
    }
}

fn loss_scale_seeds() -> Vec<Vec<u8>> {
    let mut s = LossScaler::with(1024.0, 4);
    s.update(true);
    s.update(false);
    vec![
        serde_json::to_vec(&LossScaler::new()).unwrap(),
        serde_json::to_vec(&s).unwrap(),
    ]
}

// --- mlx-data ------------------------------------------------------------

/// A token store of 5 documents (written once per process).
fn store_path() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let p = scratch().join("loader.tokens");
        let mut w = StoreWriter::create(&p, 100, 0).unwrap();
        for d in 0..5u32 {
            w.push_doc(&[d + 1, d + 2, d + 3]).unwrap();
        }
        w.finish(StoreMeta {
            source: "fuzz".into(),
            tokenizer_hash: "h".into(),
            split: "train".into(),
        })
        .unwrap();
        p
    })
}

fn loader() -> DataLoader {
    static STORE: OnceLock<Arc<TokenStore>> = OnceLock::new();
    let store =
        STORE.get_or_init(|| Arc::new(TokenStore::open(store_path(), Verify::Full).unwrap()));
    DataLoader::new(
        store.clone(),
        LoaderConfig {
            block_size: 4,
            batch: BatchSize::Global(2),
            mode: BatchMode::Pad,
            seed: 42,
            rank: 0,
            world: 1,
            release_pages: false,
        },
    )
    .unwrap()
}

/// A rank's `loader_rank<N>.json`, restored as a resume restores it, then
/// two batches.
fn loader_state(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(state) = LoaderState::from_json(text) else {
        return;
    };
    let _ = state.global_batch();
    let mut l = loader();
    if l.restore(&state).is_ok() {
        for _ in 0..2 {
            l.next_batch().unwrap();
        }
    }
}

fn loader_state_seeds() -> Vec<Vec<u8>> {
    let mut l = loader();
    let first = l.state().to_json().into_bytes();
    l.next_batch().unwrap();
    l.next_batch().unwrap();
    l.next_batch().unwrap();
    vec![first, l.state().to_json().into_bytes()]
}

/// A token store file, opened as a run opens it, then read. The first
/// byte's bits say whether to recompute the data checksum (1) and the
/// header's (2) first, so that edits reach past them, and whether to check
/// the header only (4, as a store this process just wrote is opened).
fn token_store(data: &[u8]) {
    use mlx_data::store::format::{HEADER_LEN, HEADER_SUM_AT, header_checksum};
    let Some((&how, rest)) = data.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if b.len() >= HEADER_LEN {
        if how & 1 != 0 {
            let sum = xxhash_rust::xxh3::xxh3_64(&b[HEADER_LEN..]);
            b[64..72].copy_from_slice(&sum.to_le_bytes());
        }
        if how & 2 != 0 {
            let sum = header_checksum(&b);
            b[HEADER_SUM_AT..HEADER_SUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
        }
    }
    let verify = if how & 4 != 0 {
        Verify::HeaderOnly
    } else {
        Verify::Full
    };
    let p = file_with("in.tokens", &b);
    if let Ok(s) = TokenStore::open(&p, verify) {
        let n = s.n_docs();
        for d in 0..n.min(8) {
            if let Ok(t) = s.doc(d) {
                let mut out = vec![0u32; 16];
                let _ = t.copy_to(&mut out);
            }
            let _ = s.doc_start(d);
        }
        let _ = s.loss_flags(0, s.n_tokens());
        let _ = s.loss_flags(0, u64::MAX);
        let _ = s.doc_of(s.n_tokens().saturating_sub(1));
        let _ = s.doc_of(u64::MAX);
        let _ = s.doc_start(u64::MAX);
    }
}

fn token_store_seeds() -> Vec<Vec<u8>> {
    let docs = std::fs::read(store_path()).unwrap();
    let examples = written("seed-examples.tokens", |p| {
        let mut w = StoreWriter::create(p, 100, 0).unwrap();
        w.push_example(&[5, 6, 7], &[0, 1, 1]).unwrap();
        w.push_doc(&[8, 9]).unwrap();
        w.finish(StoreMeta {
            source: "s".into(),
            tokenizer_hash: "h".into(),
            split: "train".into(),
        })
        .unwrap();
    });
    [docs, examples]
        .into_iter()
        .flat_map(|b| [[vec![0u8], b.clone()].concat(), [vec![7u8], b].concat()])
        .collect()
}

/// A model's or a run's `tokenizer.json`, loaded as a run loads it, then
/// used both ways.
fn tokenizer_json(data: &[u8]) {
    let p = file_with("tokenizer.json", data);
    if let Ok(t) = mlx_data::TextTokenizer::from_file(&p)
        && let Ok(ids) = t.encode("Once upon a time <|endoftext|> the end")
    {
        let _ = t.decode(&ids);
    }
}

fn tokenizer_json_seeds() -> Vec<Vec<u8>> {
    let docs = [
        "Once upon a time there was a cat.",
        "The cat sat on a mat.",
        "The end.",
    ];
    let t = mlx_data::TextTokenizer::train_byte_level(&docs, 262).unwrap();
    vec![written("seed-tokenizer.json", |p| t.save(p).unwrap())]
}

/// JSON lines of a local or Hub dataset (text, chat, prompt/completion rows).
fn jsonl(data: &[u8]) {
    let _ = read_rows_from(data, Path::new("fuzz.jsonl"), &mut |r, _| {
        let _ = r.format();
        Ok(())
    });
}

fn jsonl_seeds() -> Vec<Vec<u8>> {
    vec![
        b"{\"text\": \"Once upon a time\"}\n{\"text\": \"the end\"}\n".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n".to_vec(),
        b"{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n".to_vec(),
    ]
}

/// A parquet file of a Hub dataset: its footer, then the text column read
/// as the pipeline reads it.
fn parquet(data: &[u8]) {
    use mlx_data::source::parquet as pq;
    let p = file_with("in.parquet", data);
    let _ = pq::parquet_shape(&p);
    let _ = pq::parquet_text_bytes(&p, "text");
    let mut rows = 0usize;
    let _ = pq::read_parquet_column(&p, "text", 4, &mut |_, _| {}, &mut |row| {
        rows += row.map_or(0, str::len);
        Ok(())
    });
}

fn parquet_seeds() -> Vec<Vec<u8>> {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    // As the Hub's datasets are written (tests/common/parquet_files.rs of
    // mlx-data): an `id` and a `text` column, two row groups, one null;
    // plainly and with snappy.
    let texts = [Some("Once upon a time"), None, Some("the end"), Some("")];
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..4)) as ArrayRef,
        ),
        (
            "text",
            Arc::new(StringArray::from(texts.to_vec())) as ArrayRef,
        ),
    ])
    .unwrap();
    [
        parquet::basic::Compression::UNCOMPRESSED,
        parquet::basic::Compression::SNAPPY,
    ]
    .into_iter()
    .map(|c| {
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .set_compression(c)
            .build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        out
    })
    .collect()
}

/// `model.safetensors.index.json` of a Hub snapshot (which files to fetch).
fn safetensors_index(data: &[u8]) {
    let _ = mlx_data::hub::snapshot::safetensors_index_files(data);
}

fn safetensors_index_seeds() -> Vec<Vec<u8>> {
    vec![br#"{"metadata":{"total_size":16},"weight_map":{"a.weight":"model-00001-of-00002.safetensors","b.weight":"model-00002-of-00002.safetensors"}}"#.to_vec()]
}

/// A Hub repository's file listing: the server's answer to
/// `/api/models/{repo}/revision/{revision}` (first byte even) or the copy the
/// cache keeps of it (odd), read as `HubClient::list_files` reads them.
fn hub_listing(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if which & 1 == 0 {
        let _ = mlx_data::hub::RepoListing::from_revision_info("https://hub.test/api", text);
    } else {
        let _ = mlx_data::hub::RepoListing::from_cached_json(HUB_COMMIT, text);
    }
}

/// The commit the `hub_listing` seeds list.
const HUB_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn hub_listing_seeds() -> Vec<Vec<u8>> {
    // The Hub's answer, trimmed to what is read (as huggingface_hub receives it).
    let answer = format!(
        r#"{{"_id":"621ffdc036468d709f174338","id":"gpt2","private":false,"sha":"{HUB_COMMIT}","siblings":[{{"rfilename":".gitattributes"}},{{"rfilename":"config.json"}},{{"rfilename":"onnx/decoder_model.onnx"}},{{"rfilename":"model.safetensors"}}]}}"#
    );
    let cached = serde_json::to_vec(&mlx_data::hub::RepoListing {
        commit: HUB_COMMIT.into(),
        files: vec!["config.json".into(), "model.safetensors".into()],
    })
    .expect("a listing as JSON");
    vec![
        [[0u8].as_slice(), answer.as_bytes()].concat(),
        [[1u8].as_slice(), &cached].concat(),
    ]
}

// --- mlx-data: chat templates ----------------------------------------------

/// A model's `tokenizer_config.json`: its chat template read, compiled and
/// rendered over a system, user and assistant turn, as `generate` and the
/// chat data pipeline do.
fn chat_template(data: &[u8]) {
    let dir = scratch().join("chat");
    std::fs::create_dir_all(&dir).expect("a chat folder");
    std::fs::write(dir.join("tokenizer_config.json"), data).expect("writing the input file");
    if let Ok(Some(t)) = mlx_data::ChatTemplate::from_model_dir(&dir)
        && let Ok(r) = t.renderer()
    {
        let messages = [
            serde_json::json!({"role": "system", "content": "Be brief."}),
            serde_json::json!({"role": "user", "content": "Once upon a time?"}),
            serde_json::json!({"role": "assistant", "content": "The end."}),
        ];
        let _ = r.render(&messages, true);
    }
}

fn chat_template_seeds() -> Vec<Vec<u8>> {
    // As transformers saves them: a template string, a list of named
    // templates, with the special tokens beside.
    let template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    [
        serde_json::json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template}),
        serde_json::json!({"eos_token": {"content": "</s>"}, "chat_template": [{"name": "default", "template": template}]}),
    ]
    .iter()
    .map(|v| serde_json::to_vec_pretty(v).unwrap())
    .collect()
}

// --- mlx-llama ---------------------------------------------------------------

/// A run folder's records read back, chosen by `data[0] & 3`: its
/// `metrics.jsonl` (trimmed as a resume trims it when bit 2 is set, read and
/// drawn as `mlx-llama curves` does when bit 3 is), its `run.toml` against a
/// resume's options (1), and the end-of-sequence readers of a model's JSON
/// files (2 and 3).
fn run_records(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which & 3 {
        0 => {
            let dir = scratch().join("run");
            std::fs::create_dir_all(&dir).expect("a run folder");
            let metrics = dir.join("metrics.jsonl");
            std::fs::write(&metrics, rest).expect("writing the input file");
            if which & 4 != 0 {
                let _ = mlx_llama::run_folder::keep_metrics_through(&dir, 3);
            }
            if which & 8 != 0 {
                let _ = mlx_llama::curves::write(&dir);
            } else {
                let _ = mlx_llama::curves::read(&metrics);
            }
        }
        1 => {
            let text = String::from_utf8_lossy(rest);
            let _ = mlx_llama::run_folder::changed_options(RUN_TOML, &text);
            let _ = mlx_llama::run_folder::changed_options(&text, RUN_TOML);
        }
        _ => {
            let _ = mlx_llama::source::eos_token_ids(rest);
            let _ = mlx_llama::source::eos_token_name(rest);
            let _ = mlx_llama::source::token_id(rest, "</s>");
        }
    }
}

/// A run's options as `train` records them (the seeds' run.toml).
const RUN_TOML: &str = "steps = 200\nlr = 0.0003\nschedule = \"cosine\"\nbatch = 8\nout = \"runs/a\"\n\n[model]\ndims = 64\n";

fn run_records_seeds() -> Vec<Vec<u8>> {
    let record = |step: u64, loss: f64| {
        serde_json::json!({"step": step, "epoch": 0, "loss": loss, "learning_rate": 3e-4,
            "tokens_per_s": 1234.5, "ms_per_step": 80.0, "comm_ms": 2.0,
            "comm_wait_ms": 1.0, "peak_mib": 300.0, "active_mib": 120.0,
            "grad_norm": 1.5, "unix_time": 1_765_000_000.0, "eval_loss": loss + 0.1})
        .to_string()
    };
    let metrics: String = (1..=5).map(|s| record(s, 5.0 / s as f64) + "\n").collect();
    vec![
        [[4u8].as_slice(), metrics.as_bytes()].concat(),
        [[8u8].as_slice(), metrics.as_bytes()].concat(),
        [[1u8].as_slice(), RUN_TOML.replace("200", "400").as_bytes()].concat(),
        [[2u8].as_slice(), br#"{"eos_token_id": [2, 128001], "eos_token": {"content": "</s>"}, "added_tokens": [{"id": 2, "content": "</s>"}], "model": {"vocab": {"</s>": 2}}}"#].concat(),
    ]
}

/// A checkpoint's `manifest.json`, checked as resume, generate and export
/// check it before reading a file it lists.
fn checkpoint_manifest(data: &[u8]) {
    let _ = mlx_llama::checkpoint::Manifest::from_bytes(data);
}

fn checkpoint_manifest_seeds() -> Vec<Vec<u8>> {
    // A format-3 manifest as `write_manifest` writes one (serde, pretty),
    // and a format-1 one (no files).
    let sha = "0".repeat(64);
    let m: mlx_llama::checkpoint::Manifest = serde_json::from_value(serde_json::json!({
        "format": 3, "step": 4, "world": 2,
        "resume_key": {"model": {"dims": 32}, "global_batch": 4},
        "config": {"steps": 4, "dims": 32},
        "vocab_size": 300,
        "files": [
            {"name": "model.safetensors", "bytes": 10, "sha256": sha},
            {"name": "optimizer.safetensors", "bytes": 20, "sha256": sha},
        ],
        "layout": {
            "optimizer_files": ["optimizer.safetensors"],
            "data": {"epoch": 0, "batch_in_epoch": 4, "seed": 42, "rank": 0, "world": 2,
                     "n_samples": 100, "per_rank_batch": 2, "block_size": 32, "mode": "Pack"},
        },
    }))
    .expect("a manifest");
    let old = serde_json::json!({"format": 1, "step": 2, "world": 1, "resume_key": {},
                                 "config": {}, "vocab_size": 300});
    vec![
        serde_json::to_vec_pretty(&m).unwrap(),
        serde_json::to_vec_pretty(&old).unwrap(),
    ]
}

/// A pretrained model's `config.json` (transformers' or mlx-lm's), read as
/// `--init-from` and `generate --checkpoint` read it.
fn model_config(data: &[u8]) {
    let _ = mlx_llama::import::parse_config(data);
}

fn model_config_seeds() -> Vec<Vec<u8>> {
    // transformers' own, from the fixtures its reference outputs came with.
    [
        &include_bytes!("../../mlx-llama/tests/fixtures/hf_llamas/llama-3.2-1b/config.json")[..],
        &include_bytes!("../../mlx-llama/tests/fixtures/hf_llamas/smollm-135m/config.json")[..],
        &include_bytes!("../../mlx-llama/tests/fixtures/hf_llamas/dynamic-rope/config.json")[..],
        &include_bytes!("../../mlx-llama/tests/fixtures/hf_llamas/linear-rope/config.json")[..],
    ]
    .iter()
    .map(|b| b.to_vec())
    .collect()
}

/// A pretrained model's weights (`model.safetensors`) and shard index
/// (`model.safetensors.index.json`), read as `--init-from` reads them: the
/// first byte picks which.
fn model_weights(data: &[u8]) {
    match data.split_first() {
        Some((0, rest)) => {
            let _ = mlx_llama::import::parse_index(rest);
        }
        Some((_, rest)) => {
            let _ = mlx_llama::import::parse_safetensors(rest);
        }
        None => {}
    }
}

fn model_weights_seeds() -> Vec<Vec<u8>> {
    let index = br#"{"metadata":{"total_size":16},"weight_map":{"model.norm.weight":"model-00001-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors"}}"#;
    let mut seeds = vec![[&[0u8][..], &index[..]].concat()];
    // The safetensors target's files (after its picking byte), each once.
    seeds.extend(
        safetensors_seeds()
            .into_iter()
            .map(|s| [&[1u8][..], s.get(1..).unwrap_or_default()].concat()),
    );
    seeds.dedup();
    seeds
}

/// A PEFT or mlx-lm `adapter_config.json` (the first byte picks which),
/// read for a model of 4 blocks as `--init-from` and `--adapter` read it.
fn adapter_config(data: &[u8]) {
    match data.split_first() {
        Some((0, rest)) => {
            let _ = mlx_llama::adapters::peft::parse_config(rest, 4);
        }
        Some((_, rest)) => {
            let _ = mlx_llama::adapters::mlx_lm::parse_config(rest, 4);
        }
        None => {}
    }
}

fn adapter_config_seeds() -> Vec<Vec<u8>> {
    // PEFT's and mlx-lm's own, from the fixtures they wrote.
    let peft = [
        &include_bytes!("../../mlx-llama/tests/fixtures/adapters/peft-lora/adapter_config.json")[..],
        &include_bytes!("../../mlx-llama/tests/fixtures/adapters/peft-dora/adapter_config.json")[..],
    ];
    let mlx_lm = [
        &include_bytes!("../../mlx-llama/tests/fixtures/adapters/mlx-lm-lora/adapter_config.json")
            [..],
        &include_bytes!("../../mlx-llama/tests/fixtures/adapters/mlx-lm-dora/adapter_config.json")
            [..],
    ];
    peft.iter()
        .map(|b| [&[0u8][..], b].concat())
        .chain(mlx_lm.iter().map(|b| [&[1u8][..], b].concat()))
        .collect()
}

/// `mlx-llama train --config FILE` (and a run's `run.toml`): the TOML's
/// options turned into flags, parsed as the command line is.
fn options_file(data: &[u8]) {
    use clap::FromArgMatches;
    let p = file_with("run.toml", data);
    let cmd = train_command();
    let argv = vec!["train".into(), "--config".into(), p.into_os_string()];
    if let Ok(args) = mlx_llama::options_file::with_config_file(&cmd, argv, "config")
        && let Ok(m) = cmd.clone().try_get_matches_from(args)
    {
        let _ = mlx_llama::TrainConfig::from_arg_matches(&m);
        let _ = mlx_llama::options_file::resolved_toml(&cmd, &m, &["config"]);
    }
}

/// `mlx-llama train`'s options, with `--config`.
fn train_command() -> clap::Command {
    use clap::Args;
    mlx_llama::TrainConfig::augment_args(
        clap::Command::new("train").arg(clap::Arg::new("config").long("config")),
    )
}

fn options_file_seeds() -> Vec<Vec<u8>> {
    // run.toml as a run writes it (its resolved options), for a plain run
    // and a fine-tuning one.
    let cmd = train_command();
    [
        &[
            "train",
            "--steps",
            "4",
            "--dims",
            "32",
            "--schedule",
            "cosine",
        ][..],
        &[
            "train",
            "--lora-rank",
            "8",
            "--data",
            "jsonl:a.jsonl,b.jsonl",
            "--mask-prompt",
        ][..],
    ]
    .iter()
    .map(|argv| {
        let m = cmd
            .clone()
            .try_get_matches_from(*argv)
            .expect("valid options");
        mlx_llama::options_file::resolved_toml(&cmd, &m, &["config"]).into_bytes()
    })
    .collect()
}
