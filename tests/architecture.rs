//! The import rules of `docs/architecture.md`, read from the code: modules only use modules on
//! lower layers (so there is no cycle), a stage never uses another stage or the broker, and only
//! the broker module speaks AMQP.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn layers() -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string("docs/architecture.md").unwrap();
    let block = doc
        .split("<!-- layers:begin -->")
        .nth(1)
        .unwrap()
        .split("<!-- layers:end -->")
        .next()
        .unwrap();
    let lines: Vec<&str> =
        block.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("```")).collect();
    let mut out = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        for module in line.split_whitespace() {
            out.insert(module.to_owned(), lines.len() - i);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments (doc links name modules without using them).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules a file names as `crate::x` (including `crate::{x, y}`).
fn used_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let name: String =
                    part.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.insert(name);
            }
        } else {
            out.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix("src").unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_owned()
}

fn sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(Path::new("src"), &mut files);
    files.retain(|f| !matches!(module_of(f).as_str(), "lib" | "main"));
    files
}

/// The modules `lib.rs` declares.
fn declared_modules() -> BTreeSet<String> {
    code(Path::new("src/lib.rs"))
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .filter_map(|rest| rest.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// Every module is in the map of `docs/architecture.md` with a line on what it owns, and the
/// map names no module that is gone.
#[test]
fn the_module_map_lists_every_module() {
    let doc = std::fs::read_to_string("docs/architecture.md").unwrap();
    let map = doc.split("<!-- map:begin -->").nth(1).unwrap().split("<!-- map:end -->").next();
    let mut mapped = BTreeSet::new();
    for row in map.unwrap().lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(cells.len() >= 3 && cells[2].len() > 10, "a line on what it owns: {row}");
        mapped.insert(cells[1].trim_matches('`').to_owned());
    }
    let declared = declared_modules();
    assert!(declared.len() >= 20, "lib.rs read: {declared:?}");
    let missing: Vec<_> = declared.difference(&mapped).collect();
    let gone: Vec<_> = mapped.difference(&declared).collect();
    assert!(missing.is_empty() && gone.is_empty(), "missing {missing:?}, gone {gone:?}");
}

#[test]
fn modules_only_use_lower_layers() {
    let layers = layers();
    let mut wrong = Vec::new();
    for file in sources() {
        let module = module_of(&file);
        let Some(&level) = layers.get(&module) else {
            wrong.push(format!(
                "{}: module `{module}` is on no layer of docs/architecture.md",
                file.display()
            ));
            continue;
        };
        for used in used_modules(&code(&file)) {
            if used == module {
                continue;
            }
            match layers.get(&used) {
                Some(&l) if l < level => {}
                Some(_) => wrong.push(format!(
                    "{}: `{module}` uses `{used}`, which is not below it",
                    file.display()
                )),
                None => {
                    wrong.push(format!("{}: uses `{used}`, which is on no layer", file.display()))
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports against docs/architecture.md:\n{}", wrong.join("\n"));
}

#[test]
fn a_stage_uses_no_other_stage_and_not_the_broker() {
    let registry = code(Path::new("src/stages/mod.rs"));
    let stages: Vec<String> = registry
        .lines()
        .filter_map(|l| {
            l.trim().strip_prefix("pub mod ").map(|m| m.trim_end_matches(';').to_owned())
        })
        .collect();
    assert!(stages.len() >= 5, "the registry declares the stage modules: {stages:?}");
    let mut wrong = Vec::new();
    for stage in &stages {
        // A stage is one file, or a directory of them.
        let file = PathBuf::from(format!("src/stages/{stage}.rs"));
        let (path, text) = if file.exists() {
            let text = code(&file);
            (file, text)
        } else {
            let dir = PathBuf::from(format!("src/stages/{stage}"));
            let mut files = Vec::new();
            rust_files(&dir, &mut files);
            assert!(!files.is_empty(), "no stage module {}", dir.display());
            (dir, files.iter().map(|f| code(f)).collect::<Vec<_>>().join("\n"))
        };
        for other in stages.iter().filter(|o| *o != stage) {
            for needle in [format!("super::{other}"), format!("stages::{other}")] {
                if text.contains(&needle) {
                    wrong.push(format!("{}: uses the stage `{other}`", path.display()));
                }
            }
        }
        if text.contains("crate::broker") || text.contains("lapin") {
            wrong.push(format!("{}: uses the broker", path.display()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn only_the_broker_module_speaks_amqp() {
    let users: Vec<String> = sources()
        .into_iter()
        .filter(|f| module_of(f) != "broker" && code(f).contains("lapin"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(users.is_empty(), "lapin outside src/broker: {users:?}");
}

/// SQL the compiler does not check, outside the two places that need it: a statement the
/// macros cannot make one-shot (store/cancel.rs) and dropping the demo's database (cli/demo.rs).
/// Everything else is `sqlx::query!` and its kin, checked against `.sqlx/`
/// (tests/stored_queries.rs).
fn unchecked_sql(file: &Path, code: &str) -> usize {
    let runtime = ["sqlx::query(", "sqlx::query_as(", "sqlx::query_scalar(", "sqlx::query_as::<"];
    let n = runtime.iter().map(|r| code.matches(r).count()).sum::<usize>()
        + code.matches("sqlx::query_scalar::<").count();
    let allowed = usize::from(file.ends_with("store/cancel.rs") || file.ends_with("cli/demo.rs"));
    n.saturating_sub(allowed)
}

#[test]
fn every_statement_is_checked_at_compile_time() {
    let unchecked: Vec<String> = sources()
        .into_iter()
        .filter(|f| unchecked_sql(f, &code(f)) > 0)
        .map(|f| f.display().to_string())
        .collect();
    assert!(unchecked.is_empty(), "SQL not checked at compile time in {unchecked:?}");
    // The rule itself, on code it must flag.
    assert_eq!(unchecked_sql(Path::new("src/store/x.rs"), "sqlx::query_as::<_, (i32,)>(s)"), 1);
    assert_eq!(unchecked_sql(Path::new("src/store/cancel.rs"), "sqlx::query_as(s)"), 0);
}

#[test]
fn the_checker_sees_what_it_must() {
    // The parser itself, on code it must flag: a rule that finds nothing proves nothing.
    let used = used_modules("use crate::{store::Store, broker};\nlet x = crate::stages::chain();");
    assert_eq!(used.into_iter().collect::<Vec<_>>(), ["broker", "stages", "store"]);
    assert!(layers()["stages"] > layers()["store"] && layers()["store"] > layers()["contracts"]);
}

/// The sibling files (or directories) a file of `dir` uses through `super::<name>`: its edges in
/// the module's file graph. `mod.rs`, the parent every child uses, is not a node.
fn sibling_uses(dir: &Path, file: &Path) -> BTreeSet<String> {
    let siblings: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "mod")
        .collect();
    let code = code(file);
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("super::") {
        let name: String = code[i + "super::".len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if siblings.contains(&name) {
            out.insert(name);
        }
    }
    out
}

/// A circle of files that use each other in `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].to_vec());
        }
        if !done.insert(node.to_owned()) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Within a module directory, files use each other one way: no circle of `super::` uses
/// (`assemble/history` and `state`, `broker/runtime`, `lanes` and `settle`, ... were opened by
/// giving the piece both used a file of its own).
#[test]
fn the_files_of_a_module_use_each_other_one_way() {
    let mut dirs = Vec::new();
    let mut stack = vec![PathBuf::from("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path.clone());
                dirs.push(path);
            }
        }
    }
    let mut circles = Vec::new();
    for dir in &dirs {
        let mut graph = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if name == "mod" || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            graph.insert(name, sibling_uses(dir, &path));
        }
        if let Some(c) = circle(&graph) {
            circles.push(format!("{}: {}", dir.display(), c.join(" -> ")));
        }
    }
    assert!(dirs.len() > 10, "module directories read: {dirs:?}");
    assert!(circles.is_empty(), "files that use each other:\n{}", circles.join("\n"));
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert!(circle(&graph(&[("a", "b"), ("b", "c")])).is_none());
    let found = circle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
    assert_eq!(found.len(), 3);
}
