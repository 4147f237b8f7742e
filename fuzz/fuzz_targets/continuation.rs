#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mayfly_server::fuzz_entry::continuation(data));
