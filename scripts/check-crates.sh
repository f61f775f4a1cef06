#!/usr/bin/env bash
# The published crates: what their packages hold, and that they publish.
# For each of alkblobs-core and alkblobs: the package lists its README and
# both licences and no tests or test data; then `cargo publish --dry-run`
# of both (packaging, the path dependencies replaced by versions, and a
# build of each package as crates.io would see it). Exits non-zero on any
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."
for crate in alkblobs-core alkblobs; do
    list=$(cargo package -p "$crate" --list --allow-dirty 2>/dev/null)
    for need in README.md LICENSE-MIT LICENSE-APACHE Cargo.toml src/lib.rs; do
        grep -qx "$need" <<<"$list" || { echo "$crate: the package lacks $need" >&2; exit 1; }
    done
    if grep -E '^(tests|benches|target|docs|sql|scripts)/' <<<"$list"; then
        echo "$crate: the package holds the files above, which are not for publishing" >&2
        exit 1
    fi
    echo "$crate: $(wc -l <<<"$list") files, README and licences in, no tests"
done
cargo publish --dry-run --allow-dirty -p alkblobs-core -p alkblobs
