//! Measures what `record --max-size` keeps of a long run: replays a
//! full-resolution recording (e.g. `gen_recording`'s day of a 50-process
//! job) through the recorder's own writer and compaction, frame by frame
//! in recorded time, as `record` would have written it, and prints the
//! file's size hour by hour and at the end.
//!
//! ```sh
//! cargo run --release -p trainbpf --example gen_recording -- --hours 24 --procs 50 -o day50.rec
//! cargo run --release -p trainbpf --example flight_budget -- day50.rec --max-size 1G --full-span 1h -o kept.rec
//! ```
//!
//! Compactions run as in `record` (in a thread, swapped in by rename); the
//! replay waits for each before going on, since it feeds records far
//! faster than a job makes them.

use std::{fs::File, io::BufReader, path::PathBuf, process::ExitCode, time::Instant};

use trainbpf::{
    record::compact::{Flight, FlightOptions},
    util::{
        safe_file::Owner,
        values::{parse_duration, parse_size},
    },
};
use trainbpf_report::recording::{Reader, Writer};

const SEC: u64 = 1_000_000_000;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut input = None;
    let mut max_size = 1u64 << 30;
    let mut full_span = 3600 * SEC;
    let mut out = PathBuf::from("kept.rec");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--max-size" => max_size = parse_size(&args.next().unwrap_or_default()).unwrap(),
            "--full-span" => {
                full_span = parse_duration(&args.next().unwrap_or_default())
                    .unwrap()
                    .as_nanos() as u64
            }
            "-o" => out = PathBuf::from(args.next().unwrap_or_default()),
            p => input = Some(PathBuf::from(p)),
        }
    }
    let Some(input) = input else {
        eprintln!("usage: flight_budget REC [--max-size SIZE] [--full-span DUR] [-o OUT]");
        return ExitCode::from(2);
    };
    let mut r = Reader::new(BufReader::new(File::open(&input).unwrap())).unwrap();
    let header = r.header().clone();
    let page_kb = (header.page_size / 1024).max(1);
    let created = trainbpf::util::safe_file::create_recording(&out, Owner::current()).unwrap();
    let mut w = Writer::new(created.file, &header).unwrap();
    let mut flight = Flight::new(
        created.place,
        FlightOptions {
            max_size,
            full_span_ns: full_span,
        },
    );
    let started = Instant::now();
    let mut compacting = std::time::Duration::ZERO;
    let (mut first, mut second) = (None::<u64>, 0u64);
    let mut next_hour = 0u64;
    let mut records = 0u64;
    let mut said = Vec::new();
    println!("| hour | file | records so far |");
    println!("|---|---|---|");
    while let Some((kind, bytes)) = r.next_raw() {
        let ts = trainbpf_report::decode::decode(kind, bytes, page_kb)
            .map(|t| t.ts_ns)
            .unwrap_or(second * SEC);
        let t0 = *first.get_or_insert(ts);
        // A frame a second, as the collector flushes.
        let sec = ts.saturating_sub(t0) / SEC;
        if sec > second {
            w.flush().unwrap();
            said.extend(flight.poll(&mut w, t0 + sec * SEC));
            if flight.running() {
                let t = Instant::now();
                said.extend(flight.wait(&mut w));
                compacting += t.elapsed();
            }
            second = sec;
            if sec >= next_hour * 3600 {
                println!(
                    "| {next_hour} | {:.1} MiB | {records} |",
                    w.bytes_written() as f64 / (1 << 20) as f64
                );
                next_hour += 1;
            }
        }
        w.record(kind, bytes);
        records += 1;
    }
    w.flush_now().unwrap();
    said.extend(flight.finish(&mut w, first.unwrap_or(0) + (second + 1) * SEC));
    let size = std::fs::metadata(&out).unwrap().len();
    println!(
        "\n{:.1} h replayed: {records} records; the file ends at {size} bytes ({:.1} MiB) under --max-size {max_size}; {} compactions, {:.1} s compacting, {:.1} s in all",
        second as f64 / 3600.0,
        size as f64 / (1 << 20) as f64,
        said.iter()
            .filter(|l| l.starts_with("recording compacted"))
            .count(),
        compacting.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for l in said.iter().rev().take(2) {
        println!("last: {l}");
    }
    ExitCode::SUCCESS
}
