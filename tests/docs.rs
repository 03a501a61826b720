//! The user documentation says what the code does, and its links lead somewhere.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md, DESIGN.md, CHANGELOG.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut v: Vec<PathBuf> = ["README.md", "DESIGN.md", "CHANGELOG.md"].iter().map(|p| root.join(p)).collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a page outside its fenced code blocks.
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors a page offers: its headings' (outside code blocks) and explicit `<a id>`s.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose_lines(text) {
        if let Some(h) = line.strip_prefix('#') {
            let h = h.trim_start_matches('#');
            out.insert(slug(&h.replace('`', "")));
        }
        let mut rest = line;
        while let Some(i) = rest.find("<a id=\"") {
            let tail = &rest[i + 7..];
            let end = tail.find('"').expect("a closed id");
            out.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out
}

/// The `](target)` links of a page, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let tail = &rest[i + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if !anchor.is_empty() {
                let t = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&t).contains(anchor) {
                    broken.push(format!("{}: {link}: no heading #{anchor} in {}", page.display(), target.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 20, "only {checked} relative links found: is the scan working?");
}

#[test]
fn a_broken_link_is_caught() {
    let text = "# Top\n\nSee [here](#top) and [there](#nowhere).\n";
    let a = anchors(text);
    assert!(a.contains("top") && !a.contains("nowhere"));
    assert_eq!(links(text), vec!["#top".to_string(), "#nowhere".to_string()]);
    assert_eq!(slug("The five variables most users touch"), "the-five-variables-most-users-touch");
    assert_eq!(slug("`MPIB_SPLIT`: the split"), "mpib_split-the-split");
}

#[test]
fn the_configuration_page_holds_the_table_as_generated() {
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/configuration.md")).unwrap();
    let table = mpib::config::markdown_table();
    assert!(
        page.contains(&table),
        "docs/configuration.md's table differs from config::VARS: regenerate it with `cargo run --example config_table`"
    );
    for name in mpib::config::known_names() {
        let row = table.lines().find(|l| l.contains(&format!("`{name}`"))).expect("a row per name");
        assert!(row.starts_with("| `MPIB_"), "{name}: {row}");
    }
}

#[test]
fn the_user_pages_carry_no_development_history() {
    for page in pages().iter().filter(|p| !p.ends_with("CHANGELOG.md") && !p.ends_with("benchmarks.md")) {
        let text = std::fs::read_to_string(page).unwrap();
        for (n, line) in text.lines().enumerate() {
            let l = line.to_lowercase();
            let issue = l.match_indices("issue ").any(|(i, _)| l[i + 6..].starts_with(|c: char| c.is_ascii_digit()));
            assert!(!issue, "{}:{}: an issue number: {line}", page.display(), n + 1);
            assert!(!l.contains("this session"), "{}:{}: a session diary: {line}", page.display(), n + 1);
        }
    }
}
