//! The providers' files import each other top-down only. Each provider's module
//! documentation has a "Layout" map, one line per layer, top first; a file may name
//! (`super::x`) only files on lines below its own, never a file of its own line, one above,
//! or its parent module. A file not on the map fails the check, so a new one gets placed.

use std::collections::HashMap;
use std::path::Path;

/// The layers of `dir`'s map, top first, and every file of `dir` (but `mod.rs`, `tests.rs`).
fn layers(dir: &Path) -> (Vec<Vec<String>>, Vec<String>) {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".rs").map(str::to_string))
        .filter(|n| n != "mod" && n != "tests")
        .collect();
    files.sort();
    let doc = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    let mut lines = doc.lines().skip_while(|l| !l.contains("# Layout")).skip_while(|l| !l.contains("```text"));
    lines.next();
    let mut map = Vec::new();
    for l in lines.take_while(|l| !l.contains("```")) {
        let names: Vec<String> = l
            .trim_start_matches("//!")
            .split_whitespace()
            .take_while(|t| files.iter().any(|f| f == t))
            .map(str::to_string)
            .collect();
        if !names.is_empty() {
            map.push(names);
        }
    }
    (map, files)
}

fn check(provider: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fabric").join(provider);
    let (map, files) = layers(&dir);
    let level: HashMap<&str, usize> =
        map.iter().enumerate().flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i))).collect();
    let mut wrong = Vec::new();
    for f in &files {
        let Some(&mine) = level.get(f.as_str()) else {
            wrong.push(format!("{f}.rs is not on the layout map of {provider}/mod.rs"));
            continue;
        };
        let src = std::fs::read_to_string(dir.join(format!("{f}.rs"))).unwrap();
        for (_, rest) in src.match_indices("super::").map(|(i, _)| ((), &src[i + 7..])) {
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if name.is_empty() || name == "super" {
                continue; // `super::*` (a test module's) or further up
            }
            match level.get(name.as_str()) {
                Some(&theirs) if theirs > mine => {}
                Some(_) => wrong.push(format!("{f}.rs imports {name}.rs, which is not below it")),
                None => wrong.push(format!("{f}.rs imports {name} from its parent module")),
            }
        }
    }
    assert!(wrong.is_empty(), "{provider}:\n{}", wrong.join("\n"));
}

#[test]
fn soft_files_import_only_files_below_them() {
    check("soft");
}

#[test]
fn verbs_files_import_only_files_below_them() {
    check("verbs");
}
