//! safetensors files and parameter trees.

use std::collections::HashMap;

use mlx_array::{
    ALL_DTYPES, Array, Dtype, Tree, load_safetensors, load_tree, random, save_safetensors,
    save_tree,
};

fn sample(dtype: Dtype, i: u64) -> Array {
    let x = random::uniform(&random::key(i), -100.0, 100.0, &[3, 5], Dtype::F32).unwrap();
    x.astype(dtype).unwrap()
}

fn bytes_of(a: &Array) -> Vec<u8> {
    let c = a.contiguous().unwrap();
    c.eval().unwrap();
    c.data().unwrap().as_bytes(a.dtype(), a.size()).to_vec()
}

#[test]
fn every_dtype_round_trips_bit_exactly_with_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    let arrays: Vec<(String, Array)> = ALL_DTYPES
        .iter()
        .enumerate()
        .map(|(i, &d)| (format!("t.{}", d.name()), sample(d, i as u64)))
        .collect();
    // A transposed (non-contiguous) view is written in logical order, and a
    // contiguous view starting inside its buffer from its own first element.
    let mut arrays = arrays;
    arrays.push(("view".into(), sample(Dtype::F32, 99).t().unwrap()));
    arrays.push((
        "row".into(),
        sample(Dtype::F32, 98).slice_axis(0, 1, 2).unwrap(),
    ));
    arrays.push((
        "row16".into(),
        sample(Dtype::BF16, 97).slice_axis(0, 2, 3).unwrap(),
    ));
    let meta = HashMap::from([("format".to_string(), "mlx".to_string())]);
    save_safetensors(&path, &arrays, Some(meta)).unwrap();
    let (loaded, meta) = load_safetensors(&path).unwrap();
    assert_eq!(meta.get("format").map(String::as_str), Some("mlx"));
    assert_eq!(loaded.len(), arrays.len());
    for (name, a) in &arrays {
        let b = &loaded[name];
        assert_eq!((b.shape(), b.dtype()), (a.shape(), a.dtype()), "{name}");
        assert_eq!(bytes_of(a), bytes_of(b), "{name}");
        assert_eq!(
            a.to_vec::<f32>().unwrap(),
            b.to_vec::<f32>().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn the_file_follows_the_safetensors_layout() {
    // Checked by hand against the format description, independently of the
    // safetensors crate: u64 LE header length, JSON header, then the bytes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.safetensors");
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    save_safetensors(&path, &[("w".into(), a)], None).unwrap();
    let raw = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    assert_eq!(header["w"]["dtype"], "F32");
    assert_eq!(header["w"]["shape"], serde_json::json!([2, 3]));
    let off = &header["w"]["data_offsets"];
    let (s, e) = (
        off[0].as_u64().unwrap() as usize,
        off[1].as_u64().unwrap() as usize,
    );
    let body = &raw[8 + n + s..8 + n + e];
    let floats: Vec<f32> = body
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn bad_files_give_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let err = load_safetensors(&missing).unwrap_err().to_string();
    assert!(err.contains("nope.safetensors"), "{err}");
    let good = dir.path().join("good.safetensors");
    save_safetensors(&good, &[("w".into(), Array::ones(&[64], Dtype::F32))], None).unwrap();
    let mut raw = std::fs::read(&good).unwrap();
    raw.truncate(raw.len() - 10);
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &raw).unwrap();
    let err = load_safetensors(&truncated).unwrap_err().to_string();
    assert!(err.contains("truncated.safetensors"), "{err}");
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage").unwrap();
    assert!(load_safetensors(&garbage).is_err());
}

#[test]
fn trees_flatten_unflatten_map_and_zip() {
    let items = vec![
        (
            "layers.0.attention.wq.weight".to_string(),
            Array::ones(&[2], Dtype::F32),
        ),
        (
            "layers.1.attention.wq.weight".to_string(),
            Array::zeros(&[2], Dtype::F32),
        ),
        (
            "norm.weight".to_string(),
            Array::full(&[2], 3.0, Dtype::F32),
        ),
    ];
    let tree = Tree::unflatten(items.clone()).unwrap();
    let names: Vec<String> = tree.flatten().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        items.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
    );
    assert!(matches!(tree.get("layers"), Some(Tree::List(l)) if l.len() == 2));
    let doubled = tree.map(|_, a| a.mul_scalar(2.0)).unwrap();
    assert_eq!(
        doubled
            .get_array("norm.weight")
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![6.0, 6.0]
    );
    let summed = tree.zip_map(&doubled, |_, a, b| a.add(b)).unwrap();
    assert_eq!(
        summed
            .get_array("layers.0.attention.wq.weight")
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![3.0, 3.0]
    );
    let other = Tree::unflatten(vec![(
        "norm.bias".to_string(),
        Array::ones(&[2], Dtype::F32),
    )])
    .unwrap();
    let err = tree
        .zip_map(&other, |_, a, _| Ok(a.clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("layers") || err.contains("norm"), "{err}");
    assert!(
        Tree::unflatten(vec![
            ("a".to_string(), Array::ones(&[1], Dtype::F32)),
            ("a.b".to_string(), Array::ones(&[1], Dtype::F32))
        ])
        .is_err()
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tree.safetensors");
    save_tree(&p, &tree, None).unwrap();
    let back = load_tree(&p).unwrap();
    assert_eq!(back.flatten().len(), 3);
    assert_eq!(
        back.get_array("norm.weight")
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![3.0, 3.0]
    );
    mlx_array::eval(&back).unwrap();
}

#[test]
fn parts_read_one_block_along_any_axis_or_skip_a_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("parts.safetensors");
    // [2, 6, 3] counting up: element (i, j, k) is 18 i + 3 j + k.
    let v: Vec<f32> = (0..36).map(|x| x as f32).collect();
    let a = Array::from_slice(&v, &[2, 6, 3]).unwrap();
    let b = Array::from_slice(&[1u32, 2, 3, 4], &[4]).unwrap();
    save_safetensors(&path, &[("a".into(), a), ("b".into(), b)], None).unwrap();
    let (got, _) = mlx_array::load_safetensors_parts(&path, |name, shape| match name {
        "a" => {
            assert_eq!(shape, [2, 6, 3]);
            mlx_array::Part::Block {
                axis: 1,
                index: 2,
                parts: 3,
            }
        }
        _ => mlx_array::Part::Skip,
    })
    .unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(got["a"].shape(), [2, 2, 3]);
    let want: Vec<f32> = [0usize, 1]
        .iter()
        .flat_map(|&i| (4..6).flat_map(move |j| (0..3).map(move |k| (18 * i + 3 * j + k) as f32)))
        .collect();
    assert_eq!(got["a"].to_vec::<f32>().unwrap(), want);
    let e = mlx_array::load_safetensors_parts(&path, |_, _| mlx_array::Part::Block {
        axis: 0,
        index: 0,
        parts: 4,
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("tensor `a` of shape [2, 6, 3] has no block 0 of 4 along axis 0"),
        "{e}"
    );
}

/// A small file of three dtypes and ranks, as `save_safetensors` writes it.
fn valid_file_bytes(dir: &std::path::Path) -> Vec<u8> {
    let p = dir.join("valid.safetensors");
    save_safetensors(
        &p,
        &[
            ("w".into(), sample(Dtype::F32, 1)),
            ("b".into(), Array::from_slice(&[1i32, -2], &[2]).unwrap()),
            (
                "f".into(),
                Array::from_slice(&[mlx_array::Bool8(1), mlx_array::Bool8(0)], &[2]).unwrap(),
            ),
        ],
        Some(HashMap::from([("format".into(), "mlx".into())])),
    )
    .unwrap();
    std::fs::read(&p).unwrap()
}

/// Loads `bytes` as a file every way a reader does (whole, one block along
/// `axis`, a tree) and reads every array back; errors are fine, panics not.
fn load_every_way(dir: &std::path::Path, bytes: &[u8], axis: usize, parts: usize) {
    use mlx_array::io::{Part, load_safetensors_parts};
    let p = dir.join("fuzzed.safetensors");
    std::fs::write(&p, bytes).unwrap();
    let block = Part::Block {
        axis,
        index: parts - 1,
        parts,
    };
    for loaded in [
        load_safetensors(&p),
        load_safetensors_parts(&p, |_, _| block),
        load_tree(&p).map(|t| (t.flatten().into_iter().collect(), HashMap::new())),
    ] {
        for a in loaded.iter().flat_map(|(arrays, _)| arrays.values()) {
            a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Arbitrary bytes are arrays or an error (the fuzz target
    /// `safetensors` runs the same readers under coverage guidance).
    #[test]
    fn arbitrary_bytes_load_or_give_an_error(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        axis in 0usize..3,
        parts in 1usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        load_every_way(dir.path(), &bytes, axis, parts);
    }

    /// A valid file with bytes flipped or cut, and a header length field
    /// set to anything.
    #[test]
    fn mutated_files_load_or_give_an_error(
        flips in proptest::collection::vec((0usize..400, 1u8..=255), 1..4),
        cut in 0usize..400,
        header_len in proptest::option::of(proptest::prelude::any::<u64>()),
        axis in 0usize..3,
        parts in 1usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut b = valid_file_bytes(dir.path());
        for (at, x) in flips {
            let at = at % b.len();
            b[at] ^= x;
        }
        if let Some(n) = header_len {
            b[..8].copy_from_slice(&n.to_le_bytes());
        }
        b.truncate(cut.max(8));
        load_every_way(dir.path(), &b, axis, parts);
    }
}

/// A safetensors file of one float32 tensor of `shape` and no data, with
/// the header written by hand (what a hostile or corrupt file may say).
fn file_with_shape(shape: &[u64]) -> Vec<u8> {
    let header = format!(r#"{{"t":{{"dtype":"F32","shape":{shape:?},"data_offsets":[0,0]}}}}"#);
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b
}

/// Regression: an empty tensor (a dimension of 0) whose other dimensions
/// multiply past `usize` passed the parser, then overflowed (a panic)
/// computing its strides, or a block's offsets under
/// `load_safetensors_parts`; it is an error naming the tensor.
#[test]
fn an_empty_tensor_whose_dimensions_overflow_is_an_error() {
    use mlx_array::io::{Part, load_safetensors_parts};
    let dir = tempfile::tempdir().unwrap();
    for shape in [[0, 1 << 40, 1 << 40], [0, 1 << 62, 4]] {
        let p = dir.path().join("empty.safetensors");
        std::fs::write(&p, file_with_shape(&shape)).unwrap();
        let block = Part::Block {
            axis: 0,
            index: 0,
            parts: 1,
        };
        for err in [
            load_safetensors(&p).map(|_| ()).unwrap_err(),
            load_safetensors_parts(&p, |_, _| block)
                .map(|_| ())
                .unwrap_err(),
        ] {
            assert!(err.to_string().contains("`t`"), "{err}");
            assert!(err.to_string().contains("overflows"), "{err}");
        }
    }
    // An empty tensor of sensible dimensions still loads.
    let p = dir.path().join("fine.safetensors");
    std::fs::write(&p, file_with_shape(&[0, 3, 4])).unwrap();
    assert_eq!(load_safetensors(&p).unwrap().0["t"].shape(), &[0, 3, 4]);
}

/// A file written one array at a time is the file written at once, each
/// array is made once, in the file's order, and only while the one before
/// it is gone; without a path, the same arrays are made and nothing written.
#[test]
fn a_file_streamed_one_array_at_a_time_is_the_file_written_at_once() {
    use mlx_array::io::{TensorSpec, save_safetensors_streamed};
    let dir = tempfile::tempdir().unwrap();
    let arrays: Vec<(String, Array)> = [Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::F16]
        .iter()
        .enumerate()
        .flat_map(|(i, &d)| {
            let i = i as u64;
            [
                (format!("b{i}.{}", d.name()), sample(d, 2 * i)),
                (format!("a{i}.{}", d.name()), sample(d, 2 * i + 1)),
            ]
        })
        .collect();
    let meta: HashMap<String, String> = [("format".to_string(), "mlx".to_string())].into();
    let whole = dir.path().join("whole.safetensors");
    save_safetensors(&whole, &arrays, Some(meta.clone())).unwrap();
    let specs: Vec<TensorSpec> = arrays
        .iter()
        .map(|(n, a)| (n.clone(), a.shape().to_vec(), a.dtype()))
        .collect();
    let by_name: HashMap<&str, &Array> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let streamed = dir.path().join("streamed.safetensors");
    let mut made = Vec::new();
    save_safetensors_streamed(Some(&streamed), &specs, Some(meta.clone()), |name| {
        made.push(name.to_string());
        // A fresh array each time, as a gather makes one.
        by_name[name].add_scalar(0.0)?.astype(by_name[name].dtype())
    })
    .unwrap();
    assert_eq!(
        std::fs::read(&streamed).unwrap(),
        std::fs::read(&whole).unwrap()
    );
    // The file's order: by dtype as safetensors ranks them (descending), then by name.
    assert_eq!(made.len(), 8);
    assert_eq!(made[..2], ["a0.float32", "b0.float32"], "{made:?}");
    let mut again = Vec::new();
    save_safetensors_streamed(None, &specs, None, |name| {
        again.push(name.to_string());
        Ok(by_name[name].clone())
    })
    .unwrap();
    assert_eq!(again, made);
    // An array that is not its spec is an error, and no file appears.
    let bad = dir.path().join("bad.safetensors");
    let e = save_safetensors_streamed(Some(&bad), &specs, None, |_| {
        Ok(sample(Dtype::F32, 0).reshape(&[15]).unwrap())
    })
    .unwrap_err();
    assert!(e.to_string().contains("was declared"), "{e}");
    assert!(!bad.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no temporary file left"
    );
}
