//! Arbitrary bytes as a recording, through everything `trainbpf report`
//! does: reader, decoder, model, every renderer. See docs/fuzzing.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    trainbpf_report::fuzzing::check(data);
});
