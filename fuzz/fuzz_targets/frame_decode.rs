//! Fuzzes the soft fabric's frame decoder: any bytes from the wire decode to frames or are
//! rejected, never a panic, and an accepted header is exactly what `encode` writes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mpib::fabric::soft::frame::{HDR_LEN, decode, decode_stream, encode};

fuzz_target!(|data: &[u8]| {
    let mut frames = Vec::new();
    let _ = decode_stream(data, &mut frames);
    assert!(frames.len() <= data.len() / HDR_LEN);
    if let Some(h) = data.first_chunk::<HDR_LEN>() {
        if let Ok(f) = decode(h) {
            assert_eq!(&encode(&f), h);
        }
    }
});
