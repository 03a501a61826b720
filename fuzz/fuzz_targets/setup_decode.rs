//! Fuzzes the set-up channel's decoder (what anyone connecting to a listen handle's port can
//! send): any byte stream is split into length-prefixed messages or refused, every message
//! decodes to a set-up message or an error, never a panic or an allocation the peer sized,
//! and what decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mpib::plugin::setup_msg::{Frames, MAX_MSG, Msg, decode, ready, refusal};

fuzz_target!(|data: &[u8]| {
    // The first byte picks how the stream arrives: in reads of 1 to 256 bytes.
    let Some((&step, stream)) = data.split_first() else { return };
    let step = step as usize + 1;
    let mut frames = Frames::default();
    for chunk in stream.chunks(step) {
        frames.push(chunk);
        loop {
            match frames.next_msg() {
                Ok(Some(m)) => {
                    assert!(m.len() <= MAX_MSG);
                    check(&m);
                }
                Ok(None) => break,
                Err(_) => return, // the channel is dropped
            }
        }
        // What is buffered: at most one message in progress and the read beyond it.
        assert!(frames.buffered() <= 4 + MAX_MSG + step);
    }
    check(stream);
});

fn check(m: &[u8]) {
    if let Ok(msg) = decode(m) {
        let again = match &msg {
            Msg::Hello(h) => h.encode(),
            Msg::Reply(r) => r.encode(),
            Msg::Ready => ready(),
            // Non-printable bytes of a refusal become '?'; its length is kept.
            Msg::Refusal(t) => {
                assert_eq!(refusal(t).len(), m.len());
                return;
            }
        };
        assert_eq!(again, m);
    }
}
