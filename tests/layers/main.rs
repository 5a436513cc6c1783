//! kiln-core's and kiln-cli's modules stand in layers: each may name only the modules below
//! it. This test reads every `crate::` path in each crate's `src/` (in `use` lines and inline,
//! `crate::{a, b::c}` groups included) and fails on one that names a module above its own.
//! Within a module, no two files may name each other either ([`files`]).
//!
//! Below kiln-core stands the crate kiln-collective ([`COLLECTIVE`]: the statistics of
//! repeated timings, then World, Mesh and the launcher environment, then the collectives,
//! in-process and MPI); the build keeps kiln-core out of it. kiln-core re-exports its modules
//! as `crate::stats`, `crate::world` and `crate::collective`, which every layer here may name.
//!
//! kiln-core's order, from the bottom ([`CORE`]):
//!
//! ```text
//! cuda, output, memory     device facts, a step's output, the counted allocator
//! data, params, grads, stages, tensor_parallel
//! model                    the contracts a model implements
//! optim                    guards, precision, optimizer state, the guarded step
//! plan                     strategy kinds and settings (`*Config`, `ConfigError`), a request
//!                          resolved into a Plan, auto's choice and the cost model
//! strategy                 the strategies and their rank runtime
//! checkpoint               folders, manifests, saving and opening
//! fit, learner             the training loop, burn-train's Learner
//! ```
//!
//! Above kiln-core stands the crate kiln-planner, the measuring planner: it builds and times
//! real strategies, and the build keeps kiln-core from naming it. Its own order is
//! [`PLANNER`].
//!
//! kiln-cli's ([`CLI`]): the shared pieces (names, outputs, signals, the allocator, the Hub
//! cache, config files, backends, a launched run's environment, the flag groups), then the run
//! configuration every subcommand shares (`run_config`), the auto-planning service
//! (`planning`), and the subcommands, of which only `export` uses another (`finetune`'s model
//! loading).
//!
//! [`CORE_UPWARD`] lists the upward imports that are still there, each with what it names. The
//! test fails when a new one appears, and when a listed one is gone (so that the list only
//! shrinks). `super::` paths are read where they name the crate root: in a top-level file (or a
//! folder's `mod.rs`) outside its test module; deeper, they stay inside their module.

use std::collections::BTreeSet;
use std::path::Path;

mod files;

/// kiln-core's top-level modules, lowest first. A module may name only those before it.
const CORE: &[&str] = &[
    "cuda",
    "output",
    "memory",
    "data",
    "params",
    "grads",
    "stages",
    "tensor_parallel",
    "model",
    "optim",
    "plan",
    "strategy",
    "checkpoint",
    "fit",
    "learner",
];

/// kiln-planner's top-level modules, lowest first: the timing harness, then the memory fit and
/// the link probe that time steps with it, then the planners built from all three.
const PLANNER: &[&str] = &["measure", "memory_fit", "probe", "construct"];

/// kiln-collective's top-level modules, lowest first.
const COLLECTIVE: &[&str] = &["stats", "world", "collective"];

/// kiln-cli's top-level modules, lowest first.
const CLI: &[&str] = &[
    "names",
    "outputs",
    "signals",
    "allocator",
    "hub",
    "config_file",
    "backend",
    "launched",
    "checkpoint_args",
    "optimizer_args",
    "parallel_args",
    "run_config",
    "planning",
    "generate",
    "finetune",
    "export",
    "train",
    "ad",
    "plan",
    "bench",
    "launch",
];

/// kiln-core's upward imports not yet moved: `(file under src/, the module it names)`.
const CORE_UPWARD: &[(&str, &str)] = &[];

/// The top-level module a file under `src/` belongs to (`plan` for `plan/measure/ranks.rs`).
fn module_of(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The top-level modules `src` names through `crate::`, with the line of each. In a file of the
/// crate's top level (`probe.rs`, or a folder's `mod.rs`), `super::` names the crate root too,
/// up to its test module, whose `super::` is the file itself.
fn named_modules(src: &str, top_level: bool) -> Vec<(usize, String)> {
    // Comments out and lines kept, so that a position's line is its line in `src`.
    let code = src
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let tests_start = code.find("#[cfg(test)]").unwrap_or(code.len());
    let roots: &[(&str, usize)] = if top_level {
        &[("crate::", usize::MAX), ("super::", tests_start)]
    } else {
        &[("crate::", usize::MAX)]
    };
    let mut named = Vec::new();
    for &(root, end) in roots {
        for (at, _) in code[..end.min(code.len())].match_indices(root) {
            let line = code[..at].matches('\n').count();
            // One head per item: `world::{Mesh, World}` is two paths through one module.
            let mut heads: Vec<String> = files::paths_after(&code[at + root.len()..])
                .into_iter()
                .filter_map(|path| path.into_iter().next())
                .collect();
            heads.dedup();
            named.extend(heads.into_iter().map(|head| (line, head)));
        }
    }
    // Line by line, as the file reads (a stable sort keeps each line's paths in order).
    named.sort_by_key(|&(line, _)| line);
    named
}

/// Whether `file` (under `src/`) is at the crate's top level, where `super::` is the root.
fn top_level(file: &str) -> bool {
    !file.contains('/') || file.matches('/').count() == 1 && file.ends_with("/mod.rs")
}

/// The leading identifier of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src/ reads")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(root)
                .expect("under src/")
                .to_string_lossy()
                .replace('\\', "/");
            out.push((name, std::fs::read_to_string(&path).expect("a source file")));
        }
    }
}

/// Checks the crate whose sources are in `src` (relative to the workspace) against `order`,
/// allowing the `known` upward imports and no other.
fn check_layers(src: &str, root_file: &str, order: &[&str], known: &[(&str, &str)]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    let rank = |m: &str| order.iter().position(|&o| o == m);

    let mut upward = BTreeSet::new();
    let mut unplaced = BTreeSet::new();
    for (file, text) in &files {
        if file == root_file {
            continue;
        }
        let own = module_of(file);
        let Some(own_rank) = rank(own) else {
            unplaced.insert(own.to_string());
            continue;
        };
        for (line, named) in named_modules(text, top_level(file)) {
            match rank(&named) {
                Some(r) if r > own_rank => {
                    upward.insert((file.clone(), named, line + 1));
                }
                // `crate::` followed by an item of the crate root (a re-export) or a macro.
                _ => {}
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "{src}: modules missing from its order in tests/layers/main.rs (place each in its layer): \
         {unplaced:?}"
    );

    let found: BTreeSet<(&str, &str)> = upward
        .iter()
        .map(|(f, m, _)| (f.as_str(), m.as_str()))
        .collect();
    let new: Vec<String> = upward
        .iter()
        .filter(|(f, m, _)| !known.contains(&(f.as_str(), m.as_str())))
        .map(|(f, m, line)| format!("{src}/{f}:{line} names `crate::{m}`"))
        .collect();
    assert!(
        new.is_empty(),
        "imports that run up the layers (the order is in tests/layers/main.rs; name a module below, \
         or move the item down):\n{}",
        new.join("\n")
    );
    let gone: Vec<_> = known
        .iter()
        .filter(|known| !found.contains(*known))
        .collect();
    assert!(
        gone.is_empty(),
        "{src}: these upward imports are gone: take them out of tests/layers/main.rs: {gone:?}"
    );
}

#[test]
fn every_kiln_core_module_names_only_the_layers_below_it() {
    check_layers("crates/kiln-core/src", "lib.rs", CORE, CORE_UPWARD);
}

#[test]
fn every_kiln_collective_module_names_only_the_layers_below_it() {
    check_layers("crates/kiln-collective/src", "lib.rs", COLLECTIVE, &[]);
}

#[test]
fn every_kiln_planner_module_names_only_the_layers_below_it() {
    check_layers("crates/kiln-planner/src", "lib.rs", PLANNER, &[]);
}

#[test]
fn every_kiln_cli_module_names_only_the_layers_below_it() {
    check_layers("crates/kiln-cli/src", "main.rs", CLI, &[]);
}

#[test]
fn the_reader_finds_paths_in_groups_and_inline() {
    let src = "use crate::{plan::Plan, world::{Mesh, World}};\n\
               use crate::{\n    collective::Link,\n    optim,\n};\n\
               let n = crate::memory::SLOTS; // crate::fit in a comment\n";
    let names: Vec<String> = named_modules(src, false)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(names, ["plan", "world", "collective", "optim", "memory"]);
    // A top-level file's `super::` is the crate root, but not in its test module.
    let top = "use super::measure::MeasureError;\n#[cfg(test)]\nmod tests { use super::probe; }\n";
    let names: Vec<String> = named_modules(top, true)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(names, ["measure"]);
    assert!(top_level("probe.rs") && top_level("strategy/mod.rs"));
    assert!(!top_level("plan/cost/mod.rs") && !top_level("measure/ranks.rs"));
    assert_eq!(module_of("plan/measure/ranks.rs"), "plan");
    assert_eq!(module_of("params.rs"), "params");
}
