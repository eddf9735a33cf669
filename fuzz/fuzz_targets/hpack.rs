#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crr_proxy::fuzzing::hpack(data));
