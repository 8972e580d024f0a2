//! Unit tests of the safe files, as whoever runs them.

use std::os::unix::fs::MetadataExt as _;

use super::*;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("trainbpf-safe-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn an_earlier_recording_moves_aside_and_a_link_is_refused() {
    let d = tmpdir("aside");
    let rec = d.join("r.rec");
    std::fs::write(&rec, b"earlier").unwrap();
    let c = create_recording(&rec, Owner::current()).unwrap();
    assert_eq!(c.moved_aside, Some(d.join("r.rec.old")));
    assert_eq!(std::fs::read(d.join("r.rec.old")).unwrap(), b"earlier");
    assert_eq!(std::fs::metadata(&rec).unwrap().len(), 0);
    assert_eq!(std::fs::metadata(&rec).unwrap().mode() & 0o777, 0o600);
    // Locked while it is written: a second one refuses.
    let second = create_recording(&rec, Owner::current());
    assert!(matches!(second, Err(FileError::Busy { .. })), "{second:?}");
    drop(c);

    let target = d.join("target");
    std::fs::write(&target, b"keep").unwrap();
    let link = d.join("l.rec");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = create_recording(&link, Owner::current()).err().unwrap();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    // Nothing is left behind by a refusal.
    let names: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn report_outputs_replace_files_write_through_fifos_and_refuse_links() {
    let d = tmpdir("outputs");
    let out = d.join("o.html");
    std::fs::write(&out, b"old").unwrap();
    write_output(&out, b"new", Owner::current()).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), b"new");

    let target = d.join("target");
    std::fs::write(&target, b"keep").unwrap();
    std::os::unix::fs::symlink(&target, d.join("l.html")).unwrap();
    assert!(write_output(&d.join("l.html"), b"x", Owner::current()).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");

    let fifo = d.join("f");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    write_output(&fifo, b"through", Owner::current()).unwrap();
    assert_eq!(reader.join().unwrap(), b"through");
    let st = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn read_at_leaves_the_writers_offset_alone() {
    use std::io::{Seek, Write};
    let d = tmpdir("readat");
    let mut f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(d.join("f"))
        .unwrap();
    f.write_all(b"hello world").unwrap();
    let mut s = String::new();
    ReadAt::new(&f, 6).read_to_string(&mut s).unwrap();
    assert_eq!(s, "world");
    assert_eq!(f.stream_position().unwrap(), 11);
    std::fs::remove_dir_all(&d).unwrap();
}
