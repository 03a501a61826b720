//! The one-line text form of workloads and reports: `key=value` fields separated by
//! spaces, values percent-escaped (`%`, space, `=`, control bytes). Readable in logs,
//! easy to compare (two ranks check that their workloads are equal as text).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::str::FromStr;

use super::{Error, Result};

/// Fields in insertion order, for writing.
#[derive(Default, Debug)]
pub struct Writer(String);

impl Writer {
    pub fn new() -> Self {
        Writer(String::new())
    }

    /// Appends `key=value`.
    pub fn put(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Self {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        self.0.push_str(key);
        self.0.push('=');
        for b in value.to_string().bytes() {
            if b == b'%' || b == b' ' || b == b'=' || b < 0x20 || b == 0x7f {
                let _ = write!(self.0, "%{b:02x}");
            } else {
                self.0.push(b as char);
            }
        }
        self
    }

    pub fn finish(self) -> String {
        self.0
    }
}

/// Parsed fields; every lookup names the key in its error.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields(pub BTreeMap<String, String>);

impl Fields {
    pub fn parse(line: &str) -> Result<Fields> {
        let mut m = BTreeMap::new();
        for tok in line.split_ascii_whitespace() {
            let (k, v) = tok.split_once('=').ok_or_else(|| Error::usage(format!("{tok:?} is not key=value")))?;
            m.insert(k.to_string(), unescape(v)?);
        }
        Ok(Fields(m))
    }

    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.0.get(key).map(String::as_str).ok_or_else(|| Error::usage(format!("missing field {key}")))
    }

    pub fn get<T: FromStr>(&self, key: &str) -> Result<T> {
        let s = self.str(key)?;
        s.parse().map_err(|_| Error::usage(format!("field {key}={s:?} is not valid")))
    }

    pub fn get_or<T: FromStr>(&self, key: &str, default: T) -> Result<T> {
        if self.has(key) { self.get(key) } else { Ok(default) }
    }

    /// Keys not in `known` (an entry ending in `*` matches every key with that prefix).
    pub fn unknown(&self, known: &[&str]) -> Vec<String> {
        let is_known = |k: &str| known.iter().any(|n| n.strip_suffix('*').map_or(k == *n, |pre| k.starts_with(pre)));
        self.0.keys().filter(|k| !is_known(k)).cloned().collect()
    }
}

fn unescape(v: &str) -> Result<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v.get(i + 1..i + 3).ok_or_else(|| Error::usage(format!("bad escape in {v:?}")))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| Error::usage(format!("bad escape in {v:?}")))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::usage(format!("{v:?} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_awkward_values() {
        let mut w = Writer::new();
        w.put("a", 12).put("msg", "isend: 50% = bad\nline").put("empty", "");
        let line = w.finish();
        assert!(!line.contains('\n'));
        let f = Fields::parse(&line).unwrap();
        assert_eq!(f.get::<u32>("a").unwrap(), 12);
        assert_eq!(f.str("msg").unwrap(), "isend: 50% = bad\nline");
        assert_eq!(f.str("empty").unwrap(), "");
        assert!(f.get::<u32>("msg").is_err() && f.str("nope").is_err());
        assert_eq!(f.unknown(&["a", "m"]), vec!["empty".to_string(), "msg".to_string()]);
        assert_eq!(f.unknown(&["a", "m*", "e"]), vec!["empty".to_string()]);
        assert!(Fields::parse("novalue").is_err() && Fields::parse("k=%zz").is_err());
    }
}
