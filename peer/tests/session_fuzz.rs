//! The protocol fuzzed as conversations (`fuzz_session`), on seeded random
//! inputs: every answer decodes and the service keeps answering. The
//! long run is `cargo fuzz run peer_session` (README).
#![cfg(feature = "fuzzing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[test]
fn seeded_conversations_get_answers_and_the_service_stays_up() {
    let mut s = strata_peer::fuzz_session::Session::start();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..300 {
        let len = 16 + (round * 37) % 400;
        let input: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        s.run(&input);
    }
}
