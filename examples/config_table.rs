//! Prints README's configuration table from `mpib::config::VARS`:
//! `cargo run --example config_table` (tests/docs.rs checks README holds exactly this).
fn main() {
    print!("{}", mpib::config::markdown_table());
}
