//! The peer protocol as conversations: sequences of raw and well-formed
//! requests against a real service on loopback (`fuzz_session`). Every
//! answer must decode, the service must keep answering, and no task of it
//! may panic.
#![no_main]

use std::sync::Mutex;

static SESSION: Mutex<Option<strata_peer::fuzz_session::Session>> = Mutex::new(None);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut guard = SESSION.lock().unwrap_or_else(|p| p.into_inner());
    let s = guard.get_or_insert_with(strata_peer::fuzz_session::Session::start);
    s.run(data);
});
