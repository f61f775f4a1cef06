//! The CLI's dependencies are behind the default-on `cli` feature: an
//! embedder's `alkblobs = { default-features = false }` builds none of them.

use std::process::Command;

/// Crates only the binary needs (`humantime` is not one: the library's
/// lock file uses it too).
const CLI_ONLY: &[&str] = &[
    "clap",
    "indicatif",
    "dirs",
    "tracing-subscriber",
    "tempfile",
];

fn normal_deps(features: &[&str]) -> Vec<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let o = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", manifest])
        .args(["-p", "alkblobs", "-e", "normal", "--prefix", "none"])
        .args(features)
        .output()
        .expect("run cargo tree");
    assert!(
        o.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn an_embedder_without_default_features_builds_no_cli_dependency() {
    let embedded = normal_deps(&["--no-default-features"]);
    assert!(embedded.iter().any(|c| c == "rusqlite"), "{embedded:?}");
    for c in CLI_ONLY {
        assert!(!embedded.iter().any(|d| d == c), "{c} without `cli`");
    }
    // The default still has them, so the list above is not stale.
    let default = normal_deps(&[]);
    for c in CLI_ONLY {
        assert!(
            default.iter().any(|d| d == c),
            "{c} is not a CLI dependency"
        );
    }
}
