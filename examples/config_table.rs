//! Prints README's configuration table from `mpib::config::VARS`:
//! `cargo run --example config_table`.
fn main() {
    println!("| Variable | Default | Accepted | Meaning |");
    println!("|---|---|---|---|");
    for v in mpib::config::VARS {
        println!("| `{}` | {} | {} | {} |", v.name, v.default, v.accepted, v.meaning);
    }
}
