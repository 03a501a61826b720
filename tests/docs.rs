//! README documents what the code does.

#[test]
fn readme_documents_every_variable_with_its_default() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for v in mpib::config::VARS {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", v.name)))
            .unwrap_or_else(|| panic!("README's configuration table has no row for {}", v.name));
        assert!(row.contains(v.default), "README row for {} does not show the default {:?}: {row}", v.name, v.default);
        assert!(row.contains(v.accepted), "README row for {} does not show what is accepted: {row}", v.name);
    }
}
