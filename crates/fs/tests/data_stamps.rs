//! The times a write stamps (`clock::data_stamp`, Linux's multigrain rule): a write
//! nobody has looked at the times of may keep them within the clock's tick, but never
//! shows a time earlier than one already handed out, to this file or another: ordering
//! between files (`make`, `find -newer`), `mtime` against the `atime` a read just set
//! (`relatime`, "new mail"), and `ctime` against a `setxattr` in the same tick.
mod common;

use std::ffi::OsStr;

use common::*;
use stripefs::{CreateParams, Fs, Ino, XattrMode};

const ROUNDS: u64 = 200;

fn fs() -> Fs {
    fresh(&sims(2, 16 << 20), 4096, 16384)
}

fn file(fs: &Fs, name: &str) -> Ino {
    fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .unwrap()
        .ino
}

/// `b` written after `a` was stamped never shows an earlier time than `a`.
#[test]
fn a_file_written_later_is_not_older() {
    let fs = fs();
    let (a, b) = (file(&fs, "a"), file(&fs, "b"));
    for i in 0..ROUNDS {
        fs.write_at(b, 0, &[1; 512]).unwrap(); // b's stamp, not read afterwards
        fs.getattr(a).unwrap(); // a's times seen: its next write takes the fine clock
        fs.write_at(a, 0, &[2; 512]).unwrap();
        fs.write_at(b, 512, &[3; 512]).unwrap();
        let (ta, tb) = (fs.getattr(a).unwrap().mtime, fs.getattr(b).unwrap().mtime);
        assert!(
            tb >= ta,
            "round {i}: b written after a shows {tb:?} < {ta:?}"
        );
    }
    fs.unmount().unwrap();
}

/// A write after a read that set `atime` shows an `mtime` not before that `atime`, so
/// `relatime` updates the next read's and `mtime > atime` checks see the write.
#[test]
fn a_write_after_a_read_is_not_older_than_the_read() {
    let fs = fs();
    let f = file(&fs, "f");
    let mut buf = [0u8; 512];
    for i in 0..ROUNDS {
        fs.write_at(f, 0, &[4; 512]).unwrap();
        fs.read_at(f, 0, &mut buf).unwrap();
        fs.write_at(f, 512 * (i + 1), &[5; 512]).unwrap();
        let a = fs.getattr(f).unwrap();
        assert!(
            a.mtime >= a.atime,
            "round {i}: mtime {:?} < atime {:?}",
            a.mtime,
            a.atime
        );
    }
    fs.unmount().unwrap();
}

/// A write after a `setxattr` in the same tick does not take a `ctime` below the
/// `setxattr`'s, nor below a file created between them.
#[test]
fn a_write_after_an_xattr_change_is_not_older() {
    let fs = fs();
    let f = file(&fs, "f");
    for i in 0..ROUNDS {
        fs.write_at(f, 0, &[6; 512]).unwrap();
        fs.setxattr(f, OsStr::new("user.k"), &i.to_le_bytes(), XattrMode::Any)
            .unwrap();
        let c = file(&fs, &format!("c{i}"));
        fs.write_at(f, 512, &[7; 512]).unwrap();
        let (tf, tc) = (fs.getattr(f).unwrap().ctime, fs.getattr(c).unwrap().ctime);
        assert!(
            tf >= tc,
            "round {i}: f written after c was made shows {tf:?} < {tc:?}"
        );
    }
    fs.unmount().unwrap();
}
