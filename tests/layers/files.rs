//! No two files of a crate name each other, directly or around a loop: a file may use a file
//! that does not use it back. This reads each file's code outside its tests (without comments,
//! `mod` declarations and `pub use` re-exports, which declare rather than use), takes every path
//! it names (`crate::`, `super::`, `self::`, and a module file's own children), resolves each to
//! the file that defines it (following a folder's re-exports to the child that holds the item),
//! and fails on a loop of files, or of modules of one parent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{ident, rust_files};

/// A file's module: `plan/cost/mod.rs` and `plan/cost.rs` are `plan::cost`, `lib.rs` the root.
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code a file compiles outside its tests, without comments, and the lines of it that
/// declare (`mod x;`, `pub use ...;`) rather than use.
fn code(src: &str) -> (String, String) {
    let before_tests = src.split("#[cfg(test)]").next().unwrap_or(src);
    let mut uses = String::new();
    let mut declares = String::new();
    let mut in_reexport = false;
    for line in before_tests.lines() {
        let line = line.split("//").next().unwrap_or("");
        let trimmed = line.trim_start();
        let starts_reexport = trimmed.starts_with("pub use ")
            || (trimmed.starts_with("pub(") && trimmed.contains(") use "));
        let declaration = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        if starts_reexport {
            in_reexport = true;
        }
        if in_reexport {
            declares.push_str(line);
            declares.push('\n');
            in_reexport = !line.contains(';');
        } else if !declaration {
            uses.push_str(line);
            uses.push('\n');
        }
    }
    (uses, declares)
}

/// The paths `s` spells from its start: `a::b` → `[a, b]`, `a::{b, c::d}` → `[a, b]`,
/// `[a, c, d]`.
fn paths_at(s: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = s;
    loop {
        let id = ident(rest);
        if id.is_empty() {
            break;
        }
        segments.push(id.to_string());
        rest = &rest[id.len()..];
        let Some(after) = rest.trim_start().strip_prefix("::") else {
            break;
        };
        rest = after.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut out = Vec::new();
            for item in group_items(group) {
                for tail in paths_at(item.trim()) {
                    out.push(segments.iter().cloned().chain(tail).collect());
                }
            }
            return if out.is_empty() { vec![segments] } else { out };
        }
    }
    vec![segments]
}

/// The paths `s` spells from its start, where it may open with a group: `{a, b::c}`.
pub(super) fn paths_after(s: &str) -> Vec<Vec<String>> {
    match s.trim_start().strip_prefix('{') {
        Some(group) => group_items(group)
            .into_iter()
            .flat_map(|item| paths_at(item.trim()))
            .collect(),
        None => paths_at(s),
    }
}

/// The top-level items of a group whose `{` came just before `s`, up to its `}`.
fn group_items(s: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&s[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// Every path `code` (of the file whose module is `module`) names, from the crate's root:
/// through `crate::`, `super::` and `self::`, and through `children` (the modules this file
/// declares), by their own names.
fn named_paths(code: &str, module: &[String], children: &[String]) -> Vec<Vec<String>> {
    let parent = &module[..module.len().saturating_sub(1)];
    let mut roots: Vec<(String, Vec<String>)> = vec![
        ("crate::".into(), Vec::new()),
        ("super::".into(), parent.to_vec()),
        ("self::".into(), module.to_vec()),
    ];
    roots.extend(children.iter().map(|c| (format!("{c}::"), module.to_vec())));
    let mut named = Vec::new();
    for (root, base) in &roots {
        // A child's name is its first segment; the others are only a base.
        let keep =
            if root.starts_with("crate") || root.starts_with("super") || root.starts_with("self") {
                ""
            } else {
                root.trim_end_matches("::")
            };
        let mut from = 0;
        while let Some(at) = code[from..].find(root.as_str()) {
            let at = from + at;
            from = at + root.len();
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            // `pub(super)`, `pub(crate)`, `pub(in ..)`: a visibility, not a path.
            if code[..at].ends_with("pub(") || code[..at].ends_with("in ") {
                continue;
            }
            for tail in paths_after(&code[from..]) {
                let mut path = base.clone();
                if !keep.is_empty() {
                    path.push(keep.to_string());
                }
                path.extend(tail);
                named.push(path);
            }
        }
    }
    named
}

/// One crate's files and what each names.
struct Crate {
    files: Vec<String>,
    /// Module path → its file.
    modules: BTreeMap<Vec<String>, usize>,
    /// (module, item) → the child module path its re-export takes the item from.
    reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
}

impl Crate {
    /// The file that defines what `path` names: the deepest module it passes through, or the
    /// child a folder re-exports the item from.
    fn resolve(&self, path: &[String], depth: usize) -> Option<usize> {
        for n in (0..=path.len()).rev() {
            let Some(&file) = self.modules.get(&path[..n]) else {
                continue;
            };
            if n < path.len()
                && depth < 8
                && let Some(target) = self.reexports.get(&(path[..n].to_vec(), path[n].clone()))
            {
                let deeper: Vec<String> = target.iter().chain(&path[n + 1..]).cloned().collect();
                return self.resolve(&deeper, depth + 1);
            }
            return Some(file);
        }
        None
    }
}

/// The crate at `src`'s files and, per file, the files it names.
fn file_graph(src: &str) -> (Vec<String>, Vec<BTreeSet<usize>>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let mut sources = Vec::new();
    rust_files(&root, &root, &mut sources);
    let files: Vec<String> = sources.iter().map(|(f, _)| f.clone()).collect();
    let modules = files
        .iter()
        .enumerate()
        .map(|(i, f)| (module_path(f), i))
        .collect();
    let mut krate = Crate {
        files,
        modules,
        reexports: BTreeMap::new(),
    };
    let mut parsed = Vec::new();
    for (file, text) in &sources {
        let module = module_path(file);
        let (uses, declares) = code(text);
        let children: Vec<String> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
                Some(name.to_string())
            })
            .collect();
        for export in declares.split(';') {
            let Some(at) = export.find(" use ") else {
                continue;
            };
            let spelled = export[at + " use ".len()..].trim();
            let spelled = spelled.strip_prefix("self::").unwrap_or(spelled);
            for path in paths_at(spelled) {
                if path.len() >= 2 && children.contains(&path[0]) {
                    let (item, from) = path.split_last().expect("two segments");
                    let target = module.iter().chain(from).cloned().collect();
                    krate
                        .reexports
                        .insert((module.clone(), item.clone()), target);
                }
            }
        }
        parsed.push(named_paths(&uses, &module, &children));
    }
    let edges: Vec<BTreeSet<usize>> = parsed
        .iter()
        .enumerate()
        .map(|(i, paths)| {
            paths
                .iter()
                .filter_map(|p| krate.resolve(p, 0))
                .filter(|&t| t != i)
                .collect()
        })
        .collect();
    (krate.files, edges)
}

/// The loops of `edges` between `names`: each a sorted list of two or more names.
fn cycles(names: &[String], edges: &[BTreeSet<usize>]) -> Vec<Vec<String>> {
    strongly_connected(edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|&i| names[i].clone()).collect();
            names.sort();
            names
        })
        .collect()
}

/// The loops of files in the crate at `src`: each a sorted list of two or more files.
fn loops(src: &str) -> Vec<Vec<String>> {
    let (files, edges) = file_graph(src);
    cycles(&files, &edges)
}

/// The loops of modules in the crate at `src`: modules of one parent (`strategy::ddp` and
/// `strategy::pipeline`, or two files of one folder) that name each other through any of
/// their files, each a sorted list of module paths. A parent and its children are not
/// siblings: a folder's `mod.rs` declaring what its children share is the usual shape.
fn module_loops(src: &str) -> Vec<Vec<String>> {
    let (files, file_edges) = file_graph(src);
    let paths: Vec<Vec<String>> = files.iter().map(|f| module_path(f)).collect();
    /// `name`'s index in `names`, added if new.
    fn node(name: String, names: &mut Vec<String>) -> usize {
        match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name);
                names.len() - 1
            }
        }
    }
    let mut names: Vec<String> = Vec::new();
    let mut pairs = Vec::new();
    for (from, targets) in file_edges.iter().enumerate() {
        for &to in targets {
            let (a, b) = (&paths[from], &paths[to]);
            let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            if common < a.len() && common < b.len() {
                let a = node(a[..=common].join("::"), &mut names);
                let b = node(b[..=common].join("::"), &mut names);
                pairs.push((a, b));
            }
        }
    }
    let mut edges = vec![BTreeSet::new(); names.len()];
    for (a, b) in pairs {
        edges[a].insert(b);
    }
    cycles(&names, &edges)
}

/// Tarjan's strongly connected components of the graph `edges`.
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

fn check(src: &str) {
    let found = loops(src);
    assert!(
        found.is_empty(),
        "{src}: files that name each other (move what both need into a file below both): {found:?}"
    );
    let found = module_loops(src);
    assert!(
        found.is_empty(),
        "{src}: modules of one parent that name each other (move what both need into a module \
         below both): {found:?}"
    );
}

#[test]
fn no_two_files_or_modules_of_a_crate_name_each_other() {
    for src in [
        "crates/kiln-collective/src",
        "crates/kiln-core/src",
        "crates/kiln-planner/src",
        "crates/kiln-cli/src",
    ] {
        check(src);
    }
}

#[test]
fn paths_are_read_in_groups_and_resolved_through_re_exports() {
    assert_eq!(
        paths_at("a::{b, c::{d, e}} rest"),
        [vec!["a", "b"], vec!["a", "c", "d"], vec!["a", "c", "e"]]
    );
    let module = ["plan".to_string(), "cost".to_string()];
    let named = named_paths(
        "use super::auto::X; use super::{Y, z::Z}; pub(super) fn f() { search::run(); crate::world::W; }",
        &module,
        &["search".to_string()],
    );
    assert_eq!(
        named,
        [
            vec!["world", "W"],
            vec!["plan", "auto", "X"],
            vec!["plan", "Y"],
            vec!["plan", "z", "Z"],
            vec!["plan", "cost", "search", "run"]
        ]
    );
    assert_eq!(module_path("plan/cost/mod.rs"), ["plan", "cost"]);
    assert!(module_path("lib.rs").is_empty());
}
