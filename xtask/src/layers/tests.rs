//! The tool on small source trees, and on the workspace itself.

use super::check::{Resolver, check, circle_edges};
use super::source::{Crate, from_texts};
use super::table::CrateRules;

fn read(files: &[(&str, &str)], tests: bool) -> Crate {
    let owned: Vec<(String, String)> = files
        .iter()
        .map(|(r, t)| (r.to_string(), t.to_string()))
        .collect();
    from_texts(&owned, tests).expect("the tree parses")
}

/// The violations of `rules` (TOML) in the tree `files`, as `file:line: what`.
fn found(files: &[(&str, &str)], rules: &str) -> Vec<String> {
    let rules: CrateRules = toml::from_str(rules).expect("the rules parse");
    check(&read(files, rules.check_tests), &rules, "src/")
        .iter()
        .map(|v| v.to_string())
        .collect()
}

/// The `file:line` of each violation.
fn lines(files: &[(&str, &str)], rules: &str) -> Vec<String> {
    found(files, rules)
        .iter()
        .map(|v| v.splitn(3, ':').take(2).collect::<Vec<_>>().join(":"))
        .collect()
}

const BACKEND_TREE: &[(&str, &str)] = &[
    (
        "lib.rs",
        "pub mod backend;\npub mod primitives;\npub use backend::cpu::blas;\n",
    ),
    ("backend/mod.rs", "pub mod cpu;\npub mod gpu;\n"),
    ("backend/gpu/mod.rs", ""),
    ("backend/cpu/mod.rs", "mod matmul;\npub use matmul::blas;\n"),
    ("backend/cpu/matmul/mod.rs", "pub mod blas;\n"),
    ("backend/cpu/matmul/blas.rs", "pub fn sgemm() {}\n"),
    ("primitives/mod.rs", "pub fn add() {}\npub mod binary;\n"),
    ("primitives/binary.rs", "pub fn mul() {}\n"),
];

const FORBID: &str = r#"
[[forbid]]
from = ["backend"]
to = ["primitives"]
why = "a backend imports the primitives"

[[forbid]]
from = ["backend::gpu"]
to = ["backend::cpu"]
why = "the GPU backend imports the CPU backend"
"#;

fn with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    // An extra file replaces the tree's of the same path.
    BACKEND_TREE
        .iter()
        .filter(|(r, _)| extra.iter().all(|(e, _)| e != r))
        .chain(extra)
        .copied()
        .collect()
}

#[test]
fn a_forbidden_import_is_found_in_every_form() {
    let src = "use crate::primitives::add;\n\
               use crate::{backend, primitives::binary::mul};\n\
               use super::super::primitives as p;\n\
               fn f() {\n\
               \x20   crate::primitives::add();\n\
               \x20   let _ = format!(\"{:?}\", crate::primitives::binary::mul());\n\
               \x20   p::add();\n\
               }\n\
               macro_rules! m { () => { $crate::primitives::add() }; }\n\
               fn g() -> std::fmt::Result { Ok(()) }\n\
               fn h() { self::inner::x(); }\n\
               mod inner { pub fn x() { super::super::super::primitives::add(); } }\n";
    let files = with(&[("backend/gpu/mod.rs", src)]);
    assert_eq!(
        lines(&files, FORBID),
        [1, 2, 3, 5, 6, 7, 9, 12].map(|l| format!("src/backend/gpu/mod.rs:{l}"))
    );
    let all = found(&files, FORBID);
    assert!(
        all.iter()
            .all(|v| v.ends_with("a backend imports the primitives")),
        "{all:#?}"
    );
    // The same paths from the primitives break nothing.
    let fine = src.replace("super::super::primitives", "crate::primitives");
    let files = with(&[("backend/gpu/mod.rs", ""), ("primitives/user.rs", &fine)]);
    assert_eq!(found(&files, FORBID), Vec::<String>::new());
}

#[test]
fn comments_and_strings_are_not_paths() {
    let src = "// use crate::primitives::add;\n\
               /* crate::primitives::add(); /* nested crate::primitives::x */ */\n\
               /// Calls [`crate::primitives::add`].\n\
               fn f() -> &'static str {\n\
               \x20   let _c = '\"';\n\
               \x20   let _s = \"crate::primitives::add()\";\n\
               \x20   r#\"use crate::primitives; \"quoted\" \"#\n\
               }\n\
               #[doc = \"crate::primitives::add\"]\n\
               fn g() { let _ = b\"crate::primitives\"; }\n";
    let files = with(&[("backend/gpu/mod.rs", src)]);
    assert_eq!(found(&files, FORBID), Vec::<String>::new());
}

#[test]
fn a_pub_use_reexport_is_followed() {
    // `crate::blas` is the root's re-export of the CPU backend's, which is
    // matmul's: the GPU backend reaches the CPU one through both.
    let src = "fn f() { crate::blas::sgemm(); }\nuse crate::backend::cpu::blas as b;\n";
    let files = with(&[("backend/gpu/mod.rs", src)]);
    let all = found(&files, FORBID);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all[0].starts_with("src/backend/gpu/mod.rs:1: `crate::blas::sgemm` (through a `use`, backend::cpu::matmul::blas)"),
        "{all:#?}"
    );
    assert!(
        all[1].starts_with("src/backend/gpu/mod.rs:2: `crate::backend::cpu::blas` (backend::cpu)"),
        "{all:#?}"
    );
    let krate = read(&files, false);
    let r = Resolver::new(&krate);
    let blas = r.resolve(&["crate".into(), "blas".into()], &[]).unwrap();
    assert_eq!(
        r.through_uses(&blas).join("::"),
        "backend::cpu::matmul::blas"
    );
}

#[test]
fn an_import_circle_is_found_and_can_be_allowed() {
    let files = [
        ("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n"),
        ("a.rs", "use crate::b::x;\npub fn y() {}\n"),
        ("b.rs", "pub fn x() {}\nfn f() { super::c::z(); }\n"),
        ("c.rs", "pub fn z() { crate::a::y(); }\n"),
        // A parent and its children are one: no circle with d::e.
        ("d/mod.rs", "mod e;\npub fn w() { e::v(); }\n"),
        ("d/e.rs", "pub fn v() { super::w(); }\n"),
    ];
    let all = found(&files, "");
    assert_eq!(all.len(), 1, "{all:#?}");
    assert!(
        all[0].starts_with("src/a.rs:1: import circle a -> b -> c -> a (each step at src/a.rs:1, src/b.rs:2, src/c.rs:1;"),
        "{all:#?}"
    );
    // `xtask layers --circles` lists each circle with its edges.
    assert_eq!(
        circle_edges(&read(&files, false), "src/"),
        [
            "circle: a, b, c",
            "  a -> b (src/a.rs:1)",
            "  b -> c (src/b.rs:2)",
            "  c -> a (src/c.rs:1)"
        ]
    );
    let allowed = "[[circles]]\nmodules = [\"a\", \"b\", \"c\"]\nwhy = \"a test\"\n";
    assert_eq!(found(&files, allowed), Vec::<String>::new());
    // An allowance no circle needs, or without a why, is itself reported.
    let stale = "[[circles]]\nmodules = [\"d\"]\nwhy = \"x\"\n[[circles]]\nmodules = [\"a\", \"b\", \"c\"]\nwhy = \"\"\n";
    let all = found(&files, stale);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all.iter().any(|v| v.contains("among d is no longer there")),
        "{all:#?}"
    );
    assert!(
        all.iter().any(|v| v.contains("allowed without a why")),
        "{all:#?}"
    );
    // Only the modules named: a circle of a, b and c is not covered by a and b.
    let partial = "[[circles]]\nmodules = [\"a\", \"b\"]\nwhy = \"x\"\n";
    assert!(
        found(&files, partial)
            .iter()
            .any(|v| v.contains("import circle a -> b -> c -> a"))
    );
}

#[test]
fn layers_point_one_way_and_the_root_reexports_count_as_their_module() {
    let layers = r#"layers = [["error"], ["transports"], ["collectives"], ["crate"]]"#;
    let base = [
        (
            "lib.rs",
            "pub mod error;\npub mod transports;\npub mod collectives;\npub use collectives::all_sum;\npub fn top() {}\n",
        ),
        ("error.rs", "pub struct Error;\n"),
        ("collectives/mod.rs", "mod ring;\npub use ring::all_sum;\n"),
        (
            "collectives/ring.rs",
            "use crate::error::Error;\npub fn all_sum() {}\n",
        ),
    ];
    let tcp = "use crate::error::Error;\npub fn send() {}\nfn f() { crate::all_sum(); }\nfn g() { crate::top(); }\n";
    let files: Vec<_> = base
        .iter()
        .copied()
        .chain([("transports/mod.rs", tcp)])
        .collect();
    let all = found(&files, layers);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(all[0].starts_with("src/transports/mod.rs:3: `crate::all_sum` (through a `use`, collectives::ring): transports imports a higher layer"), "{all:#?}");
    assert!(
        all[1].starts_with("src/transports/mod.rs:4: `crate::top` (crate): transports"),
        "{all:#?}"
    );
}

#[test]
fn only_rules_and_feature_gates() {
    let rules = r#"
[[only]]
from = ["settings"]
to = ["error", "settings"]
why = "the settings are a leaf"

[[features]]
feature = "gpu"
only_in = ["backend"]
why = "gpu feature outside the backend"
"#;
    let files = [
        (
            "lib.rs",
            "pub mod settings;\npub mod error;\npub mod device;\npub mod backend;\n#[cfg(feature = \"gpu\")]\nfn a() {}\n",
        ),
        (
            "settings.rs",
            "use crate::error::Error;\nmod parse;\nfn f() { parse::x(); crate::device::default(); }\n",
        ),
        ("settings/parse.rs", "pub fn x() {}\n"),
        ("error.rs", "pub struct Error;\n"),
        (
            "device.rs",
            "pub fn default() { if cfg!(not(feature = \"gpu\")) {} }\n#[cfg_attr(feature = \"gpu\", derive(Debug))]\nstruct D;\n",
        ),
        (
            "backend/mod.rs",
            "#[cfg_attr(not(feature = \"gpu\"), path = \"no_gpu.rs\")]\npub mod gpu;\n#[cfg(feature = \"gpu\")]\nfn b() {}\n",
        ),
        (
            "backend/no_gpu.rs",
            "#[cfg(feature = \"gpu\")]\nfn c() {}\n",
        ),
    ];
    assert_eq!(
        lines(&files, rules),
        [
            "src/device.rs:1",
            "src/device.rs:2",
            "src/lib.rs:5",
            "src/settings.rs:3"
        ]
    );
    // no_gpu.rs is mounted as backend::gpu: the gate there is in the backend.
    let krate = read(&files, false);
    let no_gpu = krate
        .files
        .iter()
        .find(|f| f.rel == "backend/no_gpu.rs")
        .unwrap();
    assert_eq!(no_gpu.module, ["backend", "gpu"]);
}

#[test]
fn test_code_counts_only_when_asked() {
    let files = with(&[
        (
            "backend/gpu/mod.rs",
            "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nfn t() { crate::primitives::add(); }\n",
        ),
        ("backend/gpu/tests.rs", "use crate::primitives::add;\n"),
    ]);
    assert_eq!(found(&files, FORBID), Vec::<String>::new());
    let checked = format!("check_tests = true\n{FORBID}");
    assert_eq!(
        lines(&files, &checked),
        ["src/backend/gpu/mod.rs:4", "src/backend/gpu/tests.rs:1"]
    );
}

#[test]
fn a_pattern_naming_no_module_is_reported() {
    let rules = "[[forbid]]\nfrom = [\"backend::gpu\"]\nto = [\"backend::metal\"]\nwhy = \"x\"\n";
    let all = found(BACKEND_TREE, rules);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert!(
        all[0].contains("`backend::metal` (in forbid) names no module"),
        "{all:#?}"
    );
}

/// The workspace keeps every crate's table (what `cargo xtask test` checks
/// first), and the tool reads the real trees as the table assumes.
#[test]
fn the_workspace_keeps_its_layers() {
    let root = crate::util::root();
    let found = super::check_workspace(&root).expect("the workspace is read");
    assert!(
        found.is_empty(),
        "{} violation(s) of layers.toml:\n{}",
        found.len(),
        found
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let krate = super::source::read(&root.join("mlx-array/src"), true).unwrap();
    for m in [
        &["backend", "gpu"][..],
        &["backend", "cpu"],
        &["primitives"],
        &["array"],
    ] {
        assert!(
            krate.file_modules.iter().any(|f| f == m),
            "mlx-array has no {m:?}: the check would see nothing"
        );
    }
    let r = Resolver::new(&krate);
    let blas = r.resolve(&["crate".into(), "blas".into()], &[]).unwrap();
    assert_eq!(
        r.through_uses(&blas).join("::"),
        "backend::cpu::matmul::blas",
        "crate::blas does not lead to the BLAS module: the layer check misreads the tree"
    );
}
