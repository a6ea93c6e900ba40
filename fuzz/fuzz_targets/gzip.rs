//! gzip request bodies (`Content-Encoding: gzip` on OTLP/HTTP), through the receiver's capped
//! inflater; what inflates is then ingested as protobuf.
//!
//! Checked: nothing panics; output never exceeds the limit (a bomb is cut off at the limit,
//! not inflated), and the rss limit holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotlight_sidecar::base::error::IngestError;
use slotlight_sidecar::receiver::http::gunzip_capped;

fuzz_target!(|data: &[u8]| {
    // The first two bytes pick a limit (up to 64 KiB) so the cap is hit often.
    let (limit, body) = match data {
        [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
        _ => return,
    };
    match gunzip_capped(body, limit) {
        Ok(out) => {
            assert!(
                out.len() <= limit,
                "inflated {} bytes past the limit of {limit}",
                out.len()
            );
            slotlight_fuzz::sidecar::ingest(&out);
        }
        Err(IngestError::TooLarge { limit: l }) => assert_eq!(l, limit),
        Err(IngestError::Malformed(_)) => {}
        Err(e) => panic!("unexpected error kind: {e}"),
    }
});
