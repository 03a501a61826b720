//! README documents what the code does.

#[test]
fn readme_holds_the_configuration_table_as_generated() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table = mpib::config::markdown_table();
    assert!(
        readme.contains(&table),
        "README's configuration table differs from config::VARS: regenerate it with `cargo run --example config_table`"
    );
    for name in mpib::config::known_names() {
        let row = table.lines().find(|l| l.contains(&format!("`{name}`"))).expect("a row per name");
        assert!(row.starts_with("| `MPIB_"), "{name}: {row}");
    }
}
